"""Waiting without holding a slot: not-before times and waking the engine.

A request that must wait (retry backoff, Retry-After hold) carries
``meta["openclaw_not_before"]`` and goes back to the scheduler. The
DeadlinePriorityQueue keeps it in a timer heap itself. With any other queue,
:class:`DelayedRequests` keeps it out of the scheduler until it is due (by
vetoing ``request_scheduled``, and telling the
:class:`~scrapy_openclaw.lifecycle.RequestLifecycle` so the checkpoint keeps
it) and then hands it to ``engine.crawl``; while it holds requests the spider
is kept open. Either way the wait costs no
download slot and no ``time.sleep``.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import time
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import DontCloseSpider, IgnoreRequest
from scrapy.utils.asyncio import call_later
from scrapy.utils.misc import load_object

from scrapy_openclaw import meta as M
from scrapy_openclaw.runtime import peek, shared

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings

logger = logging.getLogger(__name__)


def not_before(request: Request) -> float:
    """The request's not-before time, 0.0 when it may go now."""
    value = request.meta.get(M.NOT_BEFORE)
    return float(value) if isinstance(value, (int, float)) else 0.0


def wake_engine(crawler: Crawler) -> None:
    """Ask the engine to pull from the scheduler now, not at its 5 s heartbeat.

    Scrapy has no public call for this; ``engine.crawl`` does it internally
    through the engine slot's ``nextcall``, which we schedule the same way.
    """
    try:
        engine = crawler.engine
    except (AttributeError, RuntimeError):  # 2.19 raises before the crawl starts
        return
    slot = getattr(engine, "_slot", None) or getattr(engine, "slot", None)
    nextcall = getattr(slot, "nextcall", None)
    if nextcall is not None:
        nextcall.schedule()


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
    """Holds delayed requests for schedulers whose queue cannot (any queue but ours)."""

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
        due = not_before(request)
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
