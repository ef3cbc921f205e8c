"""Which domains may send now: parking the ones that cannot, and waking them when they can.

A domain found not ready leaves the index until its ``ready_at`` (a heap) or,
with a full download slot, until the slot has room; an operator override or a
health restore (``HealthRegistry.readiness_epoch``) wakes every parked domain.
"""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING, Any

from scrapy_openclaw.pqueues.domains import DomainQueues
from scrapy_openclaw.scrapy_internals import new_slot_concurrency

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
        if downloader is not None and not self._has_room(downloader, domain):
            return False, math.inf
        if registry is None:
            return True, math.inf
        at = registry.ready_at(domain, now)
        if at > now:
            return False, at
        if acquire and not registry.try_acquire(domain, now):
            return False, now + _RETRY_POLL
        return True, math.inf

    def _has_room(self, downloader: Any, domain: str) -> bool:
        """Fewer downloads of *domain* under way than its slot's concurrency (which the health
        middleware keeps scaled by the domain's health; before the slot exists, the one Scrapy
        will give it: several requests may be handed out before the first reaches the slot)."""
        slot = downloader.slots.get(domain)
        concurrency = slot.concurrency if slot is not None else new_slot_concurrency(downloader, domain)
        return self._in_flight(domain, slot) < concurrency

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
            for name, dq in list(self._full.items()):
                if downloader is None or self._has_room(downloader, name):
                    del self._full[name]
                    self._unpark(dq)

    def _readiness_epoch(self) -> int:
        return getattr(self.registry, "readiness_epoch", 0) if self.registry is not None else 0
