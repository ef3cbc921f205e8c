"""The per-domain request store of :class:`~scrapy_openclaw.pqueues.DeadlinePriorityQueue`: requests in, requests out.

The base of the queue's parts: it declares the state they share (built in
``DeadlinePriorityQueue.__init__``) and keeps one :class:`~scrapy_openclaw._heaps.DomainQueue`
per download slot, indexed by urgency, so every part reads the same store.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from scrapy_openclaw._heaps import DomainIndex, DomainQueue, Timed
from scrapy_openclaw.scrapy_internals import engine_of, slot_key

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler

    from scrapy_openclaw.health.reader import HealthReader
    from scrapy_openclaw.policy import PolicySet


class HandedOut:
    """Requests popped from a queue and not yet in their download slot, by domain: one per
    crawl (with ``JOBDIR`` Scrapy's memory and disk queues feed the same slots), with the
    size at which the domains nobody looks at again are swept."""

    __slots__ = ("by_domain", "prune_at")

    def __init__(self) -> None:
        self.by_domain: dict[str, set[Request]] = {}
        self.prune_at = 64


class DomainQueues:
    """The queue's shared state and its per-domain store (see the module docstring)."""

    crawler: Crawler
    stats: Any
    key: str
    downstream_queue_cls: type
    policies: PolicySet
    registry: HealthReader | None
    _start_queue_cls: type | None
    _lifo: bool
    _start_lifo: bool
    _boost: float
    _clock: Callable[[], float]
    _downloader_obj: Any | None
    _seq: itertools.count[int]
    _rr: itertools.count[int]
    _domains: dict[str, DomainQueue]
    _index: DomainIndex
    _waiting: list[tuple[float, int, DomainQueue]]
    _full: dict[str, DomainQueue]
    _epoch: int
    _next_sweep: float
    _expiry: list[tuple[float, int, Timed]]
    _delayed: list[tuple[float, int, Request]]
    _count: int
    _expired_total: int
    _timer: Any
    _timer_due: float
    _closed: bool
    _handed: HandedOut

    if TYPE_CHECKING:  # implemented by DeadlinePriorityQueue

        def push(self, request: Request) -> None: ...

        def _deadline(self, request: Request) -> float | None: ...

    def _downloader(self) -> Any | None:
        """The engine's downloader (None before the crawl starts, e.g. in unit tests)."""
        if self._downloader_obj is None:
            self._downloader_obj = getattr(engine_of(self.crawler), "downloader", None)
        return self._downloader_obj

    def _domain_of(self, request: Request) -> str:
        return slot_key(self.crawler, request)

    def _enqueue(self, request: Request, domain: str) -> None:
        dq = self._domains.get(domain)
        if dq is None:
            policy = self.policies.for_domain(domain).deadline
            dq = self._domains[domain] = DomainQueue(
                domain,
                window=policy.aging_window,
                boost=self._boost,
                expired_mode=policy.expired,
                lifo=self._lifo,
                start_lifo=self._start_lifo,
            )
            dq.rank = next(self._rr)
        start = self._start_queue_cls is not None and bool(request.meta.get("is_start_request"))
        deadline = self._deadline(request)
        if deadline is None:
            dq.push(request, start=start)
        else:
            seq = next(self._seq)
            entry = Timed(request, deadline, seq, dq)
            dq.push(request, start=start, timed=entry)
            heapq.heappush(self._expiry, (deadline, seq, entry))
        self._count += 1
        self._rekey(dq)

    def _after_take(self, dq: DomainQueue) -> None:
        self._count -= 1
        if dq.count <= 0 and self._domains.get(dq.domain) is dq:
            del self._domains[dq.domain]
            self._index.unkey(dq)
            self._full.pop(dq.domain, None)
            dq.parked = None  # (a waiting-heap entry of it dies where it lies)
        else:
            self._rekey(dq, force=True)

    def _busy(self, domain: str) -> int:
        downloader = self._downloader()
        return self._in_flight(domain, downloader.slots.get(domain) if downloader is not None else None)

    def _in_flight(self, domain: str, slot: Any | None) -> int:
        """Downloads of *domain* under way: in its download slot, and handed out but still in the
        downloader middlewares (Scrapy puts a request in ``slot.active`` only after them, a loop
        turn later). Without the second, one engine loop could hand one domain every free
        ``CONCURRENT_REQUESTS`` place at once, past the slot's concurrency; each download past the
        connection pool's ``CONCURRENT_REQUESTS_PER_DOMAIN`` then opens a new TCP connection."""
        busy = len(slot.active) if slot is not None else 0
        handed = self._handed.by_domain.get(domain)
        if handed:
            self._prune_handed(domain, handed, slot)
            busy += len(handed)
        return busy

    def _note_handed(self, domain: str, request: Request) -> None:
        """Remember a request just popped until it reaches its download slot (or leaves the downloader)."""
        by_domain = self._handed.by_domain
        by_domain.setdefault(domain, set()).add(request)
        if len(by_domain) > self._handed.prune_at:  # (domains never looked at again: amortised O(1))
            downloader = self._downloader()
            for name, handed in list(by_domain.items()):
                self._prune_handed(name, handed, downloader.slots.get(name) if downloader is not None else None)
            self._handed.prune_at = max(64, 2 * len(by_domain))

    def _prune_handed(self, domain: str, handed: set[Request], slot: Any | None) -> None:
        downloader = self._downloader()
        in_downloader = downloader.active if downloader is not None else ()
        in_slot = slot.active if slot is not None else ()
        gone = [r for r in handed if r not in in_downloader or r in in_slot]
        handed.difference_update(gone)
        if not handed:
            del self._handed.by_domain[domain]

    def _rekey(self, dq: DomainQueue, *, force: bool = False) -> None:
        """Index *dq* under its current top requests (a parked domain is indexed when it wakes)."""
        if dq.parked is None and dq.count > 0:
            self._index.key(dq, force=force)
