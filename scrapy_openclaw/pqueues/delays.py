"""Not-before times (retry backoff, Retry-After): the delayed-request heap and the queue's one timer.

A delayed request still counts in ``len()`` so the spider stays open; one
reactor timer for the earliest due time wakes the engine then, instead of at
its 5 s heartbeat.
"""

from __future__ import annotations

import heapq
import math

from scrapy.utils.asyncio import call_later

from scrapy_openclaw import meta as M
from scrapy_openclaw.pqueues.domains import DomainQueues
from scrapy_openclaw.scrapy_internals import wake_engine

#: A timer never fires sooner than this after being armed (no busy loops).
_MIN_TIMER = 0.005


class NotBefore(DomainQueues):
    """Part of DeadlinePriorityQueue: releasing delayed requests when due, on one timer."""

    def _release_due(self, now: float) -> None:
        """Move delayed requests whose time has come into their domain queues."""
        released = 0
        while self._delayed and self._delayed[0][0] <= now:
            _, _, request = heapq.heappop(self._delayed)
            request.meta.pop(M.NOT_BEFORE, None)
            self._enqueue(request, self._domain_of(request))
            released += 1
        if released:
            self.stats.inc_value("openclaw/queue/released", released)

    def _arm(self, due: float) -> None:
        """Make sure the timer fires no later than *due* (one timer, the earliest due time)."""
        if self._closed or (self._timer is not None and self._timer_due <= due):
            return
        self._cancel_timer()
        self._timer_due = due
        self._timer = call_later(max(0.0, due - self._clock()), self._on_timer)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_due = None, math.inf

    def _on_timer(self) -> None:
        self._timer, self._timer_due = None, math.inf
        if self._closed:
            return
        self._release_due(self._clock())
        self.stats.inc_value("openclaw/queue/wakeups")
        wake_engine(self.crawler)
        if self._delayed:
            self._arm(self._delayed[0][0])
