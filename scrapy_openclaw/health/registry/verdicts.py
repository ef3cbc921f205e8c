"""Whose trouble a failure is (the domain's or the page's), and what a domain failure costs.

Pure functions of a domain record and a classification: the registry's
``judge`` and ``record_failure`` decide with them, and the Lua port mirrors them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy_openclaw.errors import ErrorClass
from scrapy_openclaw.health.registry.tuning import _SHARE_FAST, _SHARE_MARGIN, _SHARE_SLOW, _SHARE_TRIGGER, DOMAIN, PAGE

if TYPE_CHECKING:
    from scrapy_openclaw.errors import Classification
    from scrapy_openclaw.health.registry.record import _Domain
    from scrapy_openclaw.policy import HealthPolicy


def affects_health(classification: Classification | None) -> bool:
    """Whether an outcome can say something about the domain's health.

    A 404 or 403 is the server answering normally about one page; only
    network failures, retryable statuses and 5xx may count against a domain
    (and :meth:`HealthRegistry.judge` decides whether they do).
    """
    if classification is None:
        return False
    if classification.error_class in (ErrorClass.NETWORK, ErrorClass.PROTOCOL_RETRYABLE, ErrorClass.BLOCKED):
        return True
    return (classification.status or 0) >= 500


def _verdict(
    d: _Domain, c: Classification | None, retry_after: float | None, failed_before: float | None
) -> tuple[str | None, bool]:
    """(whose trouble the failure is, whether it counts in the domain's 5xx share)."""
    if not affects_health(c):
        return None, False
    assert c is not None
    if _asks_to_slow_down(c, retry_after):
        if d.refusals_flat and _rate_signal(c, retry_after):
            return PAGE, False  # its refusals do not fall when the pace falls: no rate signal
        return DOMAIN, False  # the server itself asks us to slow down (a ban page: to stop)
    if failed_before is not None:  # a retry: whatever its domain went through since says it
        return (DOMAIN if d.troubled_at > failed_before else PAGE), False
    if c.status is None:
        return DOMAIN, False  # a connection failure or timeout
    fast = d.share_fast + _SHARE_FAST * (1.0 - d.share_fast)
    slow = d.share_slow + _SHARE_SLOW * (1.0 - d.share_slow)
    return (DOMAIN if _clustering(fast, slow) else PAGE), True


def _accounted(
    d: _Domain, c: Classification, retry_after: float | None, failed_before: float | None
) -> tuple[bool, bool]:
    """(whether the failure counts against the domain, whether it counts in the 5xx share).

    A retry judged the domain's only because its domain was in trouble since
    the URL last failed (see :func:`_verdict`) gets the domain's retry
    schedule, but it is no new evidence: counted, the retries of broken pages
    after one real domain signal would each renew the trouble and keep its
    circuit opening (a crawl whose last pending requests are broken pages
    stalled on doubling cool-downs).
    """
    verdict, in_share = _verdict(d, c, retry_after, failed_before)
    inferred = failed_before is not None and not _asks_to_slow_down(c, retry_after)
    return verdict == DOMAIN and not inferred, in_share


def _asks_to_slow_down(c: Classification, retry_after: float | None) -> bool:
    """A 429, a Retry-After or a ban page: the server's own word, whatever the URL's history."""
    return c.status == 429 or retry_after is not None or c.error_class == ErrorClass.BLOCKED


def _rate_signal(c: Classification, retry_after: float | None) -> bool:
    """A refusal that speaks of the pace: an answered 429, or an answer with a Retry-After
    (a 503 limiter), not a ban page. It says "slower", not "sick"."""
    if c.status is None or c.error_class == ErrorClass.BLOCKED:
        return False
    return c.status == 429 or retry_after is not None


def _clustering(fast: float, slow: float) -> bool:
    """Whether 5xx answers cluster: their recent share is high and clearly above the baseline."""
    return fast >= _SHARE_TRIGGER and fast - slow >= _SHARE_MARGIN


def _give_up_limit(d: _Domain, p: HealthPolicy) -> float | None:
    if not d.answered_at and p.unreachable_give_up is not None:
        return p.unreachable_give_up
    return p.give_up_after


def _penalty(c: Classification, p: HealthPolicy) -> tuple[float, bool]:
    """(health penalty, whether it is a congestion signal) for a domain failure."""
    if c.error_class == ErrorClass.BLOCKED:
        return p.blocked_penalty, True
    if c.is_throttle:
        return p.throttle_penalty, True
    if c.is_timeout:
        return p.timeout_penalty, True
    if c.error_class == ErrorClass.NETWORK:
        return p.connection_penalty, False
    return p.server_error_penalty, False
