"""The ``request.meta`` keys scrapy-openclaw reads and writes, in one place.

All values are JSON-safe so that a request can be checkpointed, sent through
Redis or stored as a dead letter as plain data.
"""

#: Absolute UNIX time (float) by which the request should be fetched. Public.
DEADLINE = "openclaw_deadline"

#: Absolute UNIX time (float) before which the request must not be sent. Set by
#: the retry middleware (backoff) and the health middleware (Retry-After hold).
NOT_BEFORE = "openclaw_not_before"

#: A label choosing a default deadline from the policy's ``deadline.classes``.
REQUEST_CLASS = "openclaw_request_class"

#: Retry bookkeeping: ``{"attempts": {"network": 1, ...}, "first": ts, "last": ts}``.
RETRY_STATE = "openclaw_retry"

#: Set on a request re-injected by ``scrapy openclaw-dlq replay``: the dead letter's id.
REPLAY_OF = "openclaw_replay_of"

#: Distributed mode: the id of the Redis queue entry a request was leased as.
LEASE = "openclaw_lease"

#: The health middleware's verdict on a failure, written before the retry
#: middleware sees it: "page" (this URL's trouble, its domain is healthy) or
#: "domain". The retry middleware gives "page" failures the short page schedule.
FAILURE_SCOPE = "openclaw_failure_scope"
