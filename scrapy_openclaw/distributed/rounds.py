"""The Redis side of the leased queue: one round of calls, run on the link's Redis thread.

The queue (reactor thread) gathers what it owes Redis (pushes, acknowledgements,
releases, refusals, a heartbeat) and what it wants (pops ahead, counts) into a
:class:`Round`; :class:`RoundRunner` runs the round's Lua scripts in order on
the Redis thread (a page's links before its acknowledgement) and writes the
results into the round, which goes back to the reactor thread. A Redis error
stops the round where it is: what was not confirmed stays buffered and goes
in the next round, so nothing is lost.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from scrapy_openclaw.distributed import lua

if TYPE_CHECKING:
    from scrapy_openclaw.distributed.shards import ShardKeys


def text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def lease_id(shard: int, entry: str) -> str:
    """The lease id a request carries in meta: ``"<shard>/<entry id>"``."""
    return f"{shard}/{entry}"


def split_lease(lease: str) -> tuple[int, str]:
    shard, _, entry = lease.partition("/")
    return int(shard), entry


class Push:
    """A push waiting for Redis: the script's KEYS and ARGV, and who to tell about a duplicate."""

    __slots__ = ("shard", "keys", "args", "on_dupe", "ack")

    def __init__(self, shard: int, keys: list[str], args: list[Any], on_dupe: Any, ack: str | None):
        self.shard, self.keys, self.args, self.on_dupe, self.ack = shard, keys, args, on_dupe, ack


class Round:
    """One batch of Redis work, prepared on the reactor thread, run on the Redis thread."""

    def __init__(self) -> None:
        self.pushes: list[Push] = []
        self.acks: dict[int, list[str]] = {}
        self.releases: list[tuple[int, int, list[str]]] = []  # (shard, max_releases, ids)
        self.rejects: list[tuple[int, str, str]] = []  # (shard, id, reason)
        self.beat: dict[int, list[str]] | None = None
        self.pops = 0
        self.counts = False
        self.foreign = False
        self.busy = False  # this worker has work of its own not (yet) in the queue
        self.leave = False  # a clean close: the worker leaves the crawl
        self.check_server = False  # ask the server's run id first (after an outage: a failover?)
        self.reclaim = False  # the beat takes back held entries the server has waiting (after a failover)
        # results
        self.pushed: list[bool] = []
        self.acked = False
        self.dead: list[Any] = []
        self.requeued = 0
        self.popped: list[tuple[int, str, Any]] = []
        self.dropped: list[Any] = []
        self.states: list[Any] = []
        self.wait: float | None = None
        self.count: tuple[int, int, int, int] | None = None  # ready, delayed, inflight, discovered
        self.others_busy = 0  # other live workers with work of their own
        self.stable = False  # no worker turned busy while the shards were counted
        self.new_server = False  # another server answers than before: nothing else was run
        self.reclaimed = 0  # leases of dead workers handed back
        self.dead_workers: list[str] = []
        self.foreign_found: list[Any] = []
        self.error: Exception | None = None

    def empty(self) -> bool:
        """Nothing to send and nothing to ask."""
        return not (
            self.pushes
            or self.acks
            or self.releases
            or self.rejects
            or self.beat is not None
            or self.pops
            or self.counts
            or self.foreign
            or self.leave
        )


