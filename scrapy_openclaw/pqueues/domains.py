"""The queue's request store: one :class:`~scrapy_openclaw.pqueues.heaps.DomainQueue` per download slot, indexed by urgency."""

from __future__ import annotations

import itertools
import sys
from typing import TYPE_CHECKING

from scrapy_openclaw.pqueues.heaps import DomainIndex, DomainQueue, Timed

if TYPE_CHECKING:
    from collections.abc import Iterator

    from scrapy import Request

    from scrapy_openclaw.policy import PolicySet


class DomainStore:
    """The pending requests by domain, and the index of the domains that may send, most urgent first.

    A domain another part has parked (``dq.parked``) keeps its requests here
    but leaves the index until that part re-keys it.
    """

    def __init__(self, policies: PolicySet, *, boost: float, lifo: bool, start_lifo: bool):
        self.policies = policies
        self.boost = boost
        self.lifo = lifo
        self.start_lifo = start_lifo
        self.queues: dict[str, DomainQueue] = {}
        self.index = DomainIndex()
        self.count = 0  # requests in self.queues
        self._rr = itertools.count(1)  # round-robin ranks: lower is served sooner

    def __len__(self) -> int:
        return self.count

    def queue_for(self, domain: str) -> DomainQueue:
        """*domain*'s queue, made on its first request with its policy's aging and expiry."""
        dq = self.queues.get(domain)
        if dq is None:
            policy = self.policies.for_domain(domain).deadline
            dq = self.queues[domain] = DomainQueue(
                domain,
                window=policy.aging_window,
                boost=self.boost,
                expired_mode=policy.expired,
                lifo=self.lifo,
                start_lifo=self.start_lifo,
            )
            dq.rank = next(self._rr)
        return dq

    def add(self, dq: DomainQueue, request: Request, *, start: bool, timed: Timed | None) -> None:
        dq.push(request, start=start, timed=timed)
        self.count += 1
        self.rekey(dq)

    def take(self, dq: DomainQueue, where: str) -> Request:
        """Remove and return *dq*'s top request from *where*; the domain goes to the back of the round."""
        request = dq.take(where)
        dq.rank = next(self._rr)
        return request

    def taken(self, dq: DomainQueue) -> bool:
        """Account for a request that left *dq*; True if that emptied the domain, which is forgotten."""
        self.count -= 1
        if dq.count <= 0 and self.queues.get(dq.domain) is dq:
            del self.queues[dq.domain]
            self.index.unkey(dq)
            dq.parked = None  # (an entry of it in a parking heap dies where it lies)
            return True
        self.rekey(dq, force=True)
        return False

    def rekey(self, dq: DomainQueue, *, force: bool = False) -> None:
        """Index *dq* under its current top requests (a parked domain is indexed when it wakes)."""
        if dq.parked is None and dq.count > 0:
            self.index.key(dq, force=force)

    def requests(self) -> Iterator[Request]:
        for dq in self.queues.values():
            yield from dq.requests()

    def overhead_bytes(self, sample: int = 50) -> float:
        """An estimate (``sys.getsizeof``) of the per-domain queues, from a sample, and of the index."""
        if not self.queues:
            return 0.0
        per_domain, n = 0, 0
        for dq in itertools.islice(self.queues.values(), sample):
            n += 1
            per_domain += sys.getsizeof(dq) + sys.getsizeof(dq.buckets) + sys.getsizeof(dq.prios)
            per_domain += sum(sys.getsizeof(b) for b in dq.buckets.values()) + sys.getsizeof(dq.aging)
            per_domain += sys.getsizeof(dq.entries) if dq.entries is not None else 0
        entry_bytes = 0
        if self.index.buckets:
            entry_bytes = sys.getsizeof(self.index.buckets[0]) + 8  # a tuple and its heap slot
        return per_domain / n * len(self.queues) + self.index.entries_total() * entry_bytes
