"""The leased queue's Redis I/O in rounds, so the reactor never waits on Redis.

Pushes, items and acknowledgements are buffered and sent in order (a page's
links and items before its acknowledgement), and ``OPENCLAW_DISTRIBUTED_PREFETCH`` requests are
leased ahead, so ``pop`` and ``__len__`` answer from memory. Redis errors never
lose a request: buffered writes stay until a round confirms them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from scrapy.utils.asyncio import call_later

from scrapy_openclaw import meta as M
from scrapy_openclaw.distributed import wakeup
from scrapy_openclaw.distributed.rounds import Push, Round, RoundRunner, lease_id, split_lease, text
from scrapy_openclaw.scrapy_internals import free_downloads, wake_engine
from scrapy_openclaw.serialization import SerializationError

if TYPE_CHECKING:
    from collections import deque

    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

    from scrapy_openclaw.distributed.items import ItemWrite, PageItems
    from scrapy_openclaw.distributed.link import RedisLink
    from scrapy_openclaw.distributed.pending import CrawlWork
    from scrapy_openclaw.distributed.shards import ShardKeys

logger = logging.getLogger(__name__)

STATS = "openclaw/distributed"
#: at most this many buffered pushes per round (acknowledgements wait for the pushes before them)
_MAX_PUSHES = 500
#: seconds between two looks at the plain scrapy-redis key for foreign entries
_FOREIGN_EVERY = 30
#: seconds of confirmed writes kept to send again to a server that replaced the one that confirmed
#: them: a replica is behind its master by what was in flight (well under a second on one network);
#: nothing is added while Redis is away, so it counts back from the outage (memory: the pushes of
#: that many seconds)
REPLAY_WINDOW = 3.0
#: seconds a worker pops nothing after it found a failover, so that every worker (each retrying
#: on its own backoff, at most 5 s) takes back its leases before any entry is handed out again
FAILOVER_GRACE = 6.0
#: at least this many seconds between two heartbeats that look at every shard (the others extend
#: leases on the shards this worker holds some in): expired leases and due entries of shards nobody
#: pops from go back to ready
SWEEP_EVERY = 5.0
#: seconds between two counts of the crawl's work (and looks for dead workers) once idle workers
#: are woken by the wake stream: a worker turning idle tells the others, who count at once (unless
#: their last count found the crawl over but for themselves)
COUNT_EVERY = 2.0
#: seconds between two full counts of a worker that has work of its own (the progress figures)
BUSY_RECOUNT_EVERY = 10.0


class Batching:
    """Buffered writes, prefetched pops and the rounds that carry them (a mixin of ``LeasedDeadlineQueue``).

    During a crawl the rounds run on the :class:`~scrapy_openclaw.distributed.link.RedisLink`
    thread, one at a time: what is asked while a round runs goes in the next one. Unconfirmed
    writes are retried with the link's backoff; pops return nothing until Redis is back.
    Outside a crawl (tests, the CLI) a round runs inline.
    """

    # (set by LeasedDeadlineQueue.__init__)
    crawler: Crawler
    stats: StatsCollector
    clock: Callable[[], float]
    link: RedisLink
    runner: RoundRunner
    shards: ShardKeys
    registry: Any
    heartbeat: float
    prefetch: int
    #: seconds at least between the starts of two rounds, unless the worker has no request ready
    #: (``OPENCLAW_DISTRIBUTED_ROUND_GAP``): what a page writes (its links, its acknowledgement,
    #: its health record) waits at most this long and rides with other pages' in one round trip
    #: (a record that is a signal about its domain goes at once, ``RedisLink.submit_script``)
    round_gap: float
    ahead: int
    most_ahead: int
    _ran_dry: bool
    max_releases: int
    held: dict[str, str]
    _pending_push: list[Push]
    _pending_ack: set[str]
    _ackable: set[str]
    items: PageItems
    _recent: deque[tuple[float, list[Push], list[str], list[ItemWrite]]]
    _check_server: bool
    _reclaim: bool
    _pops_from: float
    _pending_release: list[tuple[str, bool]]
    _pending_reject: list[tuple[str, str]]
    _ready: deque[Request]
    _busy: bool
    _again: bool
    _again_pops: bool
    _again_counts: bool
    _counting: bool
    _last_beat: float
    _last_foreign: float
    _last_push_queued: bool
    work: CrawlWork
    _wake_timer: Any
    _gap_timer: Any
    _round_at: float
    _wake_at: float
    _readiness_epoch: int
    _last_sweep: float
    _waker: wakeup.Wakeup | None
    _woken_shards: set[int]
    _ask_after_count: bool
    _wakes: dict[int, set[str]]

    if TYPE_CHECKING:  # (QueueEntries')

        def _decode(self, payload: Any) -> Request: ...
        def _refuse(self, lease: str, exc: Exception) -> None: ...
        def _refuse_foreign(self, member: Any) -> None: ...
        def _dead_letter(self, payload: Any, *, reason: str, error_class: str) -> None: ...
        def _requeued(self, n: int) -> None: ...
        def _reclaimed(self, n: int, dead: list[str]) -> None: ...
        def _busy_here(self) -> bool: ...

    if TYPE_CHECKING:  # (the queue's)

        def _place(self, request: Request) -> str: ...

    def _kick(self, *, pops: bool = False, counts: bool = False) -> None:
        """Send what is waiting (and pop ahead) in one round on the Redis thread; inline outside a crawl."""
        if self._busy:
            self._again = True
            self._again_pops |= pops
            self._again_counts |= counts
            return
        if not self.link.ok():
            return
        if self.link.background and not (pops and not self._ready):  # (an empty buffer does not wait)
            gap = self._round_at + self.round_gap - self.clock()
            if gap > 0:
                self._again_pops |= pops
                self._again_counts |= counts
                if self._gap_timer is None:
                    self._gap_timer = call_later(gap, self._after_gap)
                return
        if self._waker is None and self.link.background:
            self._start_waker()
        job = self._plan(pops=pops, counts=counts)
        if job is None:
            return
        self._round_at = self.clock()
        self._busy = True
        self._counting = job.counts or job.look
        if self.link.background:
            self.link.submit(self.runner.run, job, callback=lambda res: self._done(job, res), raw=True)
        else:
            self._done(job, self.runner.run(job))

    def _after_gap(self) -> None:
        """The gap since the last round is over: send what gathered meanwhile."""
        self._gap_timer = None
        if self._busy:
            self._again = True  # (the round that runs takes it on when it ends)
            return
        pops, counts = self._again_pops, self._again_counts
        self._again_pops = self._again_counts = False
        self._kick(pops=pops, counts=counts)

    def _plan(self, *, pops: bool, counts: bool, everything: bool = False) -> Round | None:
        """The next round: the buffered writes, plus (unless *everything*: the close's last
        round) a heartbeat when due, pops ahead and counts."""
        now = self.clock()
        job = self._plan_writes(last=everything)
        job.check_server = self._check_server
        if not everything and (now - self._last_beat >= self.heartbeat or self._reclaim):
            self._last_beat = now
            job.reclaim, self._reclaim = self._reclaim, False
            job.sweep = now - self._last_sweep >= max(self.heartbeat, SWEEP_EVERY)
            beat: dict[int, list[str]] = {}
            for lease, place in self.held.items():
                shard, entry = split_lease(lease)
                # (after a failover, where to find an entry the new server has waiting inline)
                beat.setdefault(shard, []).append(f"{entry}\x01{place}" if job.reclaim else entry)
            if beat or job.sweep or job.reclaim:
                job.beat = beat
            if job.sweep:
                self._last_sweep = now
                job.foreign = True
        if not everything and now - self._last_foreign > _FOREIGN_EVERY:
            job.foreign = True
        if job.foreign:
            self._last_foreign = now
        if pops and not everything:
            self._look_again_after_overrides()
            job.wakes = {shard: sorted(domains) for shard, domains in self._wakes.items()}
            self._wakes = {}
            self._look_again(self._woken_shards)
            self._woken_shards = set()
            # ahead: the prefetch (more while the engine keeps finding the buffer empty), or as
            # many as the downloader would start now (a round per page or two otherwise, while
            # the downloader waits for them)
            want = max(self.ahead, free_downloads(self.crawler)) if self.link.background else 1
            job.pops = max(0, want - len(self._ready)) if now >= self._pops_from else 0
            if job.pops and all(self.runner.shard_wait.get(i, 0) > now for i in range(self.shards.count)):
                job.pops = 0
                self._hungry(True)
        job.counts = counts and not everything
        if job.counts and self._look_suffices():
            job.counts, job.look = False, True
        if job.empty() and not self.runner.owes_notice():
            return None
        job.busy = self._busy_here()
        return job

    def _look_again(self, shards: Any) -> None:
        """Pop again from these shards at once if their last pop found them empty (someone
        pushed, or a count or a beat found ready entries there)."""
        empty = self.runner.empty
        for shard in shards:
            if shard in empty:
                empty.discard(shard)
                self.runner.shard_wait.pop(shard, None)

    # --- idle workers: waiting for work (wakeup.py) -------------------------------------

    def _start_waker(self) -> None:
        self._waker = wakeup.Wakeup(self.runner.server, self.shards.workers()[3], self._on_wake, self.link.to_reactor)
        self._waker.start()
        self.runner.empty_wait = wakeup.EMPTY_WAIT

    def _hungry(self, hungry: bool) -> None:
        if self._waker is not None:
            self._waker.want(hungry)

    def _on_wake(self, shards: set[int], idle: bool) -> None:
        """Another worker queued work in *shards*, or turned *idle*: then count the crawl's work
        again, unless the last count already found it over but for this worker (no work left,
        no other worker busy): a worker turning idle cannot make the crawl less over, and when
        three finish together each would count twice more."""
        self._woken_shards |= shards
        recount = idle and not self.work.over_but_here()
        if recount:
            self.work.recount()  # (the next look at the pending count asks Redis)
        self._kick(pops=True, counts=recount)
        self._wake_engine()

    def _count_due(self, after: float) -> bool:
        """Whether to count the crawl's work again: the last count (or look) is older than *after*
        seconds and none is on its way (the engine asks for the pending count many times a round)."""
        return self.work.asked_age() > after and not (self._busy and self._counting)

    def _count_every(self) -> float:
        """Seconds between two counts of the crawl's work (see COUNT_EVERY)."""
        return COUNT_EVERY if self.link.background and self._waker is not None else 0.5

    def _look_suffices(self) -> bool:
        """Whether a look at the workers (one script call) will do instead of counting every shard
        (one call each). A worker with nothing of its own to do (it waits on the wake stream) only
        looks between full counts while another is busy (``pending.RECOUNT_EVERY``). A worker with
        work of its own cannot be the crawl's last, so its count only feeds the progress figures:
        it counts every ``BUSY_RECOUNT_EVERY`` seconds and looks (dead workers) in between."""
        if self._waker is None or not self.link.background:
            return False
        if self._busy_here():
            return self.work.age() < BUSY_RECOUNT_EVERY
        return self.work.look_suffices()

    def _look_again_after_overrides(self) -> None:
        """An operator's release or restore (``readiness_epoch``) may make a domain due before
        the time its shard's last pop said to wait for (a 600 s hold's end): look at every
        shard again, as the local queue wakes its parked domains."""
        epoch = getattr(self.registry, "readiness_epoch", 0)
        if epoch != self._readiness_epoch:
            self._readiness_epoch = epoch
            self.runner.shard_wait.clear()
            for domain in self.registry.take_woken() if hasattr(self.registry, "take_woken") else ():
                self._wakes.setdefault(self.shards.of(domain), set()).add(domain)

    def _plan_writes(self, last: bool = False) -> Round:
        job = Round()
        job.pushes = list(self._pending_push[:_MAX_PUSHES])
        # An acknowledgement only after every push before it (a page's links first). One Redis
        # runs a round's pipeline in order: an ack goes with the pushes before it. A cluster's
        # nodes run theirs each on its own: an ack goes in a round after the one that confirmed
        # those pushes (``_ackable``), so that a round is one pipeline there too; the close's
        # last round sends its pushes first and its acks once they are confirmed (``ordered``).
        every_push = len(self._pending_push) <= _MAX_PUSHES
        job.ordered = last and self.runner.cluster
        # a page's items go before its acknowledgement, as its links do (``items.py``)
        job.items, job.forget = self.items.take()
        if not self.runner.cluster or last:
            acks = self._pending_ack if every_push else set()
        elif self._pending_push or job.items:
            acks = self._ackable
            job.unlocks = self._pending_ack - self._ackable if every_push else set()
        else:
            acks = self._pending_ack
        for lease in acks:
            shard, entry = split_lease(lease)
            job.acks.setdefault(shard, []).append(entry)
        by_shard: dict[tuple[int, int], list[str]] = {}
        for lease, counted in self._pending_release:
            shard, entry = split_lease(lease)
            by_shard.setdefault((shard, self.max_releases if counted else -1), []).append(entry)
        job.releases = [(s, m, ids) for (s, m), ids in by_shard.items()]
        job.rejects = [(*split_lease(lease), reason) for lease, reason in self._pending_reject]
        return job

    def _done(self, job: Round, res: Round) -> None:
        self._busy = False
        if res.error is not None:
            self.link.failed(res.error)
            for shard, domains in job.wakes.items():  # (sent again with the next round)
                self._wakes.setdefault(shard, set()).update(domains)
            self._check_server = True
        else:
            self.link.recovered()
            self._check_server = self._check_server and not job.check_server
        if res.new_server:
            self._replay()
        else:
            self._apply(job, res)
        pops, counts = self._again_pops, self._again_counts
        again, self._again = self._again, False
        self._again_pops = self._again_counts = False
        if res.error is not None:
            return  # the tick tries again once the link's backoff allows
        if (
            again
            or res.new_server
            or self._pending_push
            or self._pending_ack
            or self._pending_release
            or self._pending_reject
            or self.items.owed()
        ):
            self._kick(
                pops=pops or (self.link.background and len(self._ready) < self.prefetch and bool(res.popped)),
                counts=counts,
            )

    def _apply(self, job: Round, res: Round) -> None:
        """Back on the reactor thread: account for what Redis did."""
        now = self.clock()
        self._settle_pushes(job, res)
        if res.acked:
            written = self.items.confirmed(job.items, job.forget, res.again)
            if written:
                self.stats.inc_value(f"{STATS}/items/written", written)
            if res.again:
                self.stats.inc_value(f"{STATS}/items/pages_written_before", len(res.again))
            acked = [lease_id(shard, e.partition("\x01")[0]) for shard, ids in job.acks.items() for e in ids]
            self.items.acked(acked, res.missed)
            for shard, ids in job.acks.items():
                self._pending_ack.difference_update(lease_id(shard, e) for e in ids)
            self._ackable = (self._ackable | job.unlocks) & self._pending_ack  # (their pushes are in)
            self._remember(job, res, now)
            del self._pending_release[: sum(len(ids) for _, _, ids in job.releases)]
            del self._pending_reject[: len(job.rejects)]
            for raw in res.dead:
                self._dead_letter(raw, reason="item_failed", error_class="item")
        if res.requeued:
            self._requeued(res.requeued)
        for raw in res.dropped:
            self._dead_letter(raw, reason="deadline_expired", error_class="deadline")
        if self.registry is not None:
            states = res.states
            for i in range(0, len(states), 2):
                self.registry.refresh(text(states[i]), states[i + 1])
        for member in res.foreign_found:
            self._refuse_foreign(member)
        self._look_again([*res.ready_shards, *res.requeued_shards, *(s for s, _, _ in job.releases)])
        self._take_popped(res)
        if job.pops:
            self._hungry(len(res.popped) < job.pops)
            self._adapt_ahead(job.pops, len(res.popped))
        if res.count is not None:
            self.work.counted(res)
        else:
            if job.look and res.error is None:
                self.work.looked(res)
            if res.pushed or job.releases:
                self.work.wrote()
        if self._ask_after_count and (res.count is not None or job.look):  # (see __len__)
            self._ask_after_count = False
            self._wake_engine()
        if res.dead_workers:
            self.runner.shard_wait.clear()  # their leases are ready again
            self._reclaimed(res.reclaimed, res.dead_workers)
        if res.wait is not None and not self._ready:
            self._wake(res.wait)
        if res.popped and self.link.background:
            self._wake_engine()

    def _adapt_ahead(self, asked: int, popped: int) -> None:
        """Lease more ahead while the engine finds the buffer empty between pop rounds and
        Redis has all that was asked (the downloader drains a round's worth faster than a round
        comes back: fewer, fuller rounds); back towards ``prefetch`` when a round finds less
        ready than it asked (nothing is gained by asking more, and leases held are work the
        other workers cannot take)."""
        if popped < asked:
            self.ahead = max(self.prefetch, self.ahead // 2)
        elif self._ran_dry:
            self.ahead = min(self.most_ahead, self.ahead * 2)
        self._ran_dry = False

    def _remember(self, job: Round, res: Round, now: float) -> None:
        """Keep the writes Redis just confirmed for REPLAY_WINDOW seconds: the pushes it queued
        that name a fingerprint (the dupefilter makes sending them twice harmless) and the acks."""
        pushes = [p for p, queued in zip(job.pushes, res.pushed) if queued and p.args[8]]
        acks = [lease_id(shard, e) for shard, ids in job.acks.items() for e in ids]
        acks += [p.ack for p in pushes if p.ack]
        if pushes or acks or job.items:
            self._recent.append((now, pushes, acks, job.items))
        while self._recent and self._recent[0][0] < now - REPLAY_WINDOW:
            self.items.aged(self._recent.popleft()[3])

    def _replay(self) -> None:
        """Another Redis server answers than the one that confirmed the recent writes (a failover):
        send them again before anything newer, as it may have lost the last ones (an
        acknowledgement lost would have the page fetched again, its items written twice)."""
        # (no one to tell of a duplicate now: the first send did; the acks go separately)
        pushes = [Push(p.shard, p.keys, p.args, None, None) for _, ps, _, _ in self._recent for p in ps]
        acks = {a for _, _, acks, _ in self._recent for a in acks}
        self.items.replay([w for _, _, _, writes in self._recent for w in writes])
        self._recent.clear()
        self._reclaim = True  # and the next beat takes back the leases the new server never saw
        self._pops_from = self.clock() + FAILOVER_GRACE
        self._wake(self._pops_from)
        self._pending_push[:0] = pushes
        self._pending_ack.update(acks)
        self._ackable = set()  # (each after the pushes sent again)
        self.runner.shard_wait.clear()
        self.stats.inc_value(f"{STATS}/failovers")
        self.stats.inc_value(f"{STATS}/replayed_writes", len(pushes) + len(acks))
        logger.warning(
            "Redis answers from another server than before the outage (a failover?): sending the "
            "last %(window)ds of writes again (%(pushes)d pushes, %(acks)d acknowledgements), in case "
            "it had not received them",
            {"window": REPLAY_WINDOW, "pushes": len(pushes), "acks": len(acks)},
            extra={"spider": self.crawler.spider},
        )

    def _settle_pushes(self, job: Round, res: Round) -> None:
        """Drop the confirmed pushes from the buffer; tell whoever asked about duplicates."""
        self._last_push_queued = True
        for push, queued in zip(job.pushes, res.pushed):
            if self._pending_push and self._pending_push[0] is push:
                self._pending_push.pop(0)
            self.runner.shard_wait.pop(push.shard, None)
            self._last_push_queued = queued
            if queued:
                self.stats.inc_value(f"{STATS}/pushed")
            elif push.on_dupe is not None:
                push.on_dupe()
            elif self.link.background:  # a buffered push whose fingerprint another worker marked meanwhile
                self.stats.inc_value(f"{STATS}/filtered_on_flush")

    def _take_popped(self, res: Round) -> None:
        """The leased entries, decoded, ready for the engine (a refused one is moved aside at once)."""
        for shard, entry, payload in res.popped:
            lease = lease_id(shard, entry)
            try:
                request = self._decode(payload)
            except SerializationError as exc:
                self._refuse(lease, exc)  # at once: a refused entry must not keep its lease
                continue
            request.meta[M.LEASE] = lease
            self.held[lease] = self._place(request)
            self.stats.inc_value(f"{STATS}/leased")
            self._ready.append(request)

    # --- waking the engine ----------------------------------------------------------

    def _wake(self, at: float) -> None:
        """Wake the engine at *at* (a delayed entry or a domain token becomes due)."""
        if self._wake_timer is not None and self._wake_at <= at:
            return
        if self._wake_timer is not None:
            self._wake_timer.cancel()
        self._wake_at = at
        self._wake_timer = call_later(max(0.0, at - self.clock()) + 0.001, self._woken)

    def _woken(self) -> None:
        self._wake_timer, self._wake_at = None, float("inf")
        self._wake_engine()

    def _wake_engine(self) -> None:
        if self.crawler.crawling:  # Crawler.engine raises before the crawl starts (Scrapy >= 2.19)
            wake_engine(self.crawler)
