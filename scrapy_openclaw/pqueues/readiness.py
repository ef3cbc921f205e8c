"""Which domains may send now: parking the ones that cannot, and waking them when they can.

A domain found not ready leaves the index until its ``ready_at`` (a heap) or,
with a full download slot, until the slot has room; an operator override or a
health restore (``HealthRegistry.readiness_epoch``) wakes every parked domain.
"""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING

from scrapy_openclaw.pqueues.domains import DomainQueues

if TYPE_CHECKING:
    from scrapy_openclaw._heaps import DomainQueue

#: When a domain's ``ready_at`` has passed but ``try_acquire`` still says no
#: (e.g. another worker took the half-open probe), look again this much later.
_RETRY_POLL = 0.05
#: DomainQueue.parked for a domain whose download slot is full (waiting for a download to leave).
_FULL = "full"


class DomainReadiness(DomainQueues):
    """Part of DeadlinePriorityQueue: whether a domain may send now, and parking those that may not."""

    def _ready(self, domain: str, now: float, acquire: bool) -> tuple[bool, float]:
        """Whether *domain* may send now; if not, when to look again (inf: a finished download will wake us)."""
        registry = self.registry
        if registry is not None and registry.given_up(domain, now):
            return True, math.inf  # out it goes, to become a dead letter in the health middleware
        downloader = self._downloader()
        slot = downloader.slots.get(domain) if downloader is not None else None
        # (the health middleware keeps slot.concurrency scaled by the domain's health)
        if slot is not None and len(slot.active) >= slot.concurrency:
            return False, math.inf
        if registry is None:
            return True, math.inf
        at = registry.ready_at(domain, now)
        if at > now:
            return False, at
        if acquire and not registry.try_acquire(domain, now):
            return False, now + _RETRY_POLL
        return True, math.inf

    def _park(self, dq: DomainQueue, at: float) -> None:
        """Keep a domain that cannot send out of the index until *at* (inf: until its slot frees)."""
        self._index.unkey(dq)
        if at == math.inf:
            dq.parked = _FULL
            self._full[dq.domain] = dq
        else:
            dq.parked = (at, next(self._seq), dq)
            heapq.heappush(self._waiting, dq.parked)

    def _unpark(self, dq: DomainQueue) -> None:
        dq.parked = None
        self._rekey(dq)

    def _wake(self, now: float) -> None:
        """Index again the parked domains that may be ready now (see the module docstring)."""
        epoch = self._readiness_epoch()
        if epoch != self._epoch:  # readiness may have come sooner than any domain said: wake them all
            self._epoch = epoch
            waiting, self._waiting = self._waiting, []
            for entry in waiting:
                if entry[2].parked is entry:
                    self._unpark(entry[2])
        while self._waiting and self._waiting[0][0] <= now:
            entry = heapq.heappop(self._waiting)
            if entry[2].parked is entry:
                self._unpark(entry[2])
        if self._full:  # (at most one per active download) a download left, or the slot grew
            downloader = self._downloader()
            slots = downloader.slots if downloader is not None else {}
            for name, dq in list(self._full.items()):
                slot = slots.get(name)
                if slot is None or len(slot.active) < slot.concurrency:
                    del self._full[name]
                    self._unpark(dq)

    def _readiness_epoch(self) -> int:
        return getattr(self.registry, "readiness_epoch", 0) if self.registry is not None else 0
