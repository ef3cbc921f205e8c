"""Not-before times (retry backoff, Retry-After): the delayed requests and the queue's one timer.

A delayed request still counts in the queue's ``len()`` so the spider stays
open; one reactor timer for the earliest due time wakes the engine then,
instead of at its 5 s heartbeat.
"""

from __future__ import annotations

import heapq
import itertools
import math
from typing import TYPE_CHECKING, Any

from scrapy.utils.asyncio import call_later

from scrapy_openclaw import meta as M
from scrapy_openclaw.scrapy_internals import wake_engine

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request
    from scrapy.crawler import Crawler

#: A timer never fires sooner than this after being armed (no busy loops).
_MIN_TIMER = 0.005


class Delays:
    """Requests held until their not-before time, handed to *release* when it comes; and the one timer.

    The timer also serves the queue's other waits (a parked domain's
    ``ready_at``): :meth:`arm` keeps it at the earliest time asked for.
    """

    def __init__(self, crawler: Crawler, *, clock: Callable[[], float], release: Callable[[Request], None]):
        self.crawler = crawler
        self.stats = crawler.stats
        self._clock = clock
        self._release = release
        self._held: list[tuple[float, int, Request]] = []
        self._seq = itertools.count()
        self._timer: Any = None
        self.timer_due = math.inf
        self._closed = False

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, request: Request, due: float) -> None:
        heapq.heappush(self._held, (due, next(self._seq), request))
        self.stats.inc_value("openclaw/queue/delayed")
        self.arm(due)

    def release_due(self, now: float) -> None:
        """Hand the requests whose time has come to *release*."""
        released = 0
        while self._held and self._held[0][0] <= now:
            _, _, request = heapq.heappop(self._held)
            request.meta.pop(M.NOT_BEFORE, None)
            self._release(request)
            released += 1
        if released:
            self.stats.inc_value("openclaw/queue/released", released)

    def held(self, *, in_order: bool = False) -> list[tuple[float, Request]]:
        """The requests waiting for their not-before time, with it (a copy; *in_order*: soonest first)."""
        entries = sorted(self._held, key=lambda e: e[:2]) if in_order else self._held
        return [(due, request) for due, _seq, request in entries]

    def arm(self, due: float) -> None:
        """Make sure the timer fires no later than *due* (one timer, the earliest due time)."""
        if self._closed or (self._timer is not None and self.timer_due <= due):
            return
        self._cancel()
        self.timer_due = due
        self._timer = call_later(max(0.0, due - self._clock()), self._on_timer)

    def close(self) -> None:
        self._closed = True
        self._cancel()

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self.timer_due = None, math.inf

    def _on_timer(self) -> None:
        self._timer, self.timer_due = None, math.inf
        if self._closed:
            return
        self.release_due(self._clock())
        self.stats.inc_value("openclaw/queue/wakeups")
        wake_engine(self.crawler)
        if self._held:
            self.arm(self._held[0][0])
