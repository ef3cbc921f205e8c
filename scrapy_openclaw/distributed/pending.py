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
#: seconds an idle worker goes between two full counts while another worker is busy: in between it
#: only looks at the workers (who is busy, who died), as it cannot close anyway and pushes wake it
RECOUNT_EVERY = 30.0


class CrawlWork:
    """The crawl's remaining work from the last counting round; *idle_before_close*: seconds a
    worker stays open with nothing to do anywhere (scrapy-redis's ``SCHEDULER_IDLE_BEFORE_CLOSE``)."""

    def __init__(self, clock: Callable[[], float], idle_before_close: float = 0.0):
        self.clock = clock
        self.idle_before_close = idle_before_close
        self.ready = self.delayed = self.inflight = self.found = 0
        self.others_busy = 0
        self.counted_at = -1e18  # the last full count
        self.asked_at = -1e18  # the last full count or look at the workers
        self.stable = False
        self.stale = True  # this worker's writes reached Redis after the last count
        self._idle_since: float | None = None

    def age(self) -> float:
        """Seconds since the last full count."""
        return self.clock() - self.counted_at

    def asked_age(self) -> float:
        """Seconds since the last full count or look at the workers."""
        return self.clock() - self.asked_at

    def recount(self) -> None:
        """Count again at the next look at the pending count (a worker turned idle)."""
        self.counted_at = self.asked_at = -1e18

    def over_but_here(self) -> bool:
        """Whether the last count found nothing left in Redis and no other worker busy."""
        return not (self.others_busy or self.ready or self.delayed or self.inflight)

    def look_suffices(self) -> bool:
        """Whether a look at the workers will do instead of counting every shard: another worker
        is busy (so the crawl is not over) and the last full count is recent enough."""
        return self.others_busy > 0 and self.age() < RECOUNT_EVERY

    def counted(self, res: Round) -> None:
        """A round's count (it ran after the round's writes)."""
        assert res.count is not None
        self.ready, self.delayed, self.inflight, self.found = res.count
        self.others_busy, self.stable, self.stale = res.others_busy, res.stable, False
        self.counted_at = self.asked_at = self.clock()

    def looked(self, res: Round) -> None:
        """A round's look at the workers only; when nobody else is busy the crawl may be over: a
        full count follows at once."""
        self.others_busy = res.others_busy
        self.asked_at = self.clock()
        if not self.others_busy:
            self.recount()

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
