"""What a failure costs a domain's record besides health and pace: its counts, and the hold it earns.

Whose trouble a failure is comes from :mod:`.verdicts`; the rate cut from :mod:`.pacing`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy_openclaw.health.registry.limitfit import note_kind
from scrapy_openclaw.health.registry.pacing import rate_of
from scrapy_openclaw.health.registry.tuning import _FIT_FULL_HOLD

if TYPE_CHECKING:
    from scrapy_openclaw.errors import Classification
    from scrapy_openclaw.health.registry.record import _Domain
    from scrapy_openclaw.policy import HealthPolicy


def count_failure(d: _Domain, classification: Classification, retry_after: float | None, now: float) -> str:
    """Every failure counts, whatever the verdict; an answer (a status) is news from the site.
    What the failure adds to the limit fit's history (:func:`.limitfit.note_kind`)."""
    d.requests += 1
    d.failures += 1
    if classification.status is not None:
        d.answered_at = now
    return note_kind(classification.status, retry_after)


def hold_after_failure(
    d: _Domain,
    p: HealthPolicy,
    classification: Classification,
    retry_after: float | None,
    now: float,
    *,
    closed: bool,
) -> None:
    """The server's Retry-After holds the domain (capped); a throttle without one, one token's time."""
    if retry_after is not None:
        d.hold_until = max(d.hold_until, now + min(max(retry_after, 0.0), p.retry_after_cap))
        d.retry_after_holds += 1
    elif classification.is_throttle and closed:
        d.hold_until = max(d.hold_until, now + 1.0 / rate_of(d, p))


def refilled_at(p: HealthPolicy, now: float, retry_after: float | None) -> float | None:
    """When the hold a Retry-After brings ends, if it is long enough to refill the site's bucket
    (``_FIT_FULL_HOLD``): the limit fit knows the bucket full there (None: no such hold)."""
    if retry_after is None:
        return None
    hold = min(max(retry_after, 0.0), p.retry_after_cap)
    return now + hold if hold >= _FIT_FULL_HOLD else None
