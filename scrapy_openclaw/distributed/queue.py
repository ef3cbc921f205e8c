"""A leased deadline queue in Redis: scrapy-redis's queue interface, no lost requests.

scrapy-redis pops destructively, so a worker killed mid-crawl loses what it
had popped. Here a pop *leases* the entry (one Lua script: pick, the domain's
token, the lease); the worker acknowledges it once the engine has finished the
request (``middleware.py``), and any live worker re-queues the leases of a dead
one. Within a shard the order is the local DeadlinePriorityQueue's
(``tests/test_queue_parity.py``). During a crawl every Redis call runs on the
link's Redis thread in rounds (``batching.py``, ``rounds.py``), so ``pop`` and
``__len__`` answer from memory. The keys, the leases, resume and the clock:
docs/distributed.md.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from scrapy.utils.asyncio import call_later, create_looping_call

from scrapy_openclaw import meta as M
from scrapy_openclaw.delay import not_before, request_class
from scrapy_openclaw.distributed import serializer as json_serializer
from scrapy_openclaw.distributed.batching import Batching
from scrapy_openclaw.distributed.connection import redis_location
from scrapy_openclaw.distributed.entries import QueueEntries
from scrapy_openclaw.distributed.health import shared_registry
from scrapy_openclaw.distributed.items import ItemWrite, PageItems
from scrapy_openclaw.distributed.link import RedisLink
from scrapy_openclaw.distributed.liveness import Liveness
from scrapy_openclaw.distributed.pending import CrawlWork
from scrapy_openclaw.distributed.rounds import Push, Round, RoundRunner, ack_token, split_lease
from scrapy_openclaw.distributed.shards import ShardKeys
from scrapy_openclaw.exceptions import QueueFormatError
from scrapy_openclaw.pqueues.upkeep import EVICT_EVERY
from scrapy_openclaw.runtime import shared
from scrapy_openclaw.scrapy_internals import downloader_activity, engine_of, slot_key, start_requests_pending
from scrapy_openclaw.serialization import SerializationError, request_to_data
from scrapy_openclaw.settings import OpenClawSettings

if TYPE_CHECKING:
    from scrapy import Request, Spider

    from scrapy_openclaw.metrics.logtable import Progress

logger = logging.getLogger(__name__)
#: The format of what a crawl keeps in Redis (queue entries, health records) as this version
#: writes it, stored in the crawl's ``format`` key: 2 since 2026-12-06 (compact entries, one
#: packed health record per domain), 3 since 2026-12-07 (a ready entry without a deadline held
#: by its ready-set member alone, payload included); a crawl without the key was started before
#: it existed. This version reads every earlier format.
FORMAT = 3
#: a domain the compact info cannot hold (its separators, or what reads as JSON): stored as JSON
_COMPACT_UNSAFE = re.compile(r'[\x01\n]|^\{"')

LEASE = M.LEASE  # the meta key holding the id of the queue entry a request was leased as
STATS = "openclaw/distributed"
_RUNTIME_KEY = "distributed_queue"
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"  # (ASCII order: a fixed-width number sorts as it counts)
_SEQ_WRAP = 36**4


def _base36(n: int, width: int) -> str:
    digits = []
    while n:
        n, d = divmod(n, 36)
        digits.append(_DIGITS[d])
    return "".join(reversed(digits)).rjust(width, "0")


def active_queue(crawler: Any) -> LeasedDeadlineQueue | None:
    """The crawler's leased queue, once the scheduler has opened it."""
    from scrapy_openclaw.runtime import peek

    return peek(crawler, _RUNTIME_KEY)


def _checked(serializer: Any) -> Any:
    for name in ("loads", "dumps"):
        if not hasattr(serializer, name):
            raise TypeError(f"serializer does not implement {name!r}: {serializer}")
    return serializer


