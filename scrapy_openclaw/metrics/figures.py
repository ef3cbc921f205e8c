"""The crawl's per-domain figures, each counted once: the log table, ``/metrics`` and the report read them.

Each figure is defined in docs/politeness-report.md, "The figures". A domain is a
download-slot key, as everywhere in this package; domains past
``OPENCLAW_REPORT_MAX_DOMAINS`` share one ``other`` row, so a broad crawl stays bounded.
"""

from __future__ import annotations

import time
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.utils.httpobj import urlparse_cached

from scrapy_openclaw import meta as M
from scrapy_openclaw import signals as openclaw_signals
from scrapy_openclaw.deadletter import is_internal
from scrapy_openclaw.errors import ErrorTaxonomy
from scrapy_openclaw.metrics.peaks import Peaks
from scrapy_openclaw.retry_after import parse_retry_after
from scrapy_openclaw.runtime import shared
from scrapy_openclaw.scrapy_internals import slot_key
from scrapy_openclaw.settings import OpenClawSettings

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response

    from scrapy_openclaw.deadletter import DeadLetter

OTHER = "other"
THROTTLE_STATUSES = (429, 503)
_PARSE_SEEN = "_openclaw_figures_parse"  # parse retries of this request already taken off "done"
_RETRY_AFTER_CAP = 6 * 3600.0  # the largest Retry-After read as a number of seconds (urllib3's cap)
ROBOTS_EXAMPLES = 5  # disallowed paths a domain's figures keep, to show which rules applied


def status_class(status: int) -> str:
    """``"2xx"`` for 200 and so on; anything outside 100..599 is ``"unknown"``."""
    return f"{status // 100}xx" if 100 <= status <= 599 else "unknown"


@dataclass
class DomainFigures:
    """One domain's counts since the crawl started.

    A *request* is an attempt handed to the downloader (robots.txt and retries included);
    a *retry* counts when it is sent, so requests = first attempts + retries. An *error*
    is an attempt without an answer; a *failure* an attempt of the spider's own requests
    that the error taxonomy calls failed (an error status, or no answer). *Done* is a
    spider request finished for good, once: its answer went on to the spider or it
    became a dead letter; a parse retry takes back the done of the answer before it.
    """

    requests: int = 0
    retries: int = 0
    errors: int = 0
    failures: int = 0
    done: int = 0
    bytes: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    dead_letters: Counter[str] = field(default_factory=Counter)
    circuit_openings: int = 0
    retry_after_received: int = 0
    retry_after_max: float = 0.0
    robots_status: int | None = None  # the robots.txt answer's status; None: not fetched
    robots_refused: int = 0  # requests its robots.txt disallowed (never sent)
    robots_refused_paths: list[str] = field(default_factory=list)  # the first ROBOTS_EXAMPLES of them
    peaks: Peaks = field(default_factory=Peaks)

    @property
    def answers(self) -> Counter[str]:
        """Answers by status class."""
        by_class: Counter[str] = Counter()
        for status, n in self.statuses.items():
            by_class[status_class(status)] += n
        return by_class

    @property
    def dead(self) -> int:
        return sum(self.dead_letters.values())


