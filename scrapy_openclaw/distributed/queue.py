"""A leased deadline queue in Redis: scrapy-redis's queue interface, no lost requests.

scrapy-redis pops destructively, so a worker killed mid-crawl loses every
request it had popped. Here a pop *leases* the entry: an atomic Lua script
moves it to an in-flight set scored by the lease expiry, with this worker's
id. The worker extends its leases on a heartbeat and acknowledges a request
when the engine has finished it (its callback or errback output pushed and
its items through the pipelines; see ``middleware.py``), or atomically with
the push of its retry / redirect copy. Any live worker
re-queues leases that expired (dead worker). A late acknowledgement after a
re-queue removes the entry if nobody leased it again, and is a no-op if
someone did, so nothing is fetched twice by our own doing.

Ordering is the local :class:`~scrapy_openclaw.pqueues.DeadlinePriorityQueue`'s:
requests are kept per domain; a pop takes the best effective priority among
the domains that may send now (priority, deadline aging
``e(t) = max(p, p + B + (t - D)·B/W)``, expired deadlines first or dropped as
dead letters; ties round-robin), and not-before times wait in a separate
sorted set until due. When the health registry lives in Redis, the pop also
takes the domain's token in the same script, so the combined rate of all
workers to a domain stays within its limit (one round trip per request); a
held or throttled domain steps aside in the domain index until it is ready,
so it never stalls the others (see ``lua/__init__.py`` for the keys).

An item that fails in a pipeline (its store was down) hands its request back
for another fetch, at most ``OPENCLAW_DISTRIBUTED_MAX_RELEASES`` times; after
that the request becomes a dead letter (reason ``item_failed``) instead of
looping forever.

Resume: the Redis keys *are* the checkpoint. When every worker stops (or is
killed), pending entries stay in the ready/delayed sets and leased ones in the
in-flight set; the next workers to start with the same ``REDIS_URL`` and spider
name re-queue expired leases and continue (``SCHEDULER_PERSIST`` is on).

Sharding and I/O: entries live in ``OPENCLAW_DISTRIBUTED_SHARDS`` shards by
domain (``shards.py``), each script runs on one shard (one cluster slot), and
pops go round the shards. During a crawl every Redis call runs on the
:class:`~scrapy_openclaw.distributed.link.RedisLink` thread in rounds: pushes
and acknowledgements are buffered and sent in order (a page's links before
its acknowledgement), and ``OPENCLAW_DISTRIBUTED_PREFETCH`` requests are
leased ahead, so ``pop`` and ``__len__`` answer from memory and never wait on
Redis. Redis errors never lose a request: buffered writes are retried with
backoff; pops return nothing until Redis is back.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections import deque
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from redis.exceptions import RedisError
from scrapy.utils.asyncio import call_later, create_looping_call
from scrapy.utils.misc import load_object

from scrapy_openclaw import meta as M
from scrapy_openclaw.delay import not_before, request_class
from scrapy_openclaw.distributed import lua
from scrapy_openclaw.distributed import serializer as json_serializer
from scrapy_openclaw.distributed.link import RedisLink
from scrapy_openclaw.distributed.shards import ShardKeys
from scrapy_openclaw.runtime import crawl_id, shared
from scrapy_openclaw.scrapy_internals import slot_key, wake_engine
from scrapy_openclaw.serialization import RefusedRequest, SerializationError, request_from_data, request_to_data
from scrapy_openclaw.settings import OpenClawSettings

if TYPE_CHECKING:
    from scrapy import Request, Spider

logger = logging.getLogger(__name__)

LEASE = M.LEASE  # the meta key holding the id of the queue entry a request was leased as
STATS = "openclaw/distributed"
_RUNTIME_KEY = "distributed_queue"


def active_queue(crawler: Any) -> LeasedDeadlineQueue | None:
    """The crawler's leased queue, once the scheduler has opened it."""
    from scrapy_openclaw.runtime import peek

    return peek(crawler, _RUNTIME_KEY)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class _Push:
    """A push waiting for Redis: the script's KEYS and ARGV, and who to tell about a duplicate."""

    __slots__ = ("shard", "keys", "args", "on_dupe", "ack")

    def __init__(self, shard: int, keys: list[str], args: list[Any], on_dupe: Any, ack: str | None):
        self.shard, self.keys, self.args, self.on_dupe, self.ack = shard, keys, args, on_dupe, ack


