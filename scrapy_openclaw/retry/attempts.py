"""Building a request's next attempt: its class's policy, backoff, budget and give-up.

:func:`get_classified_retry_request` is the work of
:class:`~scrapy_openclaw.retry.middleware.ClassifiedRetryMiddleware` and a
public helper a callback can use too, like Scrapy's ``get_retry_request``:
a delayed copy of the request (``meta["openclaw_not_before"]``), or None and
exactly one dead letter when the attempts or the domain's retry budget are
spent. The stats it keeps are ours and Scrapy's ``retry/*``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from twisted.python.failure import Failure

from scrapy_openclaw import deadletter
from scrapy_openclaw import meta as M
from scrapy_openclaw import signals as openclaw_signals
from scrapy_openclaw.errors import Classification, ErrorClass, ErrorTaxonomy
from scrapy_openclaw.policy import PolicySet
from scrapy_openclaw.retry.backoff import Uniform, for_policy
from scrapy_openclaw.retry.budget import RetryBudgets
from scrapy_openclaw.retry.compat import SCRAPY_STATS_PREFIX, ScrapyRetrySettings, log_level, scrapy_reason
from scrapy_openclaw.retry_after import parse_retry_after
from scrapy_openclaw.scrapy_internals import slot_key
from scrapy_openclaw.settings import OpenClawSettings, crawl_id

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from scrapy.statscollectors import StatsCollector

    from scrapy_openclaw.policy import RetryClassPolicy

# give-ups log under the middleware's name, as before this module was split out of it
logger = logging.getLogger("scrapy_openclaw.retry.middleware")

STATS_PREFIX = "openclaw/retry"
#: Upper bounds (seconds) of the cumulative delay histogram, ``delay_le/<bucket>``.
DELAY_BUCKETS: tuple[float, ...] = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 300, 3600)


def retry_enabled(crawler: Crawler) -> bool:
    return crawler.settings.getbool("RETRY_ENABLED") and OpenClawSettings.for_crawler(crawler).retry_enabled


def taxonomy_for(crawler: Crawler) -> ErrorTaxonomy:
    """The crawl's one error taxonomy (shared with the other components)."""
    return ErrorTaxonomy.for_crawler(crawler)


def _bucket_label(bound: float) -> str:
    return f"{bound:g}"


#: The classes a "page" verdict moves to the page schedule (parse failures have their own).
PAGE_SCOPED = frozenset({ErrorClass.NETWORK, ErrorClass.PROTOCOL_RETRYABLE})
PAGE = "page"


def on_page_schedule(request: Request, classification: Classification) -> bool:
    """Whether the health middleware judged this failure the page's own (its domain is healthy)."""
    return request.meta.get(M.FAILURE_SCOPE) == PAGE and classification.error_class in PAGE_SCOPED


def schedule_name(request: Request, classification: Classification) -> str:
    """The retry policy a failure is retried with: ``page`` or its class's."""
    return PAGE if on_page_schedule(request, classification) else classification.error_class.value


def retry_cap(crawler: Crawler, request: Request, classification: Classification) -> int | None:
    """Retries the request may have in all (every class), or None: the policy's ``max_attempts``.

    ``meta["max_retry_times"]``, else a project's ``RETRY_TIMES``, unless the
    domain's policy names ``max_attempts`` for the schedule in use (which wins).
    """
    cap = request.meta.get("max_retry_times")
    if cap is not None:
        return int(cap)
    retry_times = ScrapyRetrySettings.for_crawler(crawler).retry_times
    if retry_times is None:
        return None
    schedule = schedule_name(request, classification)
    if PolicySet.for_crawler(crawler).names(slot_key(crawler, request), "retry", schedule, "max_attempts"):
        return None
    return retry_times