class RoundRunner:
    """Runs a queue's rounds against Redis: the queue's scripts, and where its pops go next.

    ``shard_wait`` (shard -> no pop before this time), ``cands`` (shard ->
    the domains the next pop expects due) and the round-robin start are the
    pop's own memory between rounds.
    """

    def __init__(
        self,
        server: Any,
        shards: ShardKeys,
        *,
        worker: str,
        boost: float,
        lease: float,
        scan: int,
        registry: Any,
        liveness: float = 5.0,
        clock: Callable[[], float] = time.time,
    ):
        self.server, self.shards, self.worker = server, shards, worker
        self.boost, self.lease, self.scan, self.registry = boost, lease, scan, registry
        self.liveness = liveness
        self.clock = clock
        self.stated: bool | None = None  # the busy flag Redis has for this worker
        self.run_id: str | None = None  # the Redis server's run id, as last checked
        self.shard_wait: dict[int, float] = {}
        self.cands: dict[int, list[str]] = {}
        self.rr = 0
        self.push = server.register_script(lua.PUSH)
        self.pop = server.register_script(lua.POP)
        self.ack = server.register_script(lua.ACK)
        self.beat = server.register_script(lua.HEARTBEAT)
        self.release = server.register_script(lua.RELEASE)
        self.reject = server.register_script(lua.REJECT)
        self.counts = server.register_script(lua.COUNTS)
        self.reclaim = server.register_script(lua.RECLAIM)
        self.workers = server.register_script(lua.WORKERS)

    def run(self, job: Round) -> Round:
        """The Redis thread: run *job*'s calls in order; stop at the first Redis error."""
        try:
            if job.check_server and self._server_changed():
                job.new_server = True
                return job
            self._writes(job)
            if job.beat is not None:
                self._heartbeat(job, job.beat)
            if job.foreign:
                self._adopt_foreign(job)
            if job.pops:
                self._pop_round(job)
            if job.leave:
                self.crew("leave")
                self.stated = None
            else:
                self._state(job)
            if job.counts:
                self._count(job)
        except RedisError as exc:
            job.error = exc
        return job

    def _server_changed(self) -> bool:
        """Whether another Redis server answers than at the last check (a Sentinel failover, or a
        restart without persistence). Not asked of a cluster (each node has its own run id)."""
        if not hasattr(self.server, "info") or type(self.server).__name__ == "RedisCluster":
            return False
        run_id = text(self.server.info("server").get("run_id", ""))
        changed = self.run_id is not None and run_id != self.run_id
        self.run_id = run_id
        return changed

    def _writes(self, job: Round) -> None:
        keys = self.shards.keys
        for push in job.pushes:
            job.pushed.append(bool(int(self.push(keys=push.keys, args=push.args))))
        for shard, ids in job.acks.items():
            self.ack(keys=keys(shard), args=[self.boost, self.worker, *ids])
        job.acked = True
        for shard, max_releases, ids in job.releases:
            _, dead = self.release(keys=keys(shard), args=[self.boost, self.worker, max_releases, *ids])
            job.dead.extend(dead)
        for shard, entry, reason in job.rejects:
            self.reject(keys=keys(shard), args=[self.boost, entry, self.worker, reason])

    def _heartbeat(self, job: Round, held: dict[int, list[str]]) -> None:
        """Extend this worker's leases and requeue everyone's expired ones, on every shard."""
        now = self.clock()
        for shard in range(self.shards.count):
            _, requeued = self.beat(
                keys=self.shards.keys(shard),
                args=[self.boost, self.worker, now, now + self.lease, int(job.reclaim), *held.get(shard, ())],
            )
            job.requeued += int(requeued)

    # --- the crawl's workers -------------------------------------------------------

    def crew(self, op: str, *args: Any) -> Any:
        """``lua/workers.lua``'s *op* for this worker."""
        return self.workers(keys=self.shards.workers(), args=[op, self.clock(), self.worker, *args])

    def join(self) -> None:
        """Tell the crawl this worker is alive and busy (its start requests are not in Redis yet)."""
        self.crew("state", 1, self.clock() + self.liveness)
        self.stated = True

    def _state(self, job: Round) -> None:
        """After the round's writes and pops: whether this worker still has work of its own
        (only once it joined the crawl: a queue used outside a crawl takes no part)."""
        busy = job.busy or bool(job.popped)
        if self.stated is not None and busy != self.stated:
            self.crew("state", 1 if busy else 0, self.clock() + self.liveness)
            self.stated = busy

    def _count(self, job: Round) -> None:
        """The crawl's remaining work: every shard's entries, and the live workers with work of their own.

        The shards are counted one after the other, so a worker may move work from a shard not
        counted yet into one counted already (lease, push the page's links, acknowledge): it
        turns busy first, which moves the epoch; a count is *stable* when the epoch did not move.
        Dead workers' leases are handed back first.
        """
        epoch, busy, dead = self.crew("look")
        dead = [text(w) for w in dead if text(w) != self.worker]
        if dead:
            for shard in range(self.shards.count):
                job.reclaimed += int(self.reclaim(keys=self.shards.keys(shard), args=[self.boost, *dead]))
            self.crew("forget", *dead)
            job.dead_workers = dead
        total = [0, 0, 0, 0]
        for shard in range(self.shards.count):
            for i, n in enumerate(self.counts(keys=self.shards.keys(shard))):
                total[i] += int(n)
        job.count = (total[0], total[1], total[2], total[3])
        epoch_after, busy_after, _ = self.crew("look")
        job.others_busy = max(int(busy), int(busy_after))
        job.stable = int(epoch) == int(epoch_after)

    def _adopt_foreign(self, job: Round) -> None:
        """Members of the plain scrapy-redis key (e.g. a pickle pushed by stock scrapy-redis) are
        moved aside as rejected, never executed."""
        key = self.shards.key
        members = self.server.zrange(key, 0, 99)
        for member in members:
            self.server.hset(self.shards.name("rejected", 0), member, member)
            self.server.zrem(key, member)
        job.foreign_found = list(members)

    def _pop_round(self, job: Round) -> None:
        """Lease up to ``job.pops`` entries, one shard after the other: round-robin from the shard after
        the last one that served, so every shard with work gets its turn."""
        n = self.shards.count
        start = self.rr
        wait: float | None = None
        for step in range(n):
            if len(job.popped) >= job.pops:
                break
            shard = (start + step) % n
            now = self.clock()
            if self.shard_wait.get(shard, 0) > now:
                at = self.shard_wait[shard]
                wait = at if wait is None else min(wait, at)
                continue
            due = self._pop_shard(job, shard, now)
            if due is not None:
                wait = due if wait is None else min(wait, due)
        job.wait = wait

    def _pop_shard(self, job: Round, shard: int, now: float) -> float | None:
        """One pop on *shard*; when the shard has nothing due, the time to look again."""
        gated = self.registry is not None
        for _ in range(3):  # 'retry': the due domains were not the expected ones
            cands = self.cands.get(shard, []) if gated else []
            keys = self.shards.keys(shard)
            if cands:
                keys = [*keys, *(self.registry.health_key(d) for d in cands)]
            res = self.pop(
                keys=keys,
                args=[self.boost, now, now + self.lease, self.worker, self.scan, 1 if gated else 0, *cands],
            )
            status, extra, payload, requeued, dropped, states, nxt = res
            self.cands[shard] = [text(d) for d in nxt]
            job.requeued += int(requeued)
            job.dropped.extend(dropped)
            job.states.extend(states)
            status = text(status)
            if status == "retry":
                continue
            if status == "ok":
                job.popped.append((shard, text(extra), payload))
                self.rr = (shard + 1) % self.shards.count  # the next pop starts after the shard that served
            elif status == "wait":
                at = float(text(extra))
                self.shard_wait[shard] = at
                return at
            else:  # empty: look again soon (pushes of other workers)
                self.shard_wait[shard] = now + 0.25
            break
        return None
