"""Which domains may send now: parking the ones that cannot, and waking them when they can.

A domain found not ready leaves the store's index until its ``ready_at`` (a
heap) or, with a full download slot, until the slot has room; an operator
override or a health restore (``HealthRegistry.readiness_epoch``) wakes every
parked domain.
"""

from __future__ import annotations

import heapq
import itertools
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scrapy_openclaw.health.reader import HealthReader
    from scrapy_openclaw.pqueues.domains import DomainStore
    from scrapy_openclaw.pqueues.downloads import Downloads
    from scrapy_openclaw.pqueues.heaps import DomainQueue

#: When a domain's ``ready_at`` has passed but ``try_acquire`` still says no
#: (e.g. another worker took the half-open probe), look again this much later.
_RETRY_POLL = 0.05
#: DomainQueue.parked for a domain whose download slot is full (waiting for a download to leave).
_FULL = "full"


class Readiness:
    """Whether a domain may send now (health, pacing token, slot room), and the domains parked until they may."""

    def __init__(self, registry: HealthReader | None, downloads: Downloads, store: DomainStore):
        self.registry = registry
        self.downloads = downloads
        self.store = store
        self.full: dict[str, DomainQueue] = {}  # parked while their slot is full
        self._waiting: list[tuple[float, int, DomainQueue]] = []  # parked until ready_at
        self._seq = itertools.count()
        self._epoch = self._readiness_epoch()

    def check(self, domain: str, now: float, acquire: bool) -> tuple[bool, float]:
        """Whether *domain* may send now; if not, when to look again (inf: a finished download will wake us)."""
        registry = self.registry
        if registry is not None and registry.given_up(domain, now):
            return True, math.inf  # out it goes, to become a dead letter in the health middleware
        if not self.downloads.has_room(domain):
            return False, math.inf
        if registry is None:
            return True, math.inf
        at = registry.ready_at(domain, now)
        if at > now:
            return False, at
        if acquire and not registry.try_acquire(domain, now):
            return False, now + _RETRY_POLL
        return True, math.inf

    def park(self, dq: DomainQueue, at: float) -> None:
        """Keep a domain that cannot send out of the index until *at* (inf: until its slot frees)."""
        self.store.index.unkey(dq)
        if at == math.inf:
            dq.parked = _FULL
            self.full[dq.domain] = dq
        else:
            dq.parked = (at, next(self._seq), dq)
            heapq.heappush(self._waiting, dq.parked)

    def forget(self, dq: DomainQueue) -> None:
        """*dq* left the store (no requests left)."""
        if self.full.get(dq.domain) is dq:
            del self.full[dq.domain]

    def wake(self, now: float) -> None:
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
        for name, dq in list(self.full.items()):  # (at most one per active download) a download left, or the slot grew
            if self.downloads.has_room(name):
                del self.full[name]
                self._unpark(dq)

    def next_wake(self) -> float:
        """The earliest ``ready_at`` of a parked domain (inf: none is waiting for a time)."""
        while self._waiting and self._waiting[0][2].parked is not self._waiting[0]:
            heapq.heappop(self._waiting)
        return self._waiting[0][0] if self._waiting else math.inf

    def _unpark(self, dq: DomainQueue) -> None:
        dq.parked = None
        self.store.rekey(dq)

    def _readiness_epoch(self) -> int:
        return getattr(self.registry, "readiness_epoch", 0) if self.registry is not None else 0