def retries_left(
    request: Request, classification: Classification, policy: RetryClassPolicy, max_retry_times: int | None = None
) -> bool:
    """Whether one more failure of this class would still be retried (budget aside).

    ``max_retry_times`` (argument, else ``meta["max_retry_times"]``; see
    :func:`retry_cap`) caps the request's total retries (all classes) and
    replaces *policy*'s ``max_attempts``; otherwise attempts are counted per
    class against it.
    """
    if max_retry_times is None:
        max_retry_times = request.meta.get("max_retry_times")
    if max_retry_times is not None:
        return int(request.meta.get("retry_times", 0)) < int(max_retry_times)
    state = request.meta.get(M.RETRY_STATE) or {}
    done = int((state.get("attempts") or {}).get(classification.error_class.value, 0))
    return done + 1 < policy.max_attempts


def get_classified_retry_request(
    request: Request,
    *,
    classification: Classification,
    spider: Spider,
    response: Response | None = None,
    exception: BaseException | Failure | None = None,
    max_retry_times: int | None = None,
    priority_adjust: int | None = None,
    give_up_log_level: int | str | None = None,
    now: float | None = None,
    uniform: Uniform | None = None,
    use_budget: bool = True,
    dead_letter: bool = True,
    from_cache: bool | None = None,
    logger: logging.Logger = logger,
) -> Request | None:
    """A delayed copy of *request* to retry it, or None when giving up (then one dead letter,
    unless *dead_letter* is False; permanent classes: None, no dead letter, the caller decides).

    The copy waits in the scheduler (``meta["openclaw_not_before"]``), never in a
    middleware; its arguments, the wait and the stats it keeps: ``docs/retry.md`` ("From a callback").
    """
    crawler = spider.crawler
    now = time.time() if now is None else now
    if not classification.retryable:
        return None
    domain = slot_key(crawler, request)
    domain_policy = PolicySet.for_crawler(crawler).for_domain(domain)
    schedule = schedule_name(request, classification)
    policy: RetryClassPolicy | None = getattr(domain_policy.retry, schedule, None)
    if policy is None:  # pragma: no cover - every retryable class has a policy
        return None
    if max_retry_times is None:
        max_retry_times = retry_cap(crawler, request, classification)
    state = _next_state(request, response, now)
    cached = _answered_by_cache(response, from_cache)
    spent = _spent(crawler, request, classification, policy, max_retry_times, use_budget and not cached, domain, now)
    if spent is not None:
        _give_up(
            request,
            classification,
            spider=spider,
            response=response,
            exception=exception,
            level=give_up_log_level,
            logger=logger,
            letter=dead_letter,
            now=now,
            first=state["first"],
            **spent,
        )
        return None
    wait = _Wait(policy, domain_policy.health.retry_after_cap, uniform, domain, now)
    delay, due = wait.next_attempt(crawler, request, response, state, classification, cached=cached)
    attempt = state["attempts"][classification.error_class.value] + 1
    _count_retry(crawler.stats, classification, schedule, delay, response=response, exception=exception)
    _log_retry(logger, spider, request, classification, schedule, delay, attempt)
    return _retry_copy(request, state, due, priority_adjust, crawler)


def _log_retry(
    logger: logging.Logger,
    spider: Spider,
    request: Request,
    classification: Classification,
    schedule: str,
    delay: float,
    attempt: int,
) -> None:
    logger.debug(
        "Retrying %(request)s in %(delay).2fs (%(schedule)s attempt %(n)d): %(reason)s",
        {"request": request, "delay": delay, "schedule": schedule, "n": attempt, "reason": classification.reason},
        extra={"spider": spider},
    )


def _answered_by_cache(response: Response | None, from_cache: bool | None) -> bool:
    """Whether the HTTP cache answered (and will answer the retry again): such an answer says
    nothing about the site and asks it nothing, so, as Scrapy's RetryMiddleware does, it is
    retried at once, with no wait and outside the retry budget."""
    return (response is not None and "cached" in response.flags) if from_cache is None else from_cache


