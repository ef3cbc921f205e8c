"""What a distributed crawl has left to do, as one worker last counted it in Redis.

Scrapy closes a spider when its scheduler has no pending request; in a distributed
crawl that is everything the whole crawl still has to do, in Redis and in live
workers (docs/distributed-workers.md). The count comes from the queue's background
rounds, and a zero is believed only when it is sure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from scrapy_openclaw.metrics.logtable import Progress

if TYPE_CHECKING:
    from scrapy_openclaw.distributed.rounds import Round

#: seconds after which a count of zero is asked again before the worker closes on it
_FRESH_ZERO = 0.3


class CrawlWork:
    """The crawl's remaining work from the last counting round; *idle_before_close*: seconds a
    worker stays open with nothing to do anywhere (scrapy-redis's ``SCHEDULER_IDLE_BEFORE_CLOSE``)."""

    def __init__(self, clock: Callable[[], float], idle_before_close: float = 0.0):
        self.clock = clock
        self.idle_before_close = idle_before_close
        self.ready = self.delayed = self.inflight = self.found = 0
        self.others_busy = 0
        self.counted_at = -1e18
        self.stable = False
        self.stale = True  # this worker's writes reached Redis after the last count
        self._idle_since: float | None = None

    def age(self) -> float:
        return self.clock() - self.counted_at

    def counted(self, res: Round) -> None:
        """A round's count (it ran after the round's writes)."""
        assert res.count is not None
        self.ready, self.delayed, self.inflight, self.found = res.count
        self.others_busy, self.stable, self.stale = res.others_busy, res.stable, False
        self.counted_at = self.clock()

    def wrote(self) -> None:
        """Pushes or hand-backs reached Redis after the last count: a zero from it no longer holds."""
        self.stale = True

    def remaining(self, held: int, buffered: int) -> int | None:
        """Requests left in the whole crawl (plus busy workers), or None when a zero is not sure.

        This worker's own leases are left out (*held*: Scrapy counts them as in progress), so a
        leaked lease cannot keep it open for ever; *buffered*: its writes not in Redis yet.
        """
        total = max(0, self.ready + self.delayed + self.inflight - held) + self.others_busy + buffered
        if total == 0 and (self.stale or not self.stable):
            return None
        return total

    def pending(self, held: int, buffered: int, *, background: bool) -> tuple[int, bool]:
        """(the scheduler's pending count, whether to count again now)."""
        total = self.remaining(held, buffered)
        if total is None or (total == 0 and background and self.age() > _FRESH_ZERO):
            return 1, True  # not sure yet: ask again in a moment rather than close
        if total:
            self._idle_since = None
            return total, False
        now = self.clock()
        if self._idle_since is None:
            self._idle_since = now
        return (1 if now - self._idle_since < self.idle_before_close else 0), False

    def progress(self, buffered_pushes: int, domains: dict[str, int]) -> Progress:
        """The whole crawl's progress figures (*domains*: this worker's pending per domain)."""
        queued = self.ready + buffered_pushes
        discovered = max(self.found + buffered_pushes, queued + self.delayed + self.inflight)
        return Progress(discovered, queued, self.delayed, self.inflight, domains)
