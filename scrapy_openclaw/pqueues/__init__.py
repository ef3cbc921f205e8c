"""DeadlinePriorityQueue: Scrapy's priority queue, plus deadlines, not-before times and domain health.

Scrapy's scheduler builds it like ``DownloaderAwarePriorityQueue`` (the add-on
sets ``SCHEDULER_PRIORITY_QUEUE``), once for memory and, with ``JOBDIR``, once
for disk. A pop takes the most urgent request among the domains that may send
now, in O(log domains), so a held or throttled domain never blocks the others
(docs/deadline-queue.md). The queue composes parts that each own their state:
:class:`~.domains.DomainStore` (the requests and the index),
:class:`~.downloads.Downloads`, :class:`~.readiness.Readiness`,
:class:`~.deadlines.Deadlines`, :class:`~.notbefore.Delays` (and the one timer),
:class:`~.upkeep.IdleSweep`; :mod:`.jobdir` reads and writes the JOBDIR file.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from scrapy import signals

from scrapy_openclaw.delay import not_before
from scrapy_openclaw.health.reader import health_registry
from scrapy_openclaw.policy import PolicySet
from scrapy_openclaw.pqueues import jobdir
from scrapy_openclaw.pqueues.deadlines import Deadlines
from scrapy_openclaw.pqueues.domains import DomainStore
from scrapy_openclaw.pqueues.downloads import Downloads
from scrapy_openclaw.pqueues.notbefore import _MIN_TIMER, Delays
from scrapy_openclaw.pqueues.readiness import _FULL, _RETRY_POLL, Readiness
from scrapy_openclaw.pqueues.upkeep import EVICT_EVERY, IdleSweep
from scrapy_openclaw.runtime import shared
from scrapy_openclaw.scrapy_internals import slot_key
from scrapy_openclaw.settings import OpenClawSettings

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from typing_extensions import Self

    from scrapy_openclaw.pqueues.heaps import DomainQueue

__all__ = ["EVICT_EVERY", "_FULL", "_MIN_TIMER", "_RETRY_POLL", "DeadlinePriorityQueue", "queue_state"]


def _is_lifo(queue_cls: type | None, default: bool) -> bool:
    """Scrapy's downstream queue class decides LIFO/FIFO within one priority."""
    if queue_cls is None:
        return default
    for klass in getattr(queue_cls, "__mro__", (queue_cls,)):
        name = klass.__name__.lower()
        if "lifo" in name:
            return True
        if "fifo" in name:
            return False
    return default