class CrawlFigures:
    """The one counter of per-domain request figures, fed by Scrapy's and our signals."""

    def __init__(self, crawler: Crawler):
        self.crawler = crawler
        config = OpenClawSettings.for_crawler(crawler)
        self.max_domains = config.report_max_domains
        self.shared = config.distributed  # workers' send times add up in Redis (report/redis.py)
        self.taxonomy = ErrorTaxonomy.for_crawler(crawler)
        self.domains: dict[str, DomainFigures] = {}
        self._reached: dict[int, float] = {}  # id(request) -> when it reached the downloader
        self._answered: set[int] = set()  # ids of attempts that got a response
        self._lettered: set[str] = set()  # URLs dead-lettered whose response may still go on
        # requests whose answer went on to the spider, counted done (a callback may still give it up)
        self._counted: weakref.WeakSet[Request] = weakref.WeakSet()
        timeout = crawler.settings.getfloat("DOWNLOAD_TIMEOUT") or 180.0
        #: seconds after which no send time can still arrive (an attempt lasts at most a timeout)
        self.horizon = min(timeout, 600.0) + 1.0
        connect = crawler.signals.connect
        connect(self.request_reached_downloader, signal=signals.request_reached_downloader)
        connect(self.response_downloaded, signal=signals.response_downloaded)
        connect(self.request_left_downloader, signal=signals.request_left_downloader)
        connect(self.response_received, signal=signals.response_received)
        connect(self.dead_letter, signal=openclaw_signals.dead_letter)
        connect(self.circuit_opened, signal=openclaw_signals.circuit_opened)

    @classmethod
    def for_crawler(cls, crawler: Crawler) -> CrawlFigures:
        return shared(crawler, "figures", lambda: cls(crawler))

    def of(self, domain: str) -> DomainFigures:
        figures = self.domains.get(domain)
        if figures is None:
            if len(self.domains) >= self.max_domains and domain != OTHER:
                return self.of(OTHER)
            figures = self.domains[domain] = DomainFigures(peaks=Peaks(self.shared))
        return figures

    def total(self) -> DomainFigures:
        """Every domain's counts added up (peaks aside: they do not add)."""
        total = DomainFigures()
        for f in self.domains.values():
            for name in ("requests", "retries", "errors", "failures", "done", "bytes", "circuit_openings"):
                setattr(total, name, getattr(total, name) + getattr(f, name))
            total.statuses.update(f.statuses)
            total.dead_letters.update(f.dead_letters)
            total.retry_after_received += f.retry_after_received
            total.retry_after_max = max(total.retry_after_max, f.retry_after_max)
            total.robots_refused += f.robots_refused
        return total

    def settle(self, now: float | None = None) -> None:
        """Finalise the busiest windows older than the horizon (bounds their memory)."""
        before = (time.time() if now is None else now) - self.horizon
        for f in self.domains.values():
            f.peaks.settle(before)
        self._lettered.clear()

    # --- signals ---------------------------------------------------------------

    def _domain(self, request: Request) -> str:
        return slot_key(self.crawler, request)

    def request_reached_downloader(self, request: Request, spider: Any = None) -> None:
        f = self.of(self._domain(request))
        f.requests += 1
        self._reached[id(request)] = time.time()
        if not _is_retry(request):
            return
        f.retries += 1
        _undo_parse_failure(request, f)

    def response_downloaded(self, response: Response, request: Request, spider: Any = None) -> None:
        self._answered.add(id(request))
        f = self.of(self._domain(request))
        status = response.status
        f.statuses[status] += 1
        f.bytes += len(response.body)
        internal = is_internal(request)
        if internal and request.url.endswith("/robots.txt"):
            f.robots_status = status
        if not internal and self.taxonomy.classify_status(status) is not None:
            f.failures += 1
        if status in THROTTLE_STATUSES:
            seconds = parse_retry_after(
                response.headers.get(b"Retry-After"),
                cap=_RETRY_AFTER_CAP,
                domain=self._domain(request),
                response=response,
            )
            if seconds is not None:
                f.retry_after_received += 1
                f.retry_after_max = max(f.retry_after_max, seconds)

    def robots_refused(self, request: Request) -> None:
        """A request robots.txt disallowed: never sent, so none of the other figures counts it."""
        f = self.of(self._domain(request))
        f.robots_refused += 1
        if len(f.robots_refused_paths) < ROBOTS_EXAMPLES:
            f.robots_refused_paths.append(urlparse_cached(request).path or "/")

    def request_left_downloader(self, request: Request, spider: Any = None) -> None:
        key = id(request)
        reached = self._reached.pop(key, None)
        f = self.of(self._domain(request))
        if key in self._answered:
            self._answered.discard(key)
        else:
            f.errors += 1
            if not is_internal(request):
                f.failures += 1
        now = time.time()
        latency = request.meta.get("download_latency")
        if isinstance(latency, (int, float)) and 0 <= latency <= now - (reached or 0.0):
            f.peaks.add(now - latency)
        elif reached is not None:
            f.peaks.add(reached)

    def response_received(self, response: Response, request: Request, spider: Any = None) -> None:
        if is_internal(request):
            return
        if response.url in self._lettered or request.url in self._lettered:
            self._lettered.discard(response.url)
            self._lettered.discard(request.url)
            return  # its dead letter made it done
        f = self.of(self._domain(request))
        _undo_parse_failure(request, f)  # (a retry the HTTP cache answered never reached the downloader)
        f.done += 1
        self._counted.add(request)

    def dead_letter(self, dead_letter: DeadLetter, spider: Any = None, request: Request | None = None) -> None:
        if dead_letter.internal:
            return
        f = self.of(dead_letter.domain)
        f.dead_letters[str(dead_letter.error_class)] += 1
        if request is not None and request in self._counted:
            self._counted.discard(request)  # its callback gave up on an answer already counted done
            return
        if dead_letter.item is None and dead_letter.validation_error is None:
            f.done += 1  # a request given up (an item's letter is no request)
            self._lettered.add(dead_letter.url)

    def circuit_opened(self, domain: str, state: Any = None, spider: Any = None) -> None:
        self.of(domain).circuit_openings += 1


def _undo_parse_failure(request: Request, f: DomainFigures) -> None:
    """A parse retry takes back the "done" of the answer before it, whose callback could not
    parse it: once, when the retry is sent or, if the HTTP cache answers it, when it comes back."""
    parse = _parse_retries(request)
    if parse > int(request.meta.get(_PARSE_SEEN, 0)):
        request.meta[_PARSE_SEEN] = parse
        f.done -= 1


def _is_retry(request: Request) -> bool:
    """A repeat of a failed attempt, by our retry middlewares or by Scrapy's RetryMiddleware."""
    times = request.meta.get("retry_times")
    if isinstance(times, int) and times > 0:
        return True
    attempts = _attempts(request)
    return any(isinstance(n, int) and n > 0 for n in attempts.values())


def _attempts(request: Request) -> dict[str, Any]:
    state = request.meta.get(M.RETRY_STATE)
    attempts = state.get("attempts") if isinstance(state, dict) else None
    return attempts if isinstance(attempts, dict) else {}


def _parse_retries(request: Request) -> int:
    n = _attempts(request).get("parse", 0)
    return n if isinstance(n, int) else 0
