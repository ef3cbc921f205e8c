"""Waiting without holding a slot: not-before times and waking the engine.

A request that must wait (retry backoff, Retry-After hold) carries
``meta["openclaw_not_before"]`` and goes back to the scheduler. The
DeadlinePriorityQueue keeps it in a timer heap itself; with any other queue,
:class:`DelayedRequests` does. Either way no download slot is held, nothing sleeps.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import time
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import DontCloseSpider, IgnoreRequest
from scrapy.utils.asyncio import call_later
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.misc import load_object
from twisted.internet.defer import Deferred

from scrapy_openclaw import meta as M
from scrapy_openclaw.runtime import peek, shared

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings

logger = logging.getLogger(__name__)

#: The longest a request may be held (seconds): the largest Retry-After cap a
#: policy allows. A later not-before time (``1e308``, a typo, hostile stored
#: data) is clamped to it with a warning, so it never hangs a crawl silently.
MAX_WAIT = 86400.0


def not_before(request: Request, stats: Any = None, *, now: float | None = None) -> float:
    """The request's not-before time, 0.0 when it may go now.

    An unusable value (not a number, NaN, infinite) is ignored and one more
    than :data:`MAX_WAIT` ahead is clamped; either is logged, counted in
    *stats* (``openclaw/delay/invalid``, ``openclaw/delay/clamped``) and
    written back to meta so it is reported once.
    """
    value = request.meta.get(M.NOT_BEFORE)
    if value is None:
        return 0.0
    now = time.time() if now is None else now
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value == -math.inf:
        request.meta.pop(M.NOT_BEFORE, None)
        _bad_not_before(request, value, "ignored: expected a UNIX time", "invalid", stats)
        return 0.0
    if value > now + MAX_WAIT:
        request.meta[M.NOT_BEFORE] = now + MAX_WAIT
        _bad_not_before(request, value, f"more than {MAX_WAIT:.0f}s ahead: clamped", "clamped", stats)
        return now + MAX_WAIT
    return float(value)


def _bad_not_before(request: Request, value: Any, what: str, stat: str, stats: Any) -> None:
    logger.warning(
        "meta[%(key)r]=%(value)s of %(request)s %(what)s",
        {"key": M.NOT_BEFORE, "value": repr(value)[:40], "request": request, "what": what},
    )
    if stats is not None:
        stats.inc_value(f"openclaw/delay/{stat}")


def request_class(request: Request, stats: Any = None) -> str | None:
    """``meta["openclaw_request_class"]`` if it is a string; anything else is removed,
    logged and counted (``openclaw/queue/request_class/invalid``), never a crash."""
    value = request.meta.get(M.REQUEST_CLASS)
    if value is None or isinstance(value, str):
        return value
    request.meta.pop(M.REQUEST_CLASS, None)
    logger.warning(
        "Ignoring meta[%(key)r]=%(value)s of %(request)s: expected a string (a deadline.classes name)",
        {"key": M.REQUEST_CLASS, "value": repr(value)[:40], "request": request},
    )
    if stats is not None:
        stats.inc_value("openclaw/queue/request_class/invalid")
    return None


async def sleep(seconds: float) -> None:
    """Wait *seconds* on the running reactor (asyncio's loop or Twisted's), blocking nothing."""
    waited: Deferred[None] = Deferred()
    call_later(max(0.0, seconds), waited.callback, None)
    await maybe_deferred_to_future(waited)


def queue_handles_not_before(settings: BaseSettings) -> bool:
    """Whether the configured scheduler queue keeps delayed requests itself."""
    for name in ("SCHEDULER_PRIORITY_QUEUE", "SCHEDULER_QUEUE_CLASS"):
        path = settings.get(name)
        if not path:
            continue
        try:
            cls = load_object(path) if isinstance(path, str) else path
        except (ImportError, NameError, ValueError):
            continue
        if getattr(cls, "handles_not_before", False):
            return True
    return False


class DelayedRequests:
    """Holds delayed requests for schedulers whose queue cannot (any queue but ours).

    It keeps a request out of the scheduler until it is due by vetoing
    ``request_scheduled``, telling the :class:`~scrapy_openclaw.lifecycle.RequestLifecycle`
    (so the checkpoint keeps it), then hands it to ``engine.crawl``; while it holds
    requests the spider is kept open.
    """

    def __init__(self, crawler: Crawler):
        self.crawler = crawler
        self.active = not queue_handles_not_before(crawler.settings)
        self._heap: list[tuple[float, int, Request]] = []
        self._counter = itertools.count()
        self._timer: Any = None
        self._timer_due = float("inf")
        if self.active:
            crawler.signals.connect(self._request_scheduled, signal=signals.request_scheduled)
            crawler.signals.connect(self._spider_idle, signal=signals.spider_idle)
            crawler.signals.connect(self._spider_closed, signal=signals.spider_closed)

    @classmethod
    def for_crawler(cls, crawler: Crawler) -> DelayedRequests:
        return shared(crawler, "delayed", lambda: cls(crawler))

    def __len__(self) -> int:
        return len(self._heap)

    def pending(self) -> list[Request]:
        """The requests held right now (for checkpoints and metrics)."""
        return [entry[2] for entry in sorted(self._heap)]

    def _request_scheduled(self, request: Request, spider: Any = None) -> None:
        due = not_before(request, self.crawler.stats)
        if due <= time.time():
            return
        heapq.heappush(self._heap, (due, next(self._counter), request))
        self.crawler.stats.inc_value("openclaw/delay/held")
        self._arm()
        lifecycle = peek(self.crawler, "request_lifecycle")
        if lifecycle is not None:
            lifecycle.held(request)
        raise IgnoreRequest("held until its not-before time")  # vetoes enqueueing only

    def _arm(self) -> None:
        if not self._heap:
            return
        due = self._heap[0][0]
        if self._timer is not None and self._timer_due <= due:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_due = due
        self._timer = call_later(max(0.0, due - time.time()), self._release)

    def _release(self) -> None:
        self._timer, self._timer_due = None, float("inf")
        now = time.time()
        engine = self.crawler.engine
        while self._heap and self._heap[0][0] <= now + 0.001:
            _, _, request = heapq.heappop(self._heap)
            request.meta.pop(M.NOT_BEFORE, None)
            if engine is not None and engine.spider is not None:
                engine.crawl(request)
        self._arm()

    def _spider_idle(self, spider: Any = None) -> None:
        if self._heap:
            raise DontCloseSpider

    def _spider_closed(self, spider: Any = None, reason: str = "") -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._heap:
            logger.warning(
                "%(n)d delayed requests were still waiting when the spider closed",
                {"n": len(self._heap)},
            )
