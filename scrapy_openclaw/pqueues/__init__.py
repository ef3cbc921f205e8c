"""DeadlinePriorityQueue: Scrapy's priority queue, plus deadlines, delays and domain health.

Set ``SCHEDULER_PRIORITY_QUEUE = "scrapy_openclaw.pqueues.DeadlinePriorityQueue"``
(the add-on does). Scrapy's own scheduler builds it like
``DownloaderAwarePriorityQueue``, once for memory and, with ``JOBDIR``, once
for disk. What it adds:

* **Deadlines.** ``meta["openclaw_deadline"]`` (UNIX time; a default from the
  domain's policy, ``deadline.default`` or ``deadline.classes`` by
  ``meta["openclaw_request_class"]``, is written into meta on first
  scheduling) makes a request gain ``OPENCLAW_QUEUE_AGING_BOOST`` priority
  points over the policy's ``aging_window`` before it, so old low-priority
  work overtakes newer high-priority work by its deadline. Past the deadline
  the policy's ``expired`` applies: ``"boost"`` (to the front) or ``"drop"``
  (dead letter, reason ``deadline_expired``). See :mod:`scrapy_openclaw._heaps`
  for why this stays O(log n).
* **Not-before.** A request with a future ``meta["openclaw_not_before"]``
  (retry backoff, Retry-After) waits in a timer heap and still counts in
  ``len()``, so the spider stays open. One reactor timer for the earliest due
  time wakes the engine then, instead of at its 5 s heartbeat.
* **Domain-aware pop.** Requests are kept per download slot. A pop considers
  only domains that can send now (fewer active downloads than the domain's
  concurrency; with the HealthRegistry, also ``ready_at <= now`` and a token
  from ``try_acquire``) and takes the best effective priority among them
  (ties: the fewest active downloads, then round-robin: the domain served or
  first queued longest ago). A held or throttled domain never blocks the
  others; when no domain can send, pop returns None and the timer is armed
  for the earliest ``ready_at``. The pick is O(log domains): domains sit in
  a :class:`~scrapy_openclaw._heaps.DomainIndex`; one found not ready is
  parked, until its ``ready_at`` (a heap) or, with a full slot, until the
  slot has room (looked at on each pop: at most one such domain per active
  download); an operator override or a health restore
  (``HealthRegistry.readiness_epoch``) wakes every parked domain.
* **Idle domains.** Every minute (or a quarter of
  ``OPENCLAW_HEALTH_IDLE_TTL``) the queue lets the HealthRegistry forget
  idle domains, keeping those with requests here or downloads in flight, and
  sets ``openclaw/health/{domains,evicted,bytes_per_domain}`` and
  ``openclaw/queue/{domains,bytes_per_request}`` (estimates).
* **JOBDIR.** With a non-empty ``key`` the queue is the disk queue: ``push``
  raises ``ValueError`` for a request that cannot be stored as data (as
  Scrapy's disk queues do, so the scheduler keeps it in memory), and
  ``close`` writes the pending requests as JSON (atomically) under ``key``
  and returns the state the scheduler keeps in ``active.json``.

The queue is one class built from parts, one job each: :mod:`.domains` (the
per-domain store and the state all parts share), :mod:`.readiness`,
:mod:`.deadlines`, :mod:`.delays` (not-before and the timer), :mod:`.upkeep`
(idle domains, memory figures) and :mod:`.jobdir`.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from typing import TYPE_CHECKING, Any

from scrapy import signals

from scrapy_openclaw._heaps import DomainIndex, DomainQueue
from scrapy_openclaw.delay import not_before
from scrapy_openclaw.health.reader import health_registry
from scrapy_openclaw.policy import PolicySet
from scrapy_openclaw.pqueues.deadlines import Deadlines
from scrapy_openclaw.pqueues.delays import _MIN_TIMER, NotBefore
from scrapy_openclaw.pqueues.domains import HandedOut
from scrapy_openclaw.pqueues.jobdir import JobdirPersistence
from scrapy_openclaw.pqueues.readiness import _FULL, _RETRY_POLL, DomainReadiness
from scrapy_openclaw.pqueues.upkeep import EVICT_EVERY, Upkeep
from scrapy_openclaw.runtime import shared
from scrapy_openclaw.settings import OpenClawSettings

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from typing_extensions import Self

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


class DeadlinePriorityQueue(DomainReadiness, Deadlines, NotBefore, Upkeep, JobdirPersistence):
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
        self.key = key
        self.downstream_queue_cls = downstream_queue_cls
        self._start_queue_cls = start_queue_cls
        self._lifo = _is_lifo(downstream_queue_cls, default=True)
        self._start_lifo = _is_lifo(start_queue_cls, default=self._lifo) if start_queue_cls else self._lifo
        self._boost = OpenClawSettings.for_crawler(crawler).queue_aging_boost
        self.policies = PolicySet.for_crawler(crawler)
        self.registry = health_registry(crawler)
        self._clock = time.time  # replaceable in tests
        self._downloader_obj = None
        self._seq = itertools.count()
        self._rr = itertools.count(1)
        self._domains = {}
        self._index = DomainIndex()  # domains that may send, by urgency
        self._waiting = []  # parked until ready_at
        self._full = {}  # parked while their slot is full
        self._epoch = self._readiness_epoch()
        self._next_sweep = 0.0
        self._expiry = []  # every deadline entry, by deadline
        self._delayed = []  # not-before heap
        self._count = 0  # requests in self._domains (delayed ones not included)
        self._expired_total = 0
        self._timer = None
        self._timer_due = math.inf
        self._closed = False
        # By domain: popped, not yet in their download slot (see _in_flight). Crawl-wide: with
        # JOBDIR, Scrapy's scheduler has two of these queues (memory and disk) feeding one slot.
        self._handed = shared(crawler, "queue_handed_out", HandedOut)
        queues: list[DeadlinePriorityQueue] = shared(crawler, "queues", list)
        queues.append(self)
        # (Scrapy's scheduler closes only the disk queue: the figures at close come from here)
        crawler.signals.connect(self._report_memory, signal=signals.spider_closed)
        if startprios:
            self._restore(startprios)

    # --- the Scrapy queue interface ------------------------------------------

    def __len__(self) -> int:
        return self._count + len(self._delayed)

    def push(self, request: Request) -> None:
        domain = self._domain_of(request)
        now = self._clock()
        self._apply_default_deadline(request, domain, now)
        if self.key:  # disk queue: only what can be stored as data (ValueError -> memory)
            self._check_storable(request)
        due = not_before(request, self.stats, now=now)
        if due > now:
            heapq.heappush(self._delayed, (due, next(self._seq), request))
            self.stats.inc_value("openclaw/queue/delayed")
            self._arm(due)
        else:
            self._enqueue(request, domain)
        self.stats.inc_value("openclaw/queue/pushed")

    def pop(self) -> Request | None:
        choice = self._choose(self._clock(), acquire=True)
        if choice is None:
            return None
        dq, where = choice
        request = dq.take(where)
        dq.rank = next(self._rr)
        self._note_handed(dq.domain, request)
        self._after_take(dq)
        self.stats.inc_value("openclaw/queue/popped")
        return request

    def peek(self) -> Request | None:
        """The request :meth:`pop` would return now (no token is taken)."""
        choice = self._choose(self._clock(), acquire=False)
        if choice is None:
            return None
        dq, where = choice
        return dq.take(where, remove=False)

    def close(self) -> dict[str, Any]:
        """Stop the timer; in disk mode persist everything pending and return its state."""
        self._closed = True
        self._cancel_timer()

        queues: list[DeadlinePriorityQueue] = shared(self.crawler, "queues", list)
        if self in queues:
            queues.remove(self)
        self._report_memory()
        if not self.key:
            return {}
        return self._persist()

    # --- readable state -------------------------------------------------------

    def queue_state(self) -> dict[str, Any]:
        """Counts for metrics: ready (in domain queues), delayed, expired so far, per domain."""
        return {
            "ready": self._count,
            "delayed": len(self._delayed),
            "expired": self._expired_total,
            "domains": {name: dq.count for name, dq in self._domains.items()},
        }

    def delayed_requests(self) -> list[tuple[float, Request]]:
        """The requests waiting for their not-before time, with it (a copy, unordered)."""
        return [(due, request) for due, _seq, request in self._delayed]

    def _choose(self, now: float, *, acquire: bool) -> tuple[DomainQueue, str] | None:
        """The domain and index to take from: best effective priority among ready domains.

        Ties go to the domain with the fewest active downloads (as Scrapy's
        default ``DownloaderAwarePriorityQueue`` orders slots), then round-robin.
        """
        self._release_due(now)
        self._sweep_expired(now)
        if not self._domains:
            return None
        self._wake(now)
        if now >= self._next_sweep:
            self._sweep_idle(now)
        skipped = False
        while True:
            picked = self._index.pick(now, self._busy)
            if picked is None:
                break
            dq, where = picked
            ok, at = self._ready(dq.domain, now, acquire)
            if ok:
                if skipped and acquire:
                    self.stats.inc_value("openclaw/queue/skipped_not_ready")
                return dq, where
            skipped = True
            self._park(dq, at)
        if acquire:
            self.stats.inc_value("openclaw/queue/none_ready")
            while self._waiting and self._waiting[0][2].parked is not self._waiting[0]:
                heapq.heappop(self._waiting)
            if self._waiting:
                self._arm(max(self._waiting[0][0], now + _MIN_TIMER))
        return None


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
