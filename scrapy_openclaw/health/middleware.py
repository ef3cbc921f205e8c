"""DomainHealthMiddleware: feeds the HealthRegistry and applies it to Scrapy's download slots.

It sits next to the downloader (order 560, inside the retry middleware), so it
sees every raw response and download failure, judges whose trouble a failure is
and records it; from the registry it sets each slot's concurrency (and, without
our queue, its delay). A held domain's requests wait in the scheduler, not here.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import IgnoreRequest, NotConfigured

from scrapy_openclaw import deadletter
from scrapy_openclaw import meta as M
from scrapy_openclaw import signals as openclaw_signals
from scrapy_openclaw.delay import DelayedRequests, queue_handles_not_before
from scrapy_openclaw.errors import ErrorTaxonomy
from scrapy_openclaw.health.lag import CrawlerLag
from scrapy_openclaw.health.notices import HealthNotices
from scrapy_openclaw.health.registry import CLOSED, OPEN, HealthRegistry, affects_health
from scrapy_openclaw.health.registry.record import effective_rate
from scrapy_openclaw.ratelimit_headers import read_declared
from scrapy_openclaw.ratelimit_headers import summarise_warnings as summarise_ratelimit_warnings
from scrapy_openclaw.retry_after import parse_retry_after, summarise_warnings
from scrapy_openclaw.runtime import peek, shared
from scrapy_openclaw.scrapy_internals import (
    download_slot,
    download_slots,
    drain_slot_queue,
    engine_of,
    is_robots_refusal,
    new_slot_concurrency,
    new_slot_delay,
    pause_slot,
    resume_slot,
    robots_parsed_signal,
    slot_key,
    slot_paused,
)
from scrapy_openclaw.settings import OpenClawSettings, crawl_id

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.core.downloader import Slot
    from scrapy.crawler import Crawler
    from scrapy.http import Response

    from scrapy_openclaw.errors import Classification
    from scrapy_openclaw.health.registry import DomainState

logger = logging.getLogger(__name__)

_MIN_PRUNE = 1024  # tuned-slot records kept before the first prune


class DomainHealthMiddleware:
    """Downloader middleware: per-domain health, pacing, circuit breaking and Retry-After holds.

    A request for a domain that is held or whose circuit is open is not sent and not
    waited for here (waiting in a middleware would hold one of the
    ``CONCURRENT_REQUESTS`` places): it goes back to the scheduler with a not-before time.
    Requests already queued inside the download slot when a hold starts are paused in
    the slot itself (:func:`~scrapy_openclaw.scrapy_internals.pause_slot`).
    """

    def __init__(self, crawler: Crawler):
        self.crawler = crawler
        self.registry = HealthRegistry.for_crawler(crawler)
        self.taxonomy = ErrorTaxonomy.for_crawler(crawler)
        self.stats = crawler.stats
        # With our deadline queue, the queue takes tokens before handing a
        # request out; with any other queue the slot delay does the pacing.
        self.paces_slots = not queue_handles_not_before(crawler.settings)
        self.autothrottle = crawler.settings.getbool("AUTOTHROTTLE_ENABLED")
        config = OpenClawSettings.for_crawler(crawler)
        self.crawl_delay_max = config.crawl_delay_max
        self.notices = HealthNotices(
            state=self.registry.state,
            policy=self.registry.policy,
            stats=self.stats,
            repeat_interval=config.log_repeat_interval,
            slow_after=config.slow_hint_after,
        )
        self._given_up_logged: set[str] = set()
        # id() of the download slot last tuned per domain (Scrapy drops idle slots and makes new
        # ones; its Slot takes no weak reference, and keeping the slot would keep it alive).
        # Entries of dropped slots are pruned once the dict doubles (amortised O(1)).
        self._tuned: dict[str, int] = {}
        self._prune_tuned_at = _MIN_PRUNE
        # domain -> when its first page after robots.txt may go (that page waited for robots.txt
        # past the queue's pacing, so its Crawl-delay holds the download slot instead)
        self._robots_spacing: dict[str, float] = {}
        DelayedRequests.for_crawler(crawler)  # keeps deferred requests when the queue cannot
        shared(crawler, "health_middleware", lambda: self)  # found by BanDetectionMiddleware (record_blocked)
        crawler.signals.connect(self._request_reached_downloader, signal=signals.request_reached_downloader)
        robots_parsed = robots_parsed_signal()
        if robots_parsed is not None and self.crawl_delay_max > 0:
            crawler.signals.connect(self._robots_parsed, signal=robots_parsed)
        crawler.signals.connect(self._spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(self._spider_closed, signal=signals.spider_closed)
        # The crawler's own stalls, so that its slowness is not read as the sites' (see .lag)
        self.lag = CrawlerLag(on_busy=self._crawler_busy)
        self.registry.crawler_lag = self.lag
        crawler.signals.connect(self.lag.start, signal=signals.engine_started)
        if self.paces_slots and crawler.settings.getbool("AUTOTHROTTLE_ENABLED"):
            logger.warning(
                "AutoThrottle and DomainHealthMiddleware both set download slot delays; "
                "disable AUTOTHROTTLE_ENABLED to let the health middleware pace domains"
            )

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> DomainHealthMiddleware:
        if not OpenClawSettings.for_crawler(crawler).health_enabled:
            raise NotConfigured
        return cls(crawler)

    # --- the middleware -------------------------------------------------------

    def process_request(self, request: Request) -> Request | None:
        domain = self._domain(request)
        if domain and self.registry.given_up(domain):
            self._given_up(domain)
            raise self._dead_letter(request, domain)
        if self._given_up_logged:  # (restored by the operator: a later give-up is news again)
            self._given_up_logged.discard(domain)
        if not domain or not self.paces_slots:
            return None  # a gating queue has already asked the registry
        if self.registry.try_acquire(domain, token=False):
            return None
        ready_at = self.registry.ready_at(domain)
        self.stats.inc_value("openclaw/health/deferred")
        logger.debug(
            "Deferring %(request)s: %(domain)s is held or its circuit is open until %(at).1f",
            {"request": request, "domain": domain, "at": ready_at},
        )
        return request.replace(dont_filter=True, meta={**request.meta, M.NOT_BEFORE: ready_at})

    def process_response(self, request: Request, response: Response) -> Response:
        domain = self._domain(request)
        if domain and "cached" in response.flags:
            if not self.paces_slots:  # (our queue took a token when it handed the request out)
                self.registry.refund(domain)
        elif domain:
            self._declared(domain, response)
            classification = self.taxonomy.classify_status(response.status)
            retry_after = None
            if classification is not None and classification.is_throttle:
                retry_after = self._retry_after(domain, response)
            self._record(request, domain, classification, retry_after)
        return response

    def process_exception(self, request: Request, exception: Exception) -> None:
        if is_robots_refusal(exception):  # (the site's own rule applied: no failure, a report line)
            figures = peek(self.crawler, "figures")
            if figures is not None:
                figures.robots_refused(request)
            return
        domain = self._domain(request)
        classification = self.taxonomy.classify_download_error(exception)
        if domain and classification is not None:
            self._record(request, domain, classification, None)

    def record_blocked(self, request: Request, classification: Classification, hold: float) -> None:
        """Record a ban page that BanDetectionMiddleware took out of the response chain: a
        domain failure holding the domain *hold* seconds (as a Retry-After would)."""
        domain = self._domain(request)
        if domain:
            self._record(request, domain, classification, hold)

    def _given_up(self, domain: str) -> None:
        """First sight of a domain given up: say so once, and empty its download slot.

        Requests that passed this middleware before the give-up wait in the
        slot's own queue, paused by the circuit; they would trickle out one per
        cool-down. They fail now with IgnoreRequest, each a dead letter.
        """
        if domain in self._given_up_logged:
            return
        self._given_up_logged.add(domain)
        self.stats.inc_value("openclaw/health/given_up_domains")
        if self.registry.overrides(domain)["given_up"]:
            logger.warning(
                "Giving up on %(domain)s at the operator's request (openclaw-ctl): its requests become dead letters",
                {"domain": domain},
                extra={"spider": self.crawler.spider},
            )
        else:
            logger.warning(
                "Giving up on %(domain)s: its circuit has stayed open for %(down).0fs (give_up_after); "
                "its requests become dead letters (replay them later with scrapy openclaw-dlq replay)",
                {"domain": domain, "down": self.registry.down_for(domain)},
                extra={"spider": self.crawler.spider},
            )
        for request, waiting in drain_slot_queue(download_slot(self.crawler, domain)):
            waiting.errback(self._dead_letter(request, domain))

    def _dead_letter(self, request: Request, domain: str) -> IgnoreRequest:
        """Send the request's dead letter; the exception that drops it."""
        spider = self.crawler.spider
        assert spider is not None  # (requests only pass middlewares while a spider runs)
        self.stats.inc_value("openclaw/health/given_up_requests")
        letter = deadletter.for_request(
            request,
            spider=spider,
            crawl_id=crawl_id(self.crawler),
            error_class="domain_down",
            reason=(
                f"{domain} given up by the operator (openclaw-ctl)"
                if self.registry.overrides(domain)["given_up"]
                else f"{domain} down for {self.registry.down_for(domain):.0f}s (give_up_after)"
            ),
        )
        self.crawler.signals.send_catch_log(signal=openclaw_signals.dead_letter, dead_letter=letter, spider=spider)
        return IgnoreRequest(f"{domain} was given up (down past give_up_after)")

    # --- recording and applying -----------------------------------------------

    def _record(
        self, request: Request, domain: str, classification: Classification | None, retry_after: float | None
    ) -> None:
        if affects_health(classification):
            assert classification is not None
            failed_before = _last_failure(request)
            scope = self.registry.judge(domain, classification, retry_after=retry_after, failed_before=failed_before)
            request.meta[M.FAILURE_SCOPE] = scope
            changed = self.registry.record_failure(
                domain,
                classification,
                retry_after=retry_after,
                failed_before=failed_before,
                latency=request.meta.get("download_latency"),
            )
            self.stats.inc_value(f"openclaw/health/{scope}_failures")
            if scope == "domain":
                self.notices.troubled(domain)
            self.stats.inc_value(f"openclaw/health/failures/{classification.reason}")
            if classification.is_throttle:
                self.stats.inc_value("openclaw/health/throttled")
            if classification.is_throttle or retry_after is not None:
                self.notices.refused(domain)
            if retry_after is not None:
                self.stats.inc_value("openclaw/health/held")
                why = (
                    "the site asked to wait (Retry-After)"
                    if classification.is_throttle
                    else f"a ban page ({classification.reason})"
                )
                self.notices.held(domain, retry_after, why)
        else:
            changed = self.registry.record_success(domain, request.meta.get("download_latency"))
        if changed:  # caused by this record: with a shared registry, other workers' changes are theirs
            self._circuit_changed(changed, self.registry.state(domain))
        if self.registry.given_up(domain):
            self._given_up(domain)
            return
        slot = download_slot(self.crawler, domain)
        if slot is not None:
            self._apply(domain, slot)

    def _declared(self, domain: str, response: Response) -> None:
        """Apply the limit the answer declares (RateLimit headers): a pace that changed (the
        registry hears of it only then: in distributed mode each call is a round trip), and
        a hold while the quota is used up."""
        policy = self.registry.policy(domain)
        if not policy.ratelimit_headers:
            return
        declared = read_declared(response.headers, cap=policy.retry_after_cap, domain=domain, response=response)
        if declared is None:
            return
        if declared.pace is not None and declared.pace != self.registry.declared_pace(domain):
            self.stats.inc_value("openclaw/health/declared_limits")
            self.registry.declare_limit(domain, declared.pace)
        if declared.exhausted_for is not None:
            self.stats.inc_value("openclaw/health/declared_exhausted")
            self.registry.hold(domain, time.time() + declared.exhausted_for)

    def _retry_after(self, domain: str, response: Response) -> float | None:
        header = response.headers.get("Retry-After")
        seconds = parse_retry_after(
            header, cap=self.registry.policy(domain).retry_after_cap, domain=domain, response=response
        )
        if header is not None and seconds is None:
            self.stats.inc_value("openclaw/health/retry_after_ignored")
        return seconds

    def _circuit_changed(self, circuit: str, state: DomainState) -> None:
        if circuit == OPEN:
            self.stats.inc_value("openclaw/health/circuit_opened")
            self.notices.opened(state, max(0.0, self.registry.blocked_until(state.domain) - time.time()))
            signal = openclaw_signals.circuit_opened
        elif circuit == CLOSED:
            self.stats.inc_value("openclaw/health/circuit_closed")
            self.notices.closed(state)
            signal = openclaw_signals.circuit_closed
        else:  # open -> half-open happens with the passing of time, not here
            return
        self.crawler.signals.send_catch_log(signal=signal, domain=state.domain, state=state, spider=self.crawler.spider)

    def _request_reached_downloader(self, request: Request, spider: Any = None) -> None:
        """Tune a new slot right before its first request queues there (the slot exists by now),
        and a paused one (its hold may have ended early); after that each response or failure of
        the domain tunes it (``_record``)."""
        domain = self._domain(request)
        slot = download_slot(self.crawler, domain)
        if slot is not None and (self._tuned.get(domain) != id(slot) or slot_paused(slot)):
            self._apply(domain, slot)
            if len(self._tuned) > self._prune_tuned_at:
                self._prune_tuned()

    def _prune_tuned(self) -> None:
        """Forget the slots Scrapy dropped (idle for a minute): a broad crawl sees millions of domains."""
        slots = download_slots(self.crawler)
        self._tuned = {domain: tuned for domain, tuned in self._tuned.items() if domain in slots}
        self._prune_tuned_at = max(_MIN_PRUNE, 2 * len(self._tuned))

    def _robots_parsed(self, robotparser: Any, request: Request, **kwargs: Any) -> None:
        """Honour robots.txt ``Crawl-delay`` (capped by ``OPENCLAW_CRAWL_DELAY_MAX``)."""
        agent = self.crawler.settings.get("ROBOTSTXT_USER_AGENT") or request.headers.get(
            b"User-Agent", self.crawler.settings.get("USER_AGENT")
        )
        try:
            delay = robotparser.crawl_delay(agent)
        except Exception as exc:  # a third-party parser; robots.txt is untrusted input
            logger.warning("Ignoring the Crawl-delay of %(url)s: %(error)r", {"url": request.url, "error": exc})
            return
        domain = self._domain(request)
        if not domain or not isinstance(delay, (int, float)) or not delay > 0:
            if domain and self.registry.remembered.crawl_delay(domain) > 0:
                self.registry.set_crawl_delay(domain, 0.0)  # (the site dropped it since: memory was wrong)
            return
        seconds = min(float(delay), self.crawl_delay_max)
        # (the page that asked for robots.txt waits in the slot: the queue's next token is a delay later)
        self.registry.set_crawl_delay(domain, seconds, owed=1)
        self._robots_spacing[domain] = until = time.time() + seconds
        slot = download_slot(self.crawler, domain)
        if slot is not None:
            pause_slot(slot, until)
        self.stats.set_value(f"openclaw/health/crawl_delay/{domain}", seconds)
        logger.info(
            "robots.txt of %(domain)s asks for Crawl-delay %(delay)ss: spacing its requests %(used)ss apart",
            {"domain": domain, "delay": delay, "used": seconds},
            extra={"spider": self.crawler.spider},
        )

    def _apply(self, domain: str, slot: Slot) -> None:
        engine = engine_of(self.crawler)
        assert engine is not None  # (a slot exists)
        # The slot's own concurrency and delay (DOWNLOAD_SLOTS, else the project's): a cap and a floor.
        own = new_slot_concurrency(engine.downloader, domain)
        floor = new_slot_delay(engine.downloader, domain)
        slot.concurrency, paused_until = self.registry.slot_limits(domain, own)
        spaced = self._robots_spacing.get(domain)
        if spaced is not None:
            paused_until = max(paused_until, spaced)
            if spaced <= time.time():
                del self._robots_spacing[domain]
        self._tuned[domain] = id(slot)
        if self.paces_slots:  # (state() only here: it is the costliest read)
            slot.delay = max(floor, 1.0 / self.registry.state(domain).rate)
        elif not self.autothrottle:  # (AutoThrottle owns the slot delay when the user enabled it)
            slot.delay = floor  # undo a pause's minimal delay
        # (once the crawl is stopping, a request already in the slot goes: it has left the
        # scheduler, and waiting out the hold would keep the stop waiting; a domain's page that
        # waited for its robots.txt under a Retry-After of 600 s kept a Ctrl-C waiting that long)
        if paused_until > time.time() and self.crawler.crawling:
            pause_slot(slot, paused_until)
        elif slot_paused(slot):  # a hold that ended early (an operator's release, seen late), or the stop
            resume_slot(slot, engine.downloader)

    def _crawler_busy(self, share: float, seconds: float) -> None:
        logger.warning(
            "The crawler itself is busy: its event loop stalled %(share).0f%% of the last %(seconds).0f s "
            "(slow callbacks, garbage collection or a loaded machine). Pages per second are bounded by "
            "the crawler now, not by the sites; their latency and rate readings are corrected for it. "
            "Profile the spider's callbacks or give the crawl more CPU.",
            {"share": 100 * share, "seconds": seconds},
            extra={"spider": self.crawler.spider},
        )

    def _spider_opened(self, spider: Any = None) -> None:
        self.notices.start()

    def _spider_closed(self, spider: Any = None, reason: str = "") -> None:
        self.notices.stop()
        self.lag.stop()
        self.stats.set_value("openclaw/health/crawler_stalled_seconds", round(self.lag.total, 3))
        self.stats.set_value("openclaw/health/crawler_stall_max", round(self.lag.worst, 3))
        for cause, count in self.registry.cuts_by_cause.items():
            self.stats.set_value(f"openclaw/health/rate_cuts/{cause}", count)
        summarise_warnings(extra={"spider": spider})  # the Retry-After warnings condensed during the crawl
        summarise_ratelimit_warnings(extra={"spider": spider})  # ... and the RateLimit headers' ones
        for domain in self.registry.domains():
            state = self.registry.state(domain)
            self.stats.set_value(f"openclaw/health/final_health/{domain}", round(state.health, 1))
            # (the pace as the log table shows it: inf when it cannot bind; to the hundredth, as
            # the table rounds it, since a value rounded twice can differ: 527.7349 -> 527.735 -> .74)
            self.stats.set_value(f"openclaw/health/final_rate/{domain}", round(effective_rate(state), 2))
            self.stats.set_value(f"openclaw/health/held_seconds/{domain}", round(state.blocked_seconds, 1))

    def _domain(self, request: Request) -> str:
        return slot_key(self.crawler, request)


def _last_failure(request: Request) -> float | None:
    """When this URL last failed (its retry state's last attempt), None on a first attempt."""
    state = request.meta.get(M.RETRY_STATE)
    last = state.get("last") if isinstance(state, dict) else None
    return float(last) if isinstance(last, (int, float)) and not isinstance(last, bool) else None