def _spent(
    crawler: Crawler,
    request: Request,
    classification: Classification,
    policy: RetryClassPolicy,
    max_retry_times: int | None,
    charge: bool,
    domain: str,
    now: float,
) -> dict[str, str] | None:
    """None while the request may be retried (the domain's retry budget charged when *charge*);
    else what the give-up says: attempts spent, or the budget (counted as such)."""
    stats = crawler.stats
    if not retries_left(request, classification, policy, max_retry_times):
        stats.inc_value(f"{STATS_PREFIX}/{classification.error_class.value}/max_reached")
        return {}
    if charge and not RetryBudgets.for_crawler(crawler).try_spend(domain, now):
        stats.inc_value(f"{STATS_PREFIX}/budget_exhausted")
        return {"why": f"the retry budget of {domain} is spent", "error_class": "retry_budget"}
    return None


@dataclass(frozen=True)
class _Wait:
    """How long a retry of one domain's request waits: its class's backoff, a Retry-After (capped) instead."""

    policy: RetryClassPolicy
    retry_after_cap: float
    uniform: Uniform | None
    domain: str
    now: float

    def next_attempt(
        self,
        crawler: Crawler,
        request: Request,
        response: Response | None,
        state: dict[str, Any],
        classification: Classification,
        *,
        cached: bool,
    ) -> tuple[float, float]:
        """Count the attempt in *state*; its delay and due time (never before the domain reopens)."""
        klass = classification.error_class.value
        done = int(state["attempts"].get(klass, 0))
        state["attempts"][klass] = done + 1
        if cached:
            crawler.stats.inc_value(f"{STATS_PREFIX}/cached")
            return 0.0, self.now
        delay = for_policy(self.policy, uniform=self.uniform)(done, state.get("delay"))
        retry_after = _retry_after(response, self.retry_after_cap, self.now, self.domain)
        if retry_after is not None:
            delay = retry_after
            crawler.stats.inc_value(f"{STATS_PREFIX}/retry_after_used")
        state["delay"] = delay
        return delay, max(self.now + delay, _domain_reopens(crawler, request))


def _retry_after(response: Response | None, cap: float, now: float, domain: str) -> float | None:
    """The response's Retry-After in seconds (capped), None without one."""
    if response is None:
        return None
    return parse_retry_after(response.headers.get(b"Retry-After"), cap=cap, now=now, domain=domain, response=response)


def _retry_copy(
    request: Request, state: dict[str, Any], due: float, priority_adjust: int | None, crawler: Crawler
) -> Request:
    """The next attempt: its retry state, not-before time and priority (as Scrapy's retry moves it)."""
    new = request.copy()
    new.meta[M.RETRY_STATE] = state
    new.meta["retry_times"] = int(request.meta.get("retry_times", 0)) + 1
    new.meta[M.NOT_BEFORE] = due
    new.meta.pop(M.FAILURE_SCOPE, None)  # a verdict is about one failure, not the next attempt
    new.dont_filter = True
    if priority_adjust is None:
        priority_adjust = request.meta.get("priority_adjust")
    if priority_adjust is None:
        priority_adjust = ScrapyRetrySettings.for_crawler(crawler).priority_adjust
    new.priority = request.priority + int(priority_adjust)
    return new


def _count_retry(
    stats: StatsCollector,
    classification: Classification,
    schedule: str,
    delay: float,
    *,
    response: Response | None,
    exception: BaseException | Failure | None,
) -> None:
    """Our retry stats and Scrapy's (``retry/count``, ``retry/reason_count/<reason>``)."""
    klass = classification.error_class.value
    stats.inc_value(f"{STATS_PREFIX}/{klass}/count")
    stats.inc_value(f"{STATS_PREFIX}/reason_count/{classification.reason}")
    if schedule == PAGE:
        stats.inc_value(f"{STATS_PREFIX}/page_scheduled")
    stats.inc_value(f"{SCRAPY_STATS_PREFIX}/count")
    reason = scrapy_reason(classification, response=response, exception=exception)
    stats.inc_value(f"{SCRAPY_STATS_PREFIX}/reason_count/{reason}")
    _record_delay(stats, delay)


