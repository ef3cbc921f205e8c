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
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import sys
import time
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.utils.asyncio import call_later

from scrapy_openclaw import _queuefile
from scrapy_openclaw import meta as M
from scrapy_openclaw import signals as openclaw_signals
from scrapy_openclaw._heaps import DomainIndex, DomainQueue, Timed
from scrapy_openclaw.deadletter import for_request
from scrapy_openclaw.delay import not_before, request_class
from scrapy_openclaw.health.reader import HealthReader, health_registry
from scrapy_openclaw.policy import PolicySet
from scrapy_openclaw.runtime import crawl_id, shared
from scrapy_openclaw.scrapy_internals import engine_of, slot_key, wake_engine
from scrapy_openclaw.serialization import SerializationError, request_from_data, request_to_data
from scrapy_openclaw.settings import OpenClawSettings

if TYPE_CHECKING:
    from collections.abc import Iterable

    from scrapy import Request
    from scrapy.crawler import Crawler
    from typing_extensions import Self

logger = logging.getLogger(__name__)

#: When a domain's ``ready_at`` has passed but ``try_acquire`` still says no
#: (e.g. another worker took the half-open probe), look again this much later.
_RETRY_POLL = 0.05
#: A timer never fires sooner than this after being armed (no busy loops).
_MIN_TIMER = 0.005
#: Seconds between two sweeps for idle domains in the health registry (as Scrapy's downloader
#: collects idle slots every 60 s; a quarter of OPENCLAW_HEALTH_IDLE_TTL if that is shorter).
_EVICT_EVERY = 60.0
#: DomainQueue.parked for a domain whose download slot is full (waiting for a download to leave).
_FULL = "full"


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
        self.key = key
        self.downstream_queue_cls = downstream_queue_cls
        self._start_queue_cls = start_queue_cls
        self._lifo = _is_lifo(downstream_queue_cls, default=True)
        self._start_lifo = _is_lifo(start_queue_cls, default=self._lifo) if start_queue_cls else self._lifo
        self._boost = OpenClawSettings.for_crawler(crawler).queue_aging_boost
        self.policies = PolicySet.for_crawler(crawler)
        self.registry: HealthReader | None = health_registry(crawler)
        self._clock = time.time  # replaceable in tests
        self._downloader_obj: Any | None = None
        self._seq = itertools.count()
        self._rr = itertools.count(1)
        self._domains: dict[str, DomainQueue] = {}
        self._index = DomainIndex()  # domains that may send, by urgency
        self._waiting: list[tuple[float, int, DomainQueue]] = []  # parked until ready_at
        self._full: dict[str, DomainQueue] = {}  # parked while their slot is full
        self._epoch = self._readiness_epoch()
        self._next_sweep = 0.0
        self._expiry: list[tuple[float, int, Timed]] = []  # every deadline entry, by deadline
        self._delayed: list[tuple[float, int, Request]] = []  # not-before heap
        self._count = 0  # requests in self._domains (delayed ones not included)
        self._expired_total = 0
        self._timer: Any = None
        self._timer_due = math.inf
        self._closed = False
        shared(crawler, "queues", list).append(self)
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

    def _check_storable(self, request: Request) -> None:
        """Raise :class:`SerializationError` (a ValueError) for a request the JOBDIR file cannot hold.

        Scrapy's scheduler then keeps it in its memory queue, as for a request
        its own disk queues cannot pickle: crawled in this run, but lost if the
        crawl is paused. Scrapy says so only with ``SCHEDULER_DEBUG``; we say it
        always, with the URL and the key.
        """
        try:
            request_to_data(request, spider=self.crawler.spider, compact=True)
        except SerializationError as exc:
            logger.error(
                "%(request)s cannot be stored in the JOBDIR queue; Scrapy keeps it in memory, so it is "
                "lost if this crawl is paused: %(error)s",
                {"request": request, "error": exc},
                extra={"spider": self.crawler.spider},
            )
            self.stats.inc_value("openclaw/unstorable/jobdir")
            raise

    def pop(self) -> Request | None:
        choice = self._choose(self._clock(), acquire=True)
        if choice is None:
            return None
        dq, where = choice
        request = dq.take(where)
        dq.rank = next(self._rr)
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

        queues = shared(self.crawler, "queues", list)
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

    # --- push helpers ---------------------------------------------------------

    def _downloader(self) -> Any | None:
        """The engine's downloader (None before the crawl starts, e.g. in unit tests)."""
        if self._downloader_obj is None:
            self._downloader_obj = getattr(engine_of(self.crawler), "downloader", None)
        return self._downloader_obj

    def _domain_of(self, request: Request) -> str:
        return slot_key(self.crawler, request)

    def _apply_default_deadline(self, request: Request, domain: str, now: float) -> None:
        if M.DEADLINE in request.meta:
            return
        policy = self.policies.for_domain(domain).deadline
        seconds = policy.classes.get(request_class(request, self.stats) or "", policy.default)
        if seconds is not None:
            request.meta[M.DEADLINE] = now + seconds
            self.stats.inc_value("openclaw/queue/deadline/defaulted")

    def _deadline(self, request: Request) -> float | None:
        value = request.meta.get(M.DEADLINE)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            logger.warning(
                "Ignoring meta[%(key)r]=%(value)r of %(request)s: expected a UNIX time (float)",
                {"key": M.DEADLINE, "value": value, "request": request},
                extra={"spider": self.crawler.spider},
            )
            self.stats.inc_value("openclaw/queue/deadline/invalid")
            return None
        return float(value) if math.isfinite(value) else None

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

    # --- pop helpers ----------------------------------------------------------

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
        slot = downloader.slots.get(domain) if downloader is not None else None
        return len(slot.active) if slot is not None else 0

    def _rekey(self, dq: DomainQueue, *, force: bool = False) -> None:
        """Index *dq* under its current top requests (a parked domain is indexed when it wakes)."""
        if dq.parked is None and dq.count > 0:
            self._index.key(dq, force=force)

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

    def _sweep_idle(self, now: float) -> None:
        """Let the health registry forget idle domains: all but those pending in any of the
        crawl's queues or downloading now (see ``HealthRegistry.evict_idle``)."""
        registry = self.registry
        if registry is None or not registry.idle_ttl:
            self._next_sweep = math.inf
            return
        self._next_sweep = now + min(_EVICT_EVERY, registry.idle_ttl / 4)
        keep: set[str] = set()
        for queue in shared(self.crawler, "queues", list):
            keep.update(queue._domains)
            keep.update(queue._domain_of(r) for _, _, r in queue._delayed)
        downloader = self._downloader()
        if downloader is not None:
            keep.update(name for name, slot in downloader.slots.items() if slot.active)
        evicted = registry.evict_idle(now, keep)
        if evicted:
            self.stats.inc_value("openclaw/health/evicted", len(evicted))
        self._report_memory()

    def _report_memory(self, *args: Any, **kwargs: Any) -> None:
        """Known domains and estimated bytes per domain (registry) and per pending request (the
        queue's own structures, not the requests) as stats."""
        stats = self.stats
        stats.set_value("openclaw/queue/domains", len(self._domains))
        if self._count:  # (the last figure with requests pending stays)
            stats.set_value("openclaw/queue/bytes_per_request", round(self.overhead_bytes() / self._count, 1))
        if self.registry is not None:
            stats.set_value("openclaw/health/domains", len(self.registry.domains()))
            stats.set_value("openclaw/health/bytes_per_domain", round(self.registry.bytes_per_domain(), 1))

    def overhead_bytes(self, sample: int = 50) -> float:
        """An estimate (``sys.getsizeof``) of the queue's own structures: per-domain queues from a
        sample, the cross-domain index and the per-request slots in them."""
        if not self._domains:
            return 0.0
        per_domain, n = 0, 0
        for dq in itertools.islice(self._domains.values(), sample):
            n += 1
            per_domain += sys.getsizeof(dq) + sys.getsizeof(dq.buckets) + sys.getsizeof(dq.prios)
            per_domain += sum(sys.getsizeof(b) for b in dq.buckets.values()) + sys.getsizeof(dq.aging)
            per_domain += sys.getsizeof(dq.entries) if dq.entries is not None else 0
        entry_bytes = 0
        if self._index.buckets:
            entry_bytes = sys.getsizeof(self._index.buckets[0]) + 8  # a tuple and its heap slot
        entries = self._index.entries_total() * entry_bytes
        timed = 0
        if self._expiry:  # a deadline request: its Timed, the expiry and aging tuples, their floats
            deadline, _, entry = self._expiry[0]
            timed = len(self._expiry) * (
                sys.getsizeof(entry) + 2 * (sys.getsizeof(self._expiry[0]) + 8) + 2 * sys.getsizeof(deadline)
            )
        return per_domain / n * len(self._domains) + entries + timed

    def _readiness_epoch(self) -> int:
        return getattr(self.registry, "readiness_epoch", 0) if self.registry is not None else 0

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

    def _sweep_expired(self, now: float) -> None:
        """Apply the expired policy to every deadline that has passed, in deadline order."""
        while self._expiry and self._expiry[0][0] <= now:
            _, _, entry = heapq.heappop(self._expiry)
            if not entry.live:
                continue
            self._expired_total += 1
            dq = entry.owner
            if dq.expired_mode == "drop":
                dq.discard(entry)
                self._after_take(dq)
                self._dead_letter(entry.request)
            else:
                dq.boost_expired(entry)
                self._rekey(dq)
                self.stats.inc_value("openclaw/queue/expired/boosted")

    def _dead_letter(self, request: Request) -> None:
        spider = self.crawler.spider
        self.stats.inc_value("openclaw/queue/expired/dropped")
        logger.info(
            "Dropping %(request)s: its deadline passed before it could be sent",
            {"request": request},
            extra={"spider": spider},
        )
        letter = for_request(
            request,
            spider=spider,
            crawl_id=crawl_id(self.crawler),
            error_class="deadline",
            reason="deadline_expired",
        )
        self.crawler.signals.send_catch_log(signal=openclaw_signals.dead_letter, dead_letter=letter, spider=spider)

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

    # --- the one timer ----------------------------------------------------------

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

    # --- JOBDIR persistence -----------------------------------------------------------

    def _pending_requests(self) -> Iterable[Request]:
        for dq in self._domains.values():
            yield from dq.requests()
        for _, _, request in sorted(self._delayed, key=lambda e: e[:2]):
            yield request

    def _persist(self) -> dict[str, Any]:
        spider = self.crawler.spider
        records, lost = [], 0
        for request in self._pending_requests():
            try:
                records.append(request_to_data(request, spider=spider, compact=True))
            except SerializationError as exc:
                lost += 1
                logger.error(
                    "Cannot persist %(request)s: %(error)s",
                    {"request": request, "error": exc},
                    extra={"spider": spider},
                )
        state = _queuefile.write(self.key, records)
        self.stats.set_value("openclaw/queue/persisted", len(records))
        if lost:
            self.stats.set_value("openclaw/queue/persist_failed", lost)
        return state

    def _restore(self, state: Any) -> None:
        if not _queuefile.is_state(state):
            ours = f"{type(self).__module__}.{type(self).__name__}"
            raise ValueError(
                f"JOBDIR queue {self.key} was written by {_writer_of(state)}, which {ours} "
                "cannot resume (Scrapy's disk queues are pickle, which this add-on never loads). "
                f"Resume it with SCHEDULER_PRIORITY_QUEUE = {_writer_of(state)!r}, or start a new "
                f"JOBDIR to use {ours}. (State: {state!r:.120})"
            )
        try:
            records = _queuefile.read(self.key, state)
        except (OSError, ValueError) as exc:
            logger.error(
                "Cannot resume the %(count)s queued requests: %(error)s",
                {"count": state.get("count"), "error": exc},
            )
            self.stats.inc_value("openclaw/queue/restore_failed")
            return
        spider, restored = self.crawler.spider, 0
        for n, record in enumerate(records):
            try:
                request = request_from_data(record, spider=spider)
            except (SerializationError, AttributeError, TypeError) as exc:
                logger.error("Queued request #%(n)d skipped on resume: %(error)s", {"n": n, "error": exc})
                self.stats.inc_value("openclaw/queue/restore_failed")
                continue
            self.push(request)
            restored += 1
        self.stats.set_value("openclaw/queue/restored", restored)


def _writer_of(state: Any) -> str:
    """The Scrapy priority queue class whose ``close()`` returns a state shaped like *state*."""
    if isinstance(state, list):
        return "scrapy.pqueues.ScrapyPriorityQueue"
    if isinstance(state, dict) and all(isinstance(v, list) for v in state.values()):
        return "scrapy.pqueues.DownloaderAwarePriorityQueue"
    return "another SCHEDULER_PRIORITY_QUEUE"


def queue_state(crawler: Crawler) -> dict[str, Any]:
    """The summed :meth:`DeadlinePriorityQueue.queue_state` of the crawl's queues (memory + disk)."""
    total: dict[str, Any] = {"ready": 0, "delayed": 0, "expired": 0, "domains": {}}
    for queue in shared(crawler, "queues", list):
        state = queue.queue_state()
        for k in ("ready", "delayed", "expired"):
            total[k] += state[k]
        for domain, n in state["domains"].items():
            total["domains"][domain] = total["domains"].get(domain, 0) + n
    return total
