"""The policy dataclasses, one per component (health, retry, deadline): every knob, its default and its range.

Their defaults are the built-in policy; :mod:`.validation` reads the type
hints and ``range`` metadata here to check a user's layers, so each field's
annotation is its schema.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

JitterMode = Literal["full", "equal", "decorrelated", "none"]
ExpiredMode = Literal["boost", "drop"]


# Field metadata: the allowed closed range of a number.
def _range(lo: float | None = None, hi: float | None = None) -> dict[str, Any]:
    return {"range": (lo, hi)}


@dataclass(frozen=True)
class HealthPolicy:
    """How a domain's score moves and how the score and its signals drive its pace.

    Out of the box nothing caps a healthy domain but concurrency, as in plain
    Scrapy; ``base_rate`` and ``base_concurrency`` are opt-in ceilings.
    """

    success_reward: float = field(default=1.0, metadata=_range(0, 100))  # health points a success adds
    throttle_penalty: float = field(default=20.0, metadata=_range(0, 100))  # points a domain 429/503 costs
    timeout_penalty: float = field(default=10.0, metadata=_range(0, 100))  # points a timeout costs
    connection_penalty: float = field(default=10.0, metadata=_range(0, 100))  # a refused or failed connection
    server_error_penalty: float = field(default=5.0, metadata=_range(0, 100))  # another domain 5xx
    recovery_per_minute: float = field(default=10.0, metadata=_range(0, 100))  # points regained while quiet
    # concurrency ceiling per domain; None: the slot's own (CONCURRENT_REQUESTS_PER_DOMAIN,
    # _PER_IP, DOWNLOAD_SLOTS), scaled by health either way
    base_concurrency: int | None = field(default=None, metadata=_range(1, 1000))
    # req/s ceiling per domain; None: no fixed ceiling (the site's own signals set the pace)
    base_rate: float | None = field(default=None, metadata=_range(0.01, 100000))
    # where slow start begins (req/s); it grows by half with every success until a congestion signal
    initial_rate: float = field(default=10.0, metadata=_range(0.01, 100000))
    min_rate: float = field(default=0.2, metadata=_range(0.001, 10000))  # req/s no cut goes below
    # token bucket size, never more than a quarter second's worth at the current rate
    burst: int = field(default=5, metadata=_range(1, 10000))
    # after a slowdown, how fast the rate probes past the learned limit: the cubic's
    # constant, as a share of that limit per second cubed (CUBIC's C, scale-free)
    rate_probe: float = field(default=0.0001, metadata=_range(0.00001, 10))
    rate_decrease: float = field(default=0.9, metadata=_range(0.01, 0.99))  # multiplier on congestion
    # latency above this multiple of the best seen is a congestion signal (from the 21st success)
    latency_factor: float = field(default=3.0, metadata=_range(1.0, 100))
    circuit_floor: float = field(default=20.0, metadata=_range(0, 100))  # health below which the circuit opens
    # domain failures in a row that open the circuit: few, because opening is cheap (a
    # short first cool-down) and at low concurrency every failure in the run
    # is a separate congestion event that costs health
    circuit_failures: int = field(default=3, metadata=_range(1, 100000))
    # first cool-down, seconds: short, because most outages a crawler meets are
    # seconds long (a 503 window is not a ban); doubled per opening in a row ...
    circuit_cooldown: float = field(default=1.0, metadata=_range(0.1, 86400))
    # ... up to this (a domain that stays down is still probed once a minute)
    circuit_cooldown_max: float = field(default=60.0, metadata=_range(0.1, 86400))
    # +- this share of random spread on each cool-down (Nutch uses 10%)
    circuit_jitter: float = field(default=0.1, metadata=_range(0, 0.5))
    # seconds a circuit may stay open (no probe getting through) before the domain is given
    # up: its requests become dead letters (replayable) so the crawl can end; None: never
    give_up_after: float | None = field(default=600.0, metadata=_range(1, None))
    # the same for a domain that has never answered (DNS errors, refused connections):
    # such a host is most likely dead, so it is given up within seconds; None: give_up_after
    unreachable_give_up: float | None = field(default=5.0, metadata=_range(0, None))
    retry_after_cap: float = field(default=600.0, metadata=_range(0, 86400))  # longest Retry-After hold, seconds
    # pace the domain just under the limit its answers declare (RateLimit, RateLimit-Policy,
    # X-RateLimit-* headers), and hold it while they say its quota is used up
    ratelimit_headers: bool = True
    # a ban or challenge page (error class "blocked"): its health penalty and how long it
    # holds the domain (a Retry-After on it wins when longer); a congestion signal too
    blocked_penalty: float = field(default=30.0, metadata=_range(0, 100))
    blocked_hold: float = field(default=30.0, metadata=_range(0, 86400))  # seconds a ban page holds the domain
    # text (case-insensitive) whose presence in an answer of any status, 200 included,
    # makes it a ban page for this domain: a captcha form's id, a login wall's heading
    ban_markers: tuple[str, ...] = ()
    # look for the built-in challenge markers (errors.BAN_MARKERS) on 403/429/503 answers
    ban_builtin_markers: bool = True


@dataclass(frozen=True)
class RetryClassPolicy:
    """Backoff for one error class: attempt n waits about base_delay·2ⁿ, capped."""

    max_attempts: int = field(default=6, metadata=_range(1, 1000))  # incl. the first
    base_delay: float = field(default=1.0, metadata=_range(0, 86400))  # seconds, doubled per attempt
    max_delay: float = field(default=60.0, metadata=_range(0, 86400))  # cap on one wait, seconds
    jitter: JitterMode = "full"  # random spread of each wait (none: the exact step)


@dataclass(frozen=True)
class RetryPolicy:
    # refused, reset or timed-out connections, DNS errors, RETRY_EXCEPTIONS
    network: RetryClassPolicy = RetryClassPolicy()
    # "equal" jitter: every wait is at least half its step (0.5, 1, 2, 4, 8 s), so
    # the 4th attempt comes >= 3.5 s after the 1st and a 503 window of a few
    # seconds is always outlived; "full" may retry at once, into the same window
    protocol_retryable: RetryClassPolicy = RetryClassPolicy(jitter="equal")
    # a callback raised one of OPENCLAW_PARSE_EXCEPTIONS: the page is fetched again
    parse: RetryClassPolicy = RetryClassPolicy(max_attempts=3, base_delay=0.5, max_delay=10.0)
    # a network or protocol_retryable failure the health middleware judged the page's
    # own (meta["openclaw_failure_scope"] == "page": its domain is healthy) is retried
    # on this short schedule (0.25-0.5, 0.5-1, then 1-2 s), then dead-lettered; the
    # congestion schedules above are for domain trouble. As many attempts as they
    # have: the first failures of a 503 window still look like a page's own, and a
    # URL unlucky enough to meet several windows must not be given up early.
    page: RetryClassPolicy = RetryClassPolicy(max_attempts=6, base_delay=0.5, max_delay=2.0, jitter="equal")
    # a ban page: retried after the domain's hold (health.blocked_hold) at the earliest, a few
    # times, then a dead letter of class "blocked" (never handed to the callback)
    blocked: RetryClassPolicy = RetryClassPolicy(max_attempts=3, base_delay=5.0, max_delay=300.0, jitter="equal")
    # retries may be at most this share of the domain's recent requests ...
    # (higher than Finagle's 20%: our retries are spread out by backoff, not
    # immediate, so a flapping site needs more of them to be ridden out)
    budget_ratio: float = field(default=0.5, metadata=_range(0, 1))
    # ... but this many retries per window are always allowed (1/s by default)
    budget_min_retries: int = field(default=60, metadata=_range(0, 1000000))
    budget_window: float = field(default=60.0, metadata=_range(1, 86400))  # seconds the budget looks back


@dataclass(frozen=True)
class DeadlinePolicy:
    default: float | None = field(default=None, metadata=_range(0, None))  # seconds from first scheduling
    expired: ExpiredMode = "boost"  # a passed deadline: to the front of the queue, or dropped as a dead letter
    aging_window: float = field(
        default=300.0, metadata=_range(0.001, None)
    )  # aging starts this long before the deadline
    # default deadline (seconds) by request class, meta["openclaw_request_class"]
    classes: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class DomainPolicy:
    health: HealthPolicy = HealthPolicy()
    retry: RetryPolicy = RetryPolicy()
    deadline: DeadlinePolicy = DeadlinePolicy()