class DeadlinePriorityQueue:
    """Deadline-, delay- and health-aware ``SCHEDULER_PRIORITY_QUEUE`` (see the module docstring)."""

    #: delay.py checks this: we keep not-before requests ourselves.
    handles_not_before = True

    @classmethod
    def from_crawler(
        cls,
        crawler: Crawler,
        downstream_queue_cls: type,
        key: str,
        startprios: Any = None,
        *,
        start_queue_cls: type | None = None,
    ) -> Self:
        return cls(crawler, downstream_queue_cls, key, startprios, start_queue_cls=start_queue_cls)

    def __init__(
        self,
        crawler: Crawler,
        downstream_queue_cls: type,
        key: str,
        startprios: Any = None,
        *,
        start_queue_cls: type | None = None,
    ):
        self.crawler = crawler
        self.stats = crawler.stats
        self.key = key  # non-empty: the JOBDIR disk queue
        self.downstream_queue_cls = downstream_queue_cls
        self._separate_start = start_queue_cls is not None  # Scrapy >= 2.13 orders start requests apart
        lifo = _is_lifo(downstream_queue_cls, default=True)
        self._clock = time.time  # replaceable in tests
        self.policies = PolicySet.for_crawler(crawler)
        self.registry = health_registry(crawler)
        self.store = DomainStore(
            self.policies,
            boost=OpenClawSettings.for_crawler(crawler).queue_aging_boost,
            lifo=lifo,
            start_lifo=_is_lifo(start_queue_cls, default=lifo) if start_queue_cls else lifo,
        )
        self.downloads = Downloads(crawler)
        self.readiness = Readiness(self.registry, self.downloads, self.store)
        self.deadlines = Deadlines(crawler, self.policies)
        self.delays = Delays(crawler, clock=self._now, release=self._enqueue)
        self.idle_sweep = IdleSweep(crawler, self.registry, self.downloads)
        queues: list[DeadlinePriorityQueue] = shared(crawler, "queues", list)
        queues.append(self)
        # (Scrapy's scheduler closes only the disk queue: the figures at close come from here)
        crawler.signals.connect(self._report_memory, signal=signals.spider_closed)
        if startprios:
            jobdir.restore(
                key, startprios, crawler, push=self.push, reader=f"{type(self).__module__}.{type(self).__name__}"
            )

    # --- the Scrapy queue interface ------------------------------------------

    def __len__(self) -> int:
        return len(self.store) + len(self.delays)

    def push(self, request: Request) -> None:
        now = self._now()
        domain = slot_key(self.crawler, request)
        self.deadlines.apply_default(request, domain, now)
        if self.key:  # disk queue: only what can be stored as data (ValueError -> memory)
            jobdir.check_storable(request, self.crawler)
        due = not_before(request, self.stats, now=now)
        if due > now:
            self.delays.hold(request, due)
        else:
            self._enqueue(request, domain)
        self.stats.inc_value("openclaw/queue/pushed")

    def pop(self) -> Request | None:
        choice = self._choose(self._now(), acquire=True)
        if choice is None:
            return None
        dq, where = choice
        request = self.store.take(dq, where)
        self.downloads.handed_out(dq.domain, request)
        self._taken(dq)
        self.stats.inc_value("openclaw/queue/popped")
        return request

    def peek(self) -> Request | None:
        """The request :meth:`pop` would return now (no token is taken)."""
        choice = self._choose(self._now(), acquire=False)
        if choice is None:
            return None
        dq, where = choice
        return dq.take(where, remove=False)

    def close(self) -> dict[str, Any]:
        """Stop the timer; in disk mode persist everything pending and return its state."""
        self.delays.close()
        queues: list[DeadlinePriorityQueue] = shared(self.crawler, "queues", list)
        if self in queues:
            queues.remove(self)
        self._report_memory()
        pending = [*self.store.requests(), *(request for _due, request in self.delays.held(in_order=True))]
        # what was left, per domain, for the progress at close (read after this queue is gone)
        left: Counter[str] = shared(self.crawler, "left_at_close", Counter)
        left.update(slot_key(self.crawler, request) for request in pending)
        if not self.key:
            return {}
        return jobdir.persist(self.key, pending, self.crawler)

    # --- readable state -------------------------------------------------------

    def queue_state(self) -> dict[str, Any]:
        """Counts for metrics: ready (in domain queues), delayed, expired so far, per domain."""
        return {
            "ready": len(self.store),
            "delayed": len(self.delays),
            "expired": self.deadlines.expired_total,
            "domains": {name: dq.count for name, dq in self.store.queues.items()},
        }

    def delayed_requests(self) -> list[tuple[float, Request]]:
        """The requests waiting for their not-before time, with it (a copy, unordered)."""
        return self.delays.held()

    def pending_domains(self) -> set[str]:
        """The domains with a request here, ready or delayed."""
        domains = set(self.store.queues)
        domains.update(slot_key(self.crawler, request) for _due, request in self.delays.held())
        return domains

    def overhead_bytes(self, sample: int = 50) -> float:
        """An estimate (``sys.getsizeof``) of the queue's own structures, not of the requests."""
        if not self.store.queues:
            return 0.0
        return self.store.overhead_bytes(sample) + self.deadlines.overhead_bytes()

    # --- the parts at work ----------------------------------------------------

    def _now(self) -> float:
        return self._clock()

    def _enqueue(self, request: Request, domain: str | None = None) -> None:
        dq = self.store.queue_for(slot_key(self.crawler, request) if domain is None else domain)
        start = self._separate_start and bool(request.meta.get("is_start_request"))
        self.store.add(dq, request, start=start, timed=self.deadlines.track(request, dq))

    def _taken(self, dq: DomainQueue) -> None:
        if self.store.taken(dq):
            self.readiness.forget(dq)

    def _expire(self, now: float) -> None:
        """Apply the expired policy to every deadline that has passed, in deadline order."""
        for entry in self.deadlines.passed(now):
            dq = entry.owner
            if dq.expired_mode == "drop":
                dq.discard(entry)
                self._taken(dq)
                self.deadlines.dead_letter(entry.request)
            else:
                dq.boost_expired(entry)
                self.store.rekey(dq)
                self.stats.inc_value("openclaw/queue/expired/boosted")

    def _choose(self, now: float, *, acquire: bool) -> tuple[DomainQueue, str] | None:
        """The domain and index to take from: best effective priority among ready domains.

        Ties go to the domain with the fewest active downloads (as Scrapy's
        default ``DownloaderAwarePriorityQueue`` orders slots), then round-robin.
        """
        self.delays.release_due(now)
        if self.deadlines.any_passed(now):
            self._expire(now)
        if not self.store.queues:
            return None
        self.readiness.wake(now)
        if self.idle_sweep.due(now):
            self.idle_sweep.run(now)
            self._report_memory()
        skipped = False
        while True:
            picked = self.store.index.pick(now, self.downloads.busy)
            if picked is None:
                break
            dq, where = picked
            ok, at = self.readiness.check(dq.domain, now, acquire)
            if ok:
                if skipped and acquire:
                    self.stats.inc_value("openclaw/queue/skipped_not_ready")
                return dq, where
            skipped = True
            self.readiness.park(dq, at)
        if acquire:
            self.stats.inc_value("openclaw/queue/none_ready")
            wake_at = self.readiness.next_wake()
            if wake_at < math.inf:
                self.delays.arm(max(wake_at, now + _MIN_TIMER))
        return None

    def _report_memory(self, *args: Any, **kwargs: Any) -> None:
        """Known domains and the estimated bytes per pending request of the queue's own structures,
        and the registry's figures, as stats."""
        self.stats.set_value("openclaw/queue/domains", len(self.store.queues))
        if self.store.count:  # (the last figure with requests pending stays)
            per_request = self.overhead_bytes() / self.store.count
            self.stats.set_value("openclaw/queue/bytes_per_request", round(per_request, 1))
        self.idle_sweep.report()


def queue_state(crawler: Crawler) -> dict[str, Any]:
    """The summed :meth:`DeadlinePriorityQueue.queue_state` of the crawl's queues (memory + disk)."""
    total: dict[str, Any] = {"ready": 0, "delayed": 0, "expired": 0, "domains": {}}
    queues: list[DeadlinePriorityQueue] = shared(crawler, "queues", list)
    for queue in queues:
        state = queue.queue_state()
        for k in ("ready", "delayed", "expired"):
            total[k] += state[k]
        for domain, n in state["domains"].items():
            total["domains"][domain] = total["domains"].get(domain, 0) + n
    return total