def _give_up(
    request: Request,
    classification: Classification,
    *,
    spider: Spider,
    response: Response | None,
    exception: BaseException | Failure | None,
    level: int | str | None,
    logger: logging.Logger,
    letter: bool,
    now: float,
    first: float | None,
    why: str | None = None,
    error_class: str | None = None,
) -> None:
    """Count and log a give-up as Scrapy's ``get_retry_request`` does (``retry/max_reached``);
    unless *letter* is False, send the dead letter."""
    crawler = spider.crawler
    if level is None:
        level = request.meta.get("give_up_log_level")
    level = ScrapyRetrySettings.for_crawler(crawler).give_up_log_level if level is None else log_level(level)
    crawler.stats.inc_value(f"{SCRAPY_STATS_PREFIX}/max_reached")
    reason: object = exception.value if isinstance(exception, Failure) else exception
    if reason is None:
        reason = scrapy_reason(classification, response=response)
    logger.log(
        level,
        "Gave up retrying %(request)s (failed %(failed)d times): %(reason)s" + ("; %(why)s" if why else ""),
        {"request": request, "failed": _attempts(request), "reason": reason, "why": why},
        extra={"spider": spider},
    )
    if letter:
        send_dead_letter(
            request, classification, spider=spider, exception=exception, now=now, first=first, error_class=error_class
        )


def send_dead_letter(
    request: Request,
    classification: Classification,
    *,
    spider: Spider,
    exception: BaseException | Failure | None = None,
    now: float | None = None,
    first: float | None = None,
    error_class: str | None = None,
) -> deadletter.DeadLetter:
    """Build the request's dead letter and send ``signals.dead_letter`` once."""
    crawler = spider.crawler
    now = time.time() if now is None else now
    letter = deadletter.for_classified(
        request, classification, spider=spider, crawl_id=crawl_id(crawler), exception=exception
    )
    letter.last_attempt_at = now
    if letter.first_attempt_at is None:
        letter.first_attempt_at = first if first is not None else now
    if error_class is not None:
        letter.error_class = error_class
    if not letter.internal:  # (robots.txt's are never stored: not dead letters, as everywhere)
        crawler.stats.inc_value(f"{STATS_PREFIX}/dead_letters")
    crawler.signals.send_catch_log(
        signal=openclaw_signals.dead_letter, dead_letter=letter, spider=spider, request=request
    )
    return letter


def _domain_reopens(crawler: Crawler, request: Request) -> float:
    """When the request's domain may be sent to again (its hold or open circuit ends), 0 if unknown.

    A retry is not due before that: it waits in the scheduler until the
    domain reopens instead of being handed out, deferred and queued again.
    (Whatever the due time, waiting costs the request no attempt: only a
    response or a download error does.)
    """
    from scrapy_openclaw.health.reader import health_registry  # (health imports this module)

    registry = health_registry(crawler)
    if registry is None:
        return 0.0
    slot = slot_key(crawler, request)
    return registry.blocked_until(slot) if slot else 0.0


def _attempts(request: Request) -> int:
    state = request.meta.get(M.RETRY_STATE) or {}
    return 1 + sum((state.get("attempts") or {}).values())


def _next_state(request: Request, response: Response | None, now: float) -> dict[str, Any]:
    """A fresh copy of the request's retry state with ``last`` set to *now*."""
    old = request.meta.get(M.RETRY_STATE) or {}
    first = old.get("first")
    if first is None:
        # The first attempt started about one download latency ago.
        latency = request.meta.get("download_latency")
        first = now - float(latency) if isinstance(latency, (int, float)) else now
    state: dict[str, Any] = {
        "attempts": dict(old.get("attempts") or {}),
        "first": first,
        "last": now,
    }
    if old.get("delay") is not None:
        state["delay"] = old["delay"]
    return state


def _record_delay(stats: Any, delay: float) -> None:
    stats.inc_value(f"{STATS_PREFIX}/delay_seconds_total", delay)
    stats.inc_value(f"{STATS_PREFIX}/delay_count")
    for bound in DELAY_BUCKETS:
        if delay <= bound:
            stats.inc_value(f"{STATS_PREFIX}/delay_le/{_bucket_label(bound)}")
    stats.inc_value(f"{STATS_PREFIX}/delay_le/inf")