class LeasedDeadlineQueue(Batching, QueueEntries):
    """scrapy-redis queue (``SCHEDULER_QUEUE_CLASS``) with leases, deadline order and shards.

    *clock*: a zero-argument callable returning UNIX seconds (tests pass a fake one).
    """

    #: tells scrapy_openclaw.delay that not-before times are kept here.
    handles_not_before = True

    def __init__(
        self,
        server: Any,
        spider: Spider,
        key: str,
        serializer: Any = None,
        *,
        clock: Callable[[], float] = time.time,
    ):
        self.server = server
        self.spider = spider
        self.key = key % {"spider": spider.name}
        self.serializer = _checked(serializer or json_serializer)
        self.crawler = spider.crawler
        self.clock = clock
        config = OpenClawSettings.for_crawler(self.crawler)
        self.stats = self.crawler.stats
        self.lease = config.distributed_lease
        self.heartbeat = config.distributed_heartbeat or self.lease / 3
        self.scan = config.distributed_scan
        self.max_releases = config.distributed_max_releases
        self.boost = config.queue_aging_boost
        self.prefetch = config.distributed_prefetch
        self.round_gap = config.distributed_round_gap
        self.shards = ShardKeys(self.key, spider.name, config.distributed_shards)
        self.worker = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        #: lease id ("shard/entry") -> its place in the ready set (``_place``: a failover's reclaim)
        self.held: dict[str, str] = {}
        self._pending_push: list[Push] = []  # pushes waiting for Redis, in order
        self._pending_ack: set[str] = set()  # ack tokens (``rounds.ack_token``)
        self._ackable: set[str] = set()  # of them, those whose pushes a cluster confirmed (batching)
        #: writes Redis confirmed in the last REPLAY_WINDOW seconds: (when, pushes queued, acks), sent
        #: again should Redis turn out to be another server (a failover loses what was not replicated)
        self._recent: deque[tuple[float, list[Push], list[str], list[ItemWrite]]] = deque()
        self._check_server = True  # ask which server answers, at the first round and after an outage
        self._reclaim = False
        self._pops_from = 0.0  # no pops before (a failover's grace)
        self._pending_release: list[tuple[str, bool]] = []  # (lease, counted)
        self.items = PageItems()  # items of held pages, written with their ack (pipelines.RedisItemPipeline)
        self._pending_reject: list[tuple[str, str]] = []
        self._ready: deque[Request] = deque()  # leased ahead, not yet handed to the engine
        #: how many a pop round leases ahead: ``prefetch``, doubled while the engine finds the
        #: buffer empty (up to twice ``CONCURRENT_REQUESTS``, see ``Batching._adapt_ahead``)
        self.ahead = self.prefetch
        self.most_ahead = max(self.prefetch, 2 * self.crawler.settings.getint("CONCURRENT_REQUESTS"))
        self._ran_dry = False  # the engine asked and the buffer was empty since the last pop round
        self.link = RedisLink.for_crawler(self.crawler, clock=clock)
        self._last_beat = self._last_sweep = 0.0
        self._waker: Any = None  # (wakeup.Wakeup, started with the Redis thread)
        self._woken_shards: set[int] = set()  # shards another worker queued work in, to pop from again
        self._ask_after_count = False  # wake the engine when the count on its way is in
        self._wakes: dict[int, set[str]] = {}  # shard -> domains the registry woke (see batching)
        self._next_sweep = 0.0  # when the health cache is next swept for idle domains
        self._last_foreign = -1e18
        self._wake_timer: Any = None
        self._gap_timer: Any = None  # (see Batching.round_gap)
        self._round_at = -1e18
        self._wake_at = float("inf")
        self._seq = 0
        self._encoded: tuple[Request, str] | None = None  # the last encode(), for the push after it
        idle_before_close = self.crawler.settings.getfloat("SCHEDULER_IDLE_BEFORE_CLOSE")
        self.work = CrawlWork(clock, idle_before_close)  # the crawl's remaining work, as last counted
        self.liveness = config.distributed_liveness
        self._alive: Liveness | None = None
        self._busy = False
        self._again = self._again_pops = self._again_counts = False
        self._counting = False
        self._last_push_queued = True
        self.registry = shared_registry(self.crawler)  # the pop takes its tokens when it lives in Redis
        self._readiness_epoch = getattr(self.registry, "readiness_epoch", 0)
        self.runner = self._round_runner(clock)
        self.runner.riders = lambda: self.link.take_scripts(self.server)  # (health records ride in rounds)
        self.runner.delivered = self.link.deliver_scripts
        self.link.ride_wait = self.round_gap  # (a health record waits at most this long for a round)
        shared(self.crawler, _RUNTIME_KEY, lambda: self)
        self._loop = create_looping_call(self._tick)
        self._loop.start(min(0.5, self.heartbeat), now=False)

    def _round_runner(self, clock: Callable[[], float]) -> RoundRunner:
        """The Redis rounds (pop, push, ack...) of this worker, with the queue's settings."""
        return RoundRunner(
            self.server,
            self.shards,
            worker=self.worker,
            boost=self.boost,
            lease=self.lease,
            scan=self.scan,
            registry=self.registry,
            liveness=self.liveness,
            clock=clock,
        )

    # --- collaborators --------------------------------------------------------

    def _policy(self, domain: str) -> Any:
        from scrapy_openclaw.policy import PolicySet

        return PolicySet.for_crawler(self.crawler).for_domain(domain)

    # --- scrapy-redis queue interface ----------------------------------------

    def _next_id(self) -> str:
        # time-ordered ids: equal priorities pop FIFO (Redis orders equal scores by member). Base 36,
        # fixed width: the microsecond, the worker's tag, a sequence that keeps two pushes of one
        # microsecond in order; 20 characters, stored three times per pending request (no '-': the
        # ids of the layout before inline info had one, and queue.lua's legacy() tells them by it)
        self._seq += 1
        return f"{_base36(int(self.clock() * 1e6), 10)}{self.worker[-6:]}{_base36(self._seq % _SEQ_WRAP, 4)}"

    def encode(self, request: Request) -> str:
        """The queue entry for *request*; :class:`SerializationError` (URL and key) if it cannot be stored.

        The scheduler calls it before the duplicate filter, so a request that
        cannot be stored is refused without being marked as seen. It writes the
        policy's default deadline into meta (the entry carries it), nothing else.
        """
        domain = slot_key(self.crawler, request)
        if request.meta.get(M.DEADLINE) is None:
            policy = self._policy(domain).deadline
            seconds = policy.classes.get(request_class(request, self.stats), policy.default)
            if seconds is not None:
                request.meta[M.DEADLINE] = self.clock() + float(seconds)
        lease = request.meta.pop(LEASE, None)  # the entry never carries a lease
        try:
            payload = self.serializer.dumps(request_to_data(request, self.spider, compact=True))
            self._encoded = (request, payload)  # push() takes it from here: one encoding per request
            return payload
        except (TypeError, ValueError) as exc:  # a custom SCHEDULER_SERIALIZER's own refusal
            if isinstance(exc, SerializationError):
                raise
            raise SerializationError(f"request {request.url}: {type(exc).__name__}: {exc}") from None
        finally:
            if lease is not None:
                request.meta[LEASE] = lease

    def drop_lease(self, request: Request) -> None:
        """A refused retry or redirect copy: acknowledge the page it was leased as (it is finished)."""
        lease = request.meta.pop(LEASE, None)
        place = self.held.pop(lease, None) if lease is not None else None
        if place is not None:
            self.items.finish(lease)
            self._send_ack(ack_token(lease, place))

    def push(self, request: Request, dupe: tuple[str, str] | None = None, on_dupe: Any = None) -> bool:
        """Queue *request*; False only when *dupe* (dupefilter key, fingerprint) was already seen.

        With *dupe* the fingerprint is marked in the same Lua step as the push
        (see ``lua/push.lua``), so a worker killed in between cannot leave a page
        marked as seen but never queued. During a crawl the push goes to Redis
        in the background (in order, before any later acknowledgement): it
        returns True at once and *on_dupe* is called if the fingerprint turns
        out to be seen already. A request that cannot be stored raises
        :class:`SerializationError` before anything is marked (the scheduler
        calls :meth:`encode` first; its result is reused here).
        """
        encoded = self._encoded
        payload = encoded[1] if encoded is not None and encoded[0] is request else self.encode(request)
        self._encoded = None
        now = self.clock()
        lease = request.meta.pop(LEASE, None)
        place = self.held.pop(lease, None) if lease is not None else None
        ack_id = ack_token(lease, place) if lease is not None and place is not None else None
        if ack_id is not None:  # (items a callback scraped before yielding this copy)
            self.items.finish(lease, acked=True)
        domain = slot_key(self.crawler, request)
        shard = self.shards.of(domain)
        info = self._info(request, domain)
        if self.registry is not None and domain:
            self.registry.ensure(domain)
        nb = not_before(request, self.stats, now=now)
        same_shard_ack = ""
        if ack_id is not None:
            ack_shard, ack_entry = split_lease(ack_id)
            if ack_shard == shard:
                same_shard_ack = ack_entry
            # else: acknowledged after this push (another shard cannot be in the same script)
        keys = self.shards.keys(shard, dupe[0] if dupe else None)
        fingerprint = dupe[1] if dupe else ""
        copy = "1" if ack_id is not None else "0"  # a retry or redirect copy: not discovered again
        args = [self.boost, self._next_id(), payload, info, nb, now, same_shard_ack, self.worker, fingerprint, copy]
        self._pending_push.append(Push(shard, keys, args, on_dupe, ack_id if not same_shard_ack else None))
        if ack_id is not None and not same_shard_ack:
            self._pending_ack.add(ack_id)
        if not self.link.background:
            self._kick()
            if self._pending_push and self._pending_push[-1].args is args:
                return True  # buffered (Redis down): checked when flushed
            return self._last_push_queued
        self._kick()
        if nb > now:
            self._wake(nb)
        return True

    def _info(self, request: Request, domain: str) -> str:
        """What the Lua side orders an entry by: domain, priority, deadline, aging window, expired
        mode, as ``queue.lua``'s ``decoded`` reads them ("<domain>\\1<priority>..."; the trailing
        zeros left out); JSON for a domain the compact form cannot hold."""
        deadline = request.meta.get(M.DEADLINE)
        priority = request.priority
        if _COMPACT_UNSAFE.search(domain) or not isinstance(priority, int):
            info: dict[str, Any] = {"dom": domain}  # (what is left out, queue.lua's info_of reads as 0)
            if priority:
                info["p"] = priority
            if deadline:
                policy = self._policy(domain).deadline
                info.update(d=float(deadline), w=float(policy.aging_window), x=policy.expired)
            return json.dumps(info, separators=(",", ":"))
        if deadline:
            policy = self._policy(domain).deadline
            return (
                f"{domain}\x01{priority}\x01{float(deadline)!r}\x01{float(policy.aging_window)!r}\x01{policy.expired}"
            )
        return f"{domain}\x01{priority}" if priority else domain

    def _place(self, request: Request) -> str:
        """Where *request*'s entry waits in its shard's ready set when held there inline
        ("<domain>\\1<priority order>", as ``queue.lua``'s ``q_member`` orders it; '' when it
        cannot be): a server that never saw the pop (a failover) finds the entry by it, for the
        acknowledgement and for the first heartbeat's reclaim (``lua/heartbeat.lua``)."""
        domain, order = slot_key(self.crawler, request), 10**10 - request.priority
        if _COMPACT_UNSAFE.search(domain) or not isinstance(request.priority, int) or not 0 <= order <= 99999999999:
            return ""
        return f"{domain}\x01{order:011d}"

    def pop(self, timeout: float = 0) -> Request | None:
        if not self._ready:
            self._kick(pops=True)
        if not self._ready:
            self._ran_dry = True
            return None
        request = self._ready.popleft()
        if len(self._ready) < self.prefetch and self.link.background:
            self._kick(pops=True)
        return request

    def __len__(self) -> int:
        """The whole crawl's pending work, minus what this worker is processing (see ``pending.py``).

        During a crawl the counts are refreshed in the background; a zero is
        believed only when it is sure and fresh.
        """
        buffered = len(self._pending_push) + len(self._ready)
        if self.link.down_since is not None or not self.link.ok():
            return buffered + (1 if self.link.within_outage() else 0)
        if not self.link.background or self._count_due(max(1.0, self._count_every())):
            self._kick(counts=True)
        total, again = self.work.pending(len(self.held), buffered, background=self.link.background)
        if again and self._count_due(0.0):
            self._kick(counts=True)
        elif again:  # (the engine asks many times a round: ask again when the count on its way is in)
            self._ask_after_count = True
        return total

    def progress(self, domains: dict[str, int]) -> Progress:
        """The whole crawl's progress figures, as last counted (*domains*: this worker's, per domain)."""
        return self.work.progress(len(self._pending_push), domains)

    # --- the crawl's workers ------------------------------------------------------

    def join(self) -> None:
        """Join the crawl as a live, busy worker (its start requests are not in Redis yet), and
        start sending signs of life (``liveness.py``); the scheduler calls it at open."""
        self.runner.join()
        self._alive = Liveness(self.server, self.shards.workers()[0], self.worker, self.liveness, clock=self.clock)
        self._alive.start()

    def _busy_here(self) -> bool:
        """Whether this worker has work of its own that other workers may not see in Redis."""
        if self.held or self._pending_push or self._pending_release or self._ready:
            return True
        return self.crawler.crawling and start_requests_pending(engine_of(self.crawler))

    def clear(self) -> None:
        self.shards.clear(self.server)

    def clear_dupefilter(self, dupefilter_key: str) -> None:
        for shard in range(self.shards.count):
            self.server.delete(self.shards.seen(dupefilter_key, shard))

    def check_format(self, pending: int) -> None:
        """Refuse a crawl a newer version keeps in Redis (this worker could not read it); mark the
        crawl with this version's format, with a warning when an earlier version wrote to it (its
        workers cannot read what this one writes: they must be stopped and upgraded). *pending*:
        the crawl's work, which a crawl without the mark has only if an earlier version made it."""
        key = self.shards.format_key()
        raw = self.server.get(key)
        found = int(raw) if raw is not None and raw.isdigit() else None
        if found is not None and found > FORMAT:
            message = (
                f"scrapy-openclaw distributed mode: the crawl in Redis at {redis_location(self.crawler)} "
                f"keeps its data in format {found} ({key}), written by a newer scrapy-openclaw; this one "
                f"reads format {FORMAT}. Upgrade this worker to the version of the others"
            )
            logger.critical(message)
            raise QueueFormatError(message)
        if found == FORMAT:
            return
        if found is not None or pending:
            logger.warning(
                "The crawl in Redis at %(where)s was started by an earlier scrapy-openclaw (data format "
                "%(found)s, this one writes %(format)d): workers of that version cannot read what this one "
                "queues; stop them and upgrade them (this worker reads their entries)",
                {"where": redis_location(self.crawler), "found": found or 1, "format": FORMAT},
                extra={"spider": self.spider},
            )
        self.server.set(key, FORMAT)

    def legacy_keys(self) -> list[str]:
        """Keys of the pre-sharding layout that hold work (see docs/distributed.md, "Migrating a queue")."""
        return [k for k in self.shards.legacy() if self.server.exists(k)]

    # --- leases -----------------------------------------------------------------

    def ack(self, lease_id: str | None) -> None:
        """The request leased as *lease_id* is finished (idempotent)."""
        place = self.held.pop(lease_id, None) if lease_id is not None else None
        if lease_id is None or place is None:
            return
        self.stats.inc_value(f"{STATS}/acked")
        self.items.finish(lease_id)
        self._send_ack(ack_token(lease_id, place))

    def release(self, lease_id: str | None) -> None:
        """Put the leased request back at once: it was not finished (e.g. its item was not stored).

        Counted per entry: past ``OPENCLAW_DISTRIBUTED_MAX_RELEASES`` the request
        becomes a dead letter instead of being fetched again and again.
        """
        if lease_id is None or self.held.pop(lease_id, None) is None:
            return
        self.items.discard(lease_id)  # (scraped again with the page)
        self.stats.inc_value(f"{STATS}/released")
        self._pending_release.append((lease_id, True))
        self._kick()

    def add_item(self, lease: str | None, key: str, payload: str) -> None:
        """An item scraped from the page leased as *lease*: written to the list *key* with the
        page's acknowledgement (an item of no page held here: with the next round)."""
        if lease is not None and lease in self.held:
            self.items.attach(lease, key, payload)
        else:
            self.items.loose(key, payload)
            self.stats.inc_value(f"{STATS}/items/without_page")
            self._kick()

    def _send_ack(self, token: str) -> None:
        self._pending_ack.add(token)
        self._kick()

    def close(self, reason: str) -> Any:
        """Stop the heartbeat; hand leftover leases back (or drop leaks on a clean finish).

        During a crawl: a Deferred fired once Redis has the buffered writes (or
        after a bounded wait), so the engine waits without blocking the reactor;
        None at once when nothing is buffered (before, an empty last round failed
        with an AttributeError and the close waited out the 15 s bound).
        """
        if self._loop.running:
            self._loop.stop()
        if self._alive is not None:
            self._alive.stop()
        if self._waker is not None:
            self._waker.stop()
        if self._wake_timer is not None:
            self._wake_timer.cancel()
            self._wake_timer = None
        if self._gap_timer is not None:
            self._gap_timer.cancel()
            self._gap_timer = None
        self.link.reset_backoff()
        self.link.ride_wait = 0.0  # (no round to wait for: what waits goes now, or with the last round)
        self.link.flush_scripts()
        self._ready.clear()  # leased ahead: in self.held, handed back below
        self.items.forget_now()
        held, self.held = self.held, {}
        if reason == "finished":  # everything was processed; these were never acked
            self._pending_ack.update(ack_token(lease, place) for lease, place in held.items())
            for lease in held:
                self.items.finish(lease)
        else:
            self._pending_release.extend((lease, False) for lease in held)
            for lease in held:
                self.items.discard(lease)
        job = self._plan(pops=False, counts=False, everything=True)
        if job is not None:
            job.leave = self.runner.stated is not None
        elif self.runner.stated is not None:  # nothing buffered: only leave the crawl
            job = Round()
            job.leave = True
        if job is None:  # nothing buffered, nothing to wait for
            return None
        return self._last_round(job, len(held), reason)

    def _last_round(self, job: Round, n_ids: int, reason: str) -> Any:
        """Send what is left; during a crawl a Deferred fired when Redis has it (or after 15 s)."""

        def done(res: Round) -> None:
            self._apply(job, res)
            if res.error is not None and n_ids:
                logger.warning(
                    "Could not return %(n)d leases to Redis (%(error)s); they expire in %(lease)ss",
                    {"n": n_ids, "error": res.error, "lease": self.lease},
                    extra={"spider": self.spider},
                )
            elif n_ids and reason != "finished":
                logger.info(
                    "Returned %(n)d leased requests to the Redis queue", {"n": n_ids}, extra={"spider": self.spider}
                )

        if not self.link.background:
            done(self.runner.run(job))
            return None
        from twisted.internet import defer

        finished: defer.Deferred[None] = defer.Deferred()
        self._busy = True  # no other round from now on

        def fire(res: Round) -> None:
            done(res)
            if not finished.called:
                finished.callback(None)

        self.link.submit(self.runner.run, job, callback=fire, raw=True)
        call_later(15.0, lambda: None if finished.called else finished.callback(None))
        return finished

    def _tick(self) -> None:
        """Every poll interval: retry buffered writes, heartbeat, let the engine look for work."""
        self._kick(counts=self._count_due(self._count_every()))
        self._wake_engine()  # work pushed by other workers
        if self.registry is not None and self.registry.idle_ttl and self.clock() >= self._next_sweep:
            self._sweep_idle()

    def _sweep_idle(self) -> None:
        """Let this worker's cache of the health registry forget idle domains, keeping those it has
        leased ahead or is downloading (their Redis hashes expire by themselves)."""
        registry = self.registry
        assert registry is not None
        now = self.clock()
        self._next_sweep = now + min(EVICT_EVERY, registry.idle_ttl / 4)
        keep = {slot_key(self.crawler, request) for request in self._ready}
        activity = downloader_activity(engine_of(self.crawler))
        if activity is not None:
            keep.update(domain for domain, active in activity[1].items() if active)
        evicted = registry.evict_idle(now, keep)
        if evicted:
            self.stats.inc_value("openclaw/health/evicted", len(evicted))