class _Round:
    """One batch of Redis work, prepared on the reactor thread, run on the Redis thread."""

    def __init__(self) -> None:
        self.pushes: list[_Push] = []
        self.acks: dict[int, list[str]] = {}
        self.releases: list[tuple[int, int, list[str]]] = []  # (shard, max_releases, ids)
        self.rejects: list[tuple[int, str, str]] = []  # (shard, id, reason)
        self.beat: dict[int, list[str]] | None = None
        self.pops = 0
        self.counts = False
        self.foreign = False
        # results
        self.pushed: list[bool] = []
        self.acked = False
        self.dead: list[Any] = []
        self.requeued = 0
        self.popped: list[tuple[int, str, Any]] = []
        self.dropped: list[Any] = []
        self.states: list[Any] = []
        self.wait: float | None = None
        self.count: tuple[int, int, int] | None = None
        self.foreign_found: list[Any] = []
        self.error: Exception | None = None


def _lease(shard: int, entry: str) -> str:
    return f"{shard}/{entry}"


def _split(lease: str) -> tuple[int, str]:
    shard, _, entry = lease.partition("/")
    return int(shard), entry


class LeasedDeadlineQueue:
    """scrapy-redis queue (``SCHEDULER_QUEUE_CLASS``) with leases, deadline order and shards."""

    #: tells scrapy_openclaw.delay that not-before times are kept here.
    handles_not_before = True

    def __init__(self, server: Any, spider: Spider, key: str, serializer: Any = None):
        serializer = serializer or json_serializer
        for name in ("loads", "dumps"):
            if not hasattr(serializer, name):
                raise TypeError(f"serializer does not implement {name!r}: {serializer}")
        self.server = server
        self.spider = spider
        self.key = key % {"spider": spider.name}
        self.serializer = serializer
        self.crawler = spider.crawler
        config = OpenClawSettings.for_crawler(self.crawler)
        self.stats = self.crawler.stats
        self.lease = config.distributed_lease
        self.heartbeat = config.distributed_heartbeat or self.lease / 3
        self.scan = config.distributed_scan
        self.max_releases = config.distributed_max_releases
        self.boost = config.queue_aging_boost
        self.prefetch = config.distributed_prefetch
        self.shards = ShardKeys(self.key, spider.name, config.distributed_shards)
        self.worker = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.held: dict[str, float] = {}  # lease id ("shard/entry") -> time leased
        self._pending_push: list[_Push] = []  # pushes waiting for Redis, in order
        self._pending_ack: set[str] = set()
        self._pending_release: list[tuple[str, bool]] = []  # (lease, counted)
        self._pending_reject: list[tuple[str, str]] = []
        self._ready: deque[Request] = deque()  # leased ahead, not yet handed to the engine
        self.link = RedisLink.for_crawler(self.crawler)
        self._last_beat = 0.0
        self._last_foreign = -1e18
        self._wake_timer: Any = None
        self._wake_at = float("inf")
        self._seq = 0
        self._encoded: tuple[Request, str] | None = None  # the last encode(), for the push after it
        self._counts_value = (0, 0, 0)
        self._counts_at = -1e18
        self._busy = False
        self._again = self._again_pops = self._again_counts = False
        self._last_push_queued = True
        self._rr = 0
        self._cands: dict[int, list[str]] = {}  # shard -> domains the next pop expects due
        self._shard_wait: dict[int, float] = {}  # shard -> no pop before this time
        self._push = server.register_script(lua.PUSH)
        self._pop = server.register_script(lua.POP)
        self._ack = server.register_script(lua.ACK)
        self._beat = server.register_script(lua.HEARTBEAT)
        self._release = server.register_script(lua.RELEASE)
        self._reject = server.register_script(lua.REJECT)
        self._counts = server.register_script(lua.COUNTS)
        self.registry = self._health_registry()
        shared(self.crawler, _RUNTIME_KEY, lambda: self)
        self._loop = create_looping_call(self._tick)
        self._loop.start(min(0.5, self.heartbeat), now=False)

    # --- collaborators --------------------------------------------------------

    def _health_registry(self) -> Any:
        """The Redis health registry whose token buckets the pop script takes from."""
        settings = self.crawler.settings
        if not OpenClawSettings.for_crawler(self.crawler).health_enabled:
            return None
        try:
            from scrapy_openclaw.health import HealthRegistry

            registry = HealthRegistry.for_crawler(self.crawler)
        except ImportError:
            path = settings.get("OPENCLAW_HEALTH_REGISTRY_CLASS")
            registry = load_object(path).for_crawler(self.crawler) if path else None
        return registry if getattr(registry, "redis_prefix", None) else None

    def _policy(self, domain: str) -> Any:
        from scrapy_openclaw.policy import PolicySet

        return PolicySet.for_crawler(self.crawler).for_domain(domain)

    # --- scrapy-redis queue interface ----------------------------------------

    def _next_id(self) -> str:
        # time-ordered ids: equal priorities pop FIFO (Redis orders equal scores by member)
        self._seq += 1
        return f"{time.time():017.6f}-{self.worker[-6:]}-{self._seq:x}"

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
                request.meta[M.DEADLINE] = time.time() + float(seconds)
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
        if lease is not None and self.held.pop(lease, None) is not None:
            self._send_ack(lease)

    def push(self, request: Request, dupe: tuple[str, str] | None = None, on_dupe: Any = None) -> bool:
        """Queue *request*; False only when *dupe* (dupefilter key, fingerprint) was already seen.

        With *dupe* the fingerprint is marked in the same Lua step as the push
        (see ``lua.PUSH``), so a worker killed in between cannot leave a page
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
        now = time.time()
        lease = request.meta.pop(LEASE, None)
        ack_id = lease if lease is not None and self.held.pop(lease, None) is not None else None
        domain = slot_key(self.crawler, request)
        shard = self.shards.of(domain)
        policy = self._policy(domain).deadline
        deadline = request.meta.get(M.DEADLINE)
        info = json_serializer.dumps(
            {
                "p": request.priority,
                "d": float(deadline or 0),
                "w": float(policy.aging_window),
                "x": policy.expired,
                "dom": domain,
            }
        )
        if self.registry is not None and domain:
            self.registry.ensure(domain)
        nb = not_before(request, self.stats, now=now)
        same_shard_ack = ""
        if ack_id is not None:
            ack_shard, ack_entry = _split(ack_id)
            if ack_shard == shard:
                same_shard_ack = ack_entry
            # else: acknowledged after this push (another shard cannot be in the same script)
        keys = self.shards.keys(shard, dupe[0] if dupe else None)
        args = [
            self.boost,
            self._next_id(),
            payload,
            info,
            nb,
            now,
            same_shard_ack,
            self.worker,
            dupe[1] if dupe else "",
        ]
        self._pending_push.append(_Push(shard, keys, args, on_dupe, ack_id if not same_shard_ack else None))
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

    def pop(self, timeout: float = 0) -> Request | None:
        if not self._ready:
            self._kick(pops=True)
        if not self._ready:
            return None
        request = self._ready.popleft()
        if len(self._ready) < self.prefetch and self.link.background:
            self._kick(pops=True)
        return request

    def __len__(self) -> int:
        """Everything not yet finished by anyone, minus what this worker is processing.

        Other workers' leases count (their results may add work), ours do not
        (Scrapy tracks those as in-progress itself), so a worker with a leaked
        lease cannot keep itself open forever. During a crawl the counts are
        refreshed in the background; a zero is believed only when it is fresh.
        """
        buffered = len(self._pending_push) + len(self._ready)
        if self.link.down_since is not None or not self.link.ok():
            return buffered + (1 if self.link.within_outage() else 0)
        fresh = time.time() - self._counts_at
        if not self.link.background or fresh > 1.0:
            self._kick(counts=True)
        ready, delayed, inflight = self._counts_value
        total = max(0, ready + delayed + inflight - len(self.held)) + buffered
        if total == 0 and self.link.background and time.time() - self._counts_at > 0.3:
            self._kick(counts=True)
            return 1  # not sure yet: ask again in a moment rather than close
        return total

    def clear(self) -> None:
        for shard in range(self.shards.count):
            self.server.delete(*self.shards.keys(shard)[:-1])
            self.server.delete(self.shards.name("seen", shard))
        for key in [
            self.key,
            *self.shards.legacy(),
            self.key + ":served",
            self.key + ":seq",
            self.key + ":count",
            self.key + ":info",
            self.key + ":owner",
            self.key + ":released",
        ]:
            self.server.delete(key)
        for part in (":q:", ":a:", ":e:"):
            for key in list(self.server.scan_iter(match=self.key + part + "*", count=500)):
                self.server.delete(key)

    def clear_dupefilter(self, dupefilter_key: str) -> None:
        for shard in range(self.shards.count):
            self.server.delete(self.shards.seen(dupefilter_key, shard))

    def legacy_keys(self) -> list[str]:
        """Keys of the pre-sharding layout that hold work (see README, "Migrating")."""
        return [k for k in self.shards.legacy() if self.server.exists(k)]

    # --- leases -----------------------------------------------------------------

    def ack(self, lease_id: str | None) -> None:
        """The request leased as *lease_id* is finished (idempotent)."""
        if lease_id is None or self.held.pop(lease_id, None) is None:
            return
        self.stats.inc_value(f"{STATS}/acked")
        self._send_ack(lease_id)

    def release(self, lease_id: str | None) -> None:
        """Put the leased request back at once: it was not finished (e.g. its item was not stored).

        Counted per entry: past ``OPENCLAW_DISTRIBUTED_MAX_RELEASES`` the request
        becomes a dead letter instead of being fetched again and again.
        """
        if lease_id is None or self.held.pop(lease_id, None) is None:
            return
        self.stats.inc_value(f"{STATS}/released")
        self._pending_release.append((lease_id, True))
        self._kick()

    def _send_ack(self, lease_id: str) -> None:
        self._pending_ack.add(lease_id)
        self._kick()

    def close(self, reason: str) -> Any:
        """Stop the heartbeat; hand leftover leases back (or drop leaks on a clean finish).

        During a crawl: a Deferred fired once Redis has the buffered writes (or
        after a bounded wait), so the engine waits without blocking the reactor.
        """
        if self._loop.running:
            self._loop.stop()
        if self._wake_timer is not None:
            self._wake_timer.cancel()
            self._wake_timer = None
        self.link.reset_backoff()
        self._ready.clear()  # leased ahead: in self.held, handed back below
        ids = list(self.held)
        self.held.clear()
        if reason == "finished":  # everything was processed; these were never acked
            self._pending_ack.update(ids)
        else:
            self._pending_release.extend((i, False) for i in ids)
        job = self._plan(pops=False, counts=False, everything=True)
        n_ids = len(ids)

        def done(res: _Round) -> None:
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
            done(self._run(job))
            return None
        from twisted.internet import defer

        finished = defer.Deferred()
        self._busy = True  # no other round from now on

        def fire(res: _Round) -> None:
            done(res)
            if not finished.called:
                finished.callback(None)

        self.link.submit(self._run, job, callback=fire, raw=True)
        call_later(15.0, lambda: None if finished.called else finished.callback(None))
        return finished

    def _tick(self) -> None:
        """Every poll interval: retry buffered writes, heartbeat, let the engine look for work."""
        self._kick(counts=time.time() - self._counts_at > 0.5)
        self._wake_engine()  # work pushed by other workers

    def _requeued(self, n: int) -> None:
        self.stats.inc_value(f"{STATS}/lease_expired", n)
        logger.info(
            "Re-queued %(n)d requests whose lease expired (a worker died?)", {"n": n}, extra={"spider": self.spider}
        )

    # --- the Redis rounds ---------------------------------------------------------

    def _kick(self, *, pops: bool = False, counts: bool = False) -> None:
        """Send what is waiting (and pop ahead) in one round on the Redis thread; inline outside a crawl."""
        if self._busy:
            self._again = True
            self._again_pops |= pops
            self._again_counts |= counts
            return
        if not self.link.ok():
            return
        job = self._plan(pops=pops, counts=counts)
        if job is None:
            return
        self._busy = True
        if self.link.background:
            self.link.submit(self._run, job, callback=lambda res: self._done(job, res), raw=True)
        else:
            self._done(job, self._run(job))

    def _plan(self, *, pops: bool, counts: bool, everything: bool = False) -> _Round | None:
        now = time.time()
        job = _Round()
        job.pushes = list(self._pending_push[:500])
        # an acknowledgement only after every push before it (a page's links first)
        for lease in self._pending_ack if len(self._pending_push) <= 500 else ():
            shard, entry = _split(lease)
            job.acks.setdefault(shard, []).append(entry)
        by_shard: dict[tuple[int, int], list[str]] = {}
        for lease, counted in self._pending_release:
            shard, entry = _split(lease)
            by_shard.setdefault((shard, self.max_releases if counted else -1), []).append(entry)
        job.releases = [(s, m, ids) for (s, m), ids in by_shard.items()]
        job.rejects = [(*_split(lease), reason) for lease, reason in self._pending_reject]
        if not everything and now - self._last_beat >= self.heartbeat:
            self._last_beat = now
            beat: dict[int, list[str]] = {}
            for lease in self.held:
                shard, entry = _split(lease)
                beat.setdefault(shard, []).append(entry)
            job.beat = beat
            job.foreign = True
        if not everything and now - self._last_foreign > 30:
            job.foreign = True
        if job.foreign:
            self._last_foreign = now
        if pops and not everything:
            want = self.prefetch if self.link.background else 1
            job.pops = max(0, want - len(self._ready))
            if job.pops and all(self._shard_wait.get(i, 0) > now for i in range(self.shards.count)):
                job.pops = 0
        job.counts = counts and not everything
        if not (
            job.pushes
            or job.acks
            or job.releases
            or job.rejects
            or job.beat is not None
            or job.pops
            or job.counts
            or job.foreign
        ):
            return None
        return job

    def _run(self, job: _Round) -> _Round:
        """The Redis thread: run *job*'s calls in order; stop at the first Redis error."""
        try:
            self._run_calls(job)
        except RedisError as exc:
            job.error = exc
        return job

    def _run_calls(self, job: _Round) -> None:
        now = time.time()
        for push in job.pushes:
            job.pushed.append(bool(int(self._push(keys=push.keys, args=push.args))))
        for shard, ids in job.acks.items():
            self._ack(keys=self.shards.keys(shard), args=[self.boost, self.worker, *ids])
        job.acked = True
        for shard, max_releases, ids in job.releases:
            _, dead = self._release(keys=self.shards.keys(shard), args=[self.boost, self.worker, max_releases, *ids])
            job.dead.extend(dead)
        for shard, entry, reason in job.rejects:
            self._reject(keys=self.shards.keys(shard), args=[self.boost, entry, self.worker, reason])
        if job.beat is not None:
            for shard in range(self.shards.count):
                _, requeued = self._beat(
                    keys=self.shards.keys(shard),
                    args=[self.boost, self.worker, now, now + self.lease, *job.beat.get(shard, ())],
                )
                job.requeued += int(requeued)
        if job.foreign:
            self._adopt_foreign(job)
        if job.pops:
            self._pop_round(job)
        if job.counts:
            total = [0, 0, 0]
            for shard in range(self.shards.count):
                for i, n in enumerate(self._counts(keys=self.shards.keys(shard))):
                    total[i] += int(n)
            job.count = (total[0], total[1], total[2])

    def _adopt_foreign(self, job: _Round) -> None:
        """Members of the plain scrapy-redis key (e.g. a pickle pushed by stock scrapy-redis) are
        moved aside as rejected, never executed."""
        members = self.server.zrange(self.key, 0, 99)
        for member in members:
            self.server.hset(self.shards.name("rejected", 0), member, member)
            self.server.zrem(self.key, member)
        job.foreign_found = list(members)

    def _pop_round(self, job: _Round) -> None:
        """Lease up to ``job.pops`` entries, one shard after the other: round-robin from the shard after
        the last one that served, so every shard with work gets its turn."""
        gated = self.registry is not None
        n = self.shards.count
        start = self._rr
        wait: float | None = None
        for step in range(n):
            if len(job.popped) >= job.pops:
                break
            shard = (start + step) % n
            now = time.time()
            if self._shard_wait.get(shard, 0) > now:
                at = self._shard_wait[shard]
                wait = at if wait is None else min(wait, at)
                continue
            for _ in range(3):  # 'retry': the due domains were not the expected ones
                cands = self._cands.get(shard, []) if gated else []
                keys = self.shards.keys(shard)
                if cands:
                    keys = [*keys, *(self.registry.health_key(d) for d in cands)]
                res = self._pop(
                    keys=keys,
                    args=[self.boost, now, now + self.lease, self.worker, self.scan, 1 if gated else 0, *cands],
                )
                status, extra, payload, requeued, dropped, states, nxt = res
                self._cands[shard] = [_text(d) for d in nxt]
                job.requeued += int(requeued)
                job.dropped.extend(dropped)
                job.states.extend(states)
                status = _text(status)
                if status == "retry":
                    continue
                if status == "ok":
                    job.popped.append((shard, _text(extra), payload))
                    self._rr = (shard + 1) % n  # the next pop starts after the shard that served
                elif status == "wait":
                    at = float(_text(extra))
                    self._shard_wait[shard] = at
                    wait = at if wait is None else min(wait, at)
                else:  # empty: look again soon (pushes of other workers)
                    self._shard_wait[shard] = now + 0.25
                break
        job.wait = wait

    def _done(self, job: _Round, res: _Round) -> None:
        self._busy = False
        if res.error is not None:
            self.link.failed(res.error)
        else:
            self.link.recovered()
        self._apply(job, res)
        pops, counts = self._again_pops, self._again_counts
        again, self._again = self._again, False
        self._again_pops = self._again_counts = False
        if res.error is not None:
            return  # the tick tries again once the link's backoff allows
        if again or self._pending_push or self._pending_ack or self._pending_release or self._pending_reject:
            self._kick(
                pops=pops or (self.link.background and len(self._ready) < self.prefetch and bool(res.popped)),
                counts=counts,
            )

    def _apply(self, job: _Round, res: _Round) -> None:
        """Back on the reactor thread: account for what Redis did."""
        now = time.time()
        self._last_push_queued = True
        for push, queued in zip(job.pushes, res.pushed):
            if self._pending_push and self._pending_push[0] is push:
                self._pending_push.pop(0)
            self._shard_wait.pop(push.shard, None)
            self._last_push_queued = queued
            if queued:
                self.stats.inc_value(f"{STATS}/pushed")
            elif push.on_dupe is not None:
                push.on_dupe()
            elif self.link.background:  # a buffered push whose fingerprint another worker marked meanwhile
                self.stats.inc_value(f"{STATS}/filtered_on_flush")
        if res.acked:
            for shard, ids in job.acks.items():
                self._pending_ack.difference_update(_lease(shard, e) for e in ids)
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
                self.registry.refresh(_text(states[i]), states[i + 1])
        for member in res.foreign_found:
            self._refuse_foreign(member)
        for shard, entry, payload in res.popped:
            lease = _lease(shard, entry)
            try:
                request = self._decode(payload)
            except SerializationError as exc:
                self._refuse(lease, exc)  # at once: a refused entry must not keep its lease
                continue
            request.meta[LEASE] = lease
            self.held[lease] = now
            self.stats.inc_value(f"{STATS}/leased")
            self._ready.append(request)
        if res.count is not None:
            self._counts_value, self._counts_at = res.count, now
        if res.wait is not None and not self._ready:
            self._wake(res.wait)
        if res.popped and self.link.background:
            self._wake_engine()

    # --- refused and expired entries -------------------------------------------

    def _decode(self, payload: Any) -> Request:
        """The request of a queue entry; :class:`SerializationError` for anything else.

        Entries are untrusted (anyone who can write to Redis): whatever the
        serializer or the rebuild raises is a refusal, never an exception that
        would leave the entry leased until its lease expires.
        """
        try:
            return request_from_data(self.serializer.loads(payload), self.spider)
        except SerializationError:
            raise
        except Exception as exc:  # a custom SCHEDULER_SERIALIZER may raise anything
            raise SerializationError(f"undecodable queue entry: {type(exc).__name__}: {exc}") from None

    def _refuse(self, lease: str, exc: Exception) -> None:
        """Move a refused entry aside at once; a refused request (scheme, callback, meta) is a dead letter too."""
        logger.error(
            "Refused a Redis queue entry of %(key)s (moved to its shard's :rejected, not executed): %(error)s",
            {"key": self.key, "error": exc},
            extra={"spider": self.spider},
        )
        self.stats.inc_value(f"{STATS}/rejected")
        self.held.pop(lease, None)
        self._pending_reject.append((lease, str(exc)[:500]))  # (if lost, the lease expires and it is refused again)
        self._kick()
        if isinstance(exc, RefusedRequest):
            self._refused_dead_letter(exc)

    def _refuse_foreign(self, member: Any) -> None:
        """A member of the plain scrapy-redis key: kept in ``:rejected`` (never executed) when it
        is not one of our JSON requests, queued like any other request when it is."""
        try:
            request = self._decode(member)
        except SerializationError as exc:
            logger.error(
                "Refused a Redis queue entry of %(key)s (foreign; moved to %(rejected)s, not executed): %(error)s",
                {"key": self.key, "rejected": self.shards.name("rejected", 0), "error": exc},
                extra={"spider": self.spider},
            )
            self.stats.inc_value(f"{STATS}/rejected")
            if isinstance(exc, RefusedRequest):
                self._refused_dead_letter(exc)
            return
        self.push(request)

    def _refused_dead_letter(self, exc: RefusedRequest) -> None:
        """A record of the refused request for the operator; it holds no request, so it is never replayed."""
        from scrapy_openclaw import signals as openclaw_signals
        from scrapy_openclaw.deadletter import DeadLetter

        letter = DeadLetter(
            url=exc.url,
            domain=urlparse(exc.url).hostname or "",
            error_class="refused",
            reason=f"stored_{exc.kind}",
            spider=self.spider.name,
            crawl_id=crawl_id(self.crawler),
            exception_type=type(exc).__name__,
            exception_message=str(exc)[:2000],
        )
        self.crawler.signals.send_catch_log(signal=openclaw_signals.dead_letter, dead_letter=letter, spider=self.spider)

    def _dead_letter(self, payload: Any, *, reason: str, error_class: str) -> None:
        """A request removed from the queue for good (deadline passed, items kept failing)."""
        from scrapy_openclaw import signals as openclaw_signals
        from scrapy_openclaw.deadletter import for_request

        try:
            request = self._decode(payload)
        except SerializationError as exc:
            logger.error(
                "Dropped a Redis queue entry (%(reason)s) that does not decode: %(error)s",
                {"reason": reason, "error": exc},
                extra={"spider": self.spider},
            )
            return
        request.meta.pop(LEASE, None)
        self.stats.inc_value(f"{STATS}/dead_letters/{reason}")
        if reason == "deadline_expired":
            self.stats.inc_value(f"{STATS}/deadline_dropped")
        logger.warning(
            "Giving up on %(request)s: %(reason)s",
            {"request": request, "reason": reason},
            extra={"spider": self.spider},
        )
        letter = for_request(
            request, spider=self.spider, crawl_id=crawl_id(self.crawler), error_class=error_class, reason=reason
        )
        self.crawler.signals.send_catch_log(signal=openclaw_signals.dead_letter, dead_letter=letter, spider=self.spider)

    # --- waking the engine ----------------------------------------------------------

    def _wake(self, at: float) -> None:
        """Wake the engine at *at* (a delayed entry or a domain token becomes due)."""
        if self._wake_timer is not None and self._wake_at <= at:
            return
        if self._wake_timer is not None:
            self._wake_timer.cancel()
        self._wake_at = at
        self._wake_timer = call_later(max(0.0, at - time.time()) + 0.001, self._woken)

    def _woken(self) -> None:
        self._wake_timer, self._wake_at = None, float("inf")
        self._wake_engine()

    def _wake_engine(self) -> None:
        if self.crawler.crawling:  # Crawler.engine raises before the crawl starts (Scrapy >= 2.19)
            wake_engine(self.crawler)
