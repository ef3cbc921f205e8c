"""The Redis side of the leased queue: one round of calls, run on the link's Redis thread.

The queue gathers what it owes Redis and what it wants into a :class:`Round`;
:class:`RoundRunner` runs the round's scripts in order (a page's links before its
acknowledgement). A Redis error stops the round where it is: what was not
confirmed stays buffered for the next round, so nothing is lost.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from scrapy_openclaw.distributed import lua, wakeup
from scrapy_openclaw.distributed.connection import is_cluster, run_scripts
from scrapy_openclaw.distributed.items import marks_key

if TYPE_CHECKING:
    from scrapy_openclaw.distributed.items import ItemWrite
    from scrapy_openclaw.distributed.shards import ShardKeys

#: the keys of a shard that ``lua/counts.lua`` counts, in its order: ready, delayed, in flight, discovered
COUNTED = ("q", "delayed", "inflight", "found")


def text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def lease_id(shard: int, entry: str) -> str:
    """The lease id a request carries in meta: ``"<shard>/<entry id>"``."""
    return f"{shard}/{entry}"


def split_lease(lease: str) -> tuple[int, str]:
    shard, _, entry = lease.partition("/")
    return int(shard), entry


def ack_token(lease: str, place: str) -> str:
    """What an acknowledgement sends: ``"<shard>/<entry id>\\1<place>"``, the place (where the
    entry waits in its ready set when held there inline, ``queue._place``) for a server that
    never saw the pop (a failover): it finds the entry by it (``queue.lua``'s ``ack``)."""
    return f"{lease}\x01{place}"


class Push:
    """A push waiting for Redis: the script's KEYS and ARGV, and who to tell about a duplicate."""

    __slots__ = ("shard", "keys", "args", "on_dupe", "ack")

    def __init__(self, shard: int, keys: list[str], args: list[Any], on_dupe: Any, ack: str | None):
        self.shard, self.keys, self.args, self.on_dupe, self.ack = shard, keys, args, on_dupe, ack


def _until_error(outcomes: list[tuple[bool, Any]]) -> list[Any]:
    """``run_scripts``' replies up to the first error, that error last: in a round's ordered
    writes, what follows an error is not counted as done."""
    out: list[Any] = []
    for ok, res in outcomes:
        out.append(res)
        if not ok:
            break
    return out


def _push_groups(pushes: list[Push]) -> list[list[Push]]:
    """Consecutive pushes with the same keys (one shard, one dupefilter): one script call each."""
    groups: list[list[Push]] = []
    for push in pushes:
        if groups and groups[-1][0].keys == push.keys:
            groups[-1].append(push)
        else:
            groups.append([push])
    return groups


def _push_args(group: list[Push]) -> list[Any]:
    """``push.lua``'s ARGV for *group* (a Push's args: boost, id, payload, info, not-before, now,
    ack, worker, fingerprint, copy)."""
    boost, worker = group[0].args[0], group[0].args[7]
    args: list[Any] = [boost, worker]
    for push in group:
        a = push.args
        args += [a[1], a[2], a[3], a[4], a[5], a[6], a[8], a[9]]
    return args


class Round:
    """One batch of Redis work, prepared on the reactor thread, run on the Redis thread."""

    def __init__(self) -> None:
        self.pushes: list[Push] = []
        self.acks: dict[int, list[str]] = {}
        self.items: list[ItemWrite] = []  # pages' items (before the acks), and marks forgotten
        self.forget: dict[str, list[str]] = {}
        self.unlocks: set[str] = set()  # (a cluster's) ack tokens this round's pushes, once confirmed, free
        self.ordered = False  # (a cluster's last round) the pushes confirmed before the rest is sent
        self.releases: list[tuple[int, int, list[str]]] = []  # (shard, max_releases, ids)
        self.rejects: list[tuple[int, str, str]] = []  # (shard, id, reason)
        self.wakes: dict[int, list[str]] = {}  # shard -> domains ready sooner than it parked them
        self.beat: dict[int, list[str]] | None = None
        self.pops = 0
        self.counts = False
        self.look = False  # only the workers' look (dead workers, others busy): an idle worker's count
        self.foreign = False
        self.busy = False  # this worker has work of its own not (yet) in the queue
        self.leave = False  # a clean close: the worker leaves the crawl
        self.check_server = False  # ask the server's run id first (after an outage: a failover?)
        self.reclaim = False  # the beat takes back held entries the server has waiting (after a failover)
        self.sweep = False  # the beat also requeues expired leases and due entries on every shard
        # results
        self.pushed: list[bool] = []
        self.acked = False
        self.again: set[str] = set()  # pages whose items were written before (by a worker that died)
        self.missed: set[str] = set()  # leases whose ack did not count (another worker holds them)
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
        self.ready_shards: list[int] = []  # shards the count found ready entries in
        self.requeued_shards: list[int] = []  # shards whose beat made entries ready
        self.error: Exception | None = None

    def empty(self) -> bool:
        """Nothing to send and nothing to ask."""
        return not (
            self.pushes
            or self.items
            or self.forget
            or self.acks
            or self.releases
            or self.rejects
            or self.wakes
            or self.beat is not None
            or self.pops
            or self.counts
            or self.look
            or self.foreign
            or self.leave
        )


class RoundRunner:
    """Runs a queue's rounds against Redis: the queue's scripts, and where its pops go next.

    ``shard_wait`` (shard -> no pop before this time), ``empty`` (the shards
    whose last pop found nothing: they wait ``empty_wait``, unless woken, see
    ``wakeup.py``), ``cands`` (shard -> the domains the next pop expects due)
    and the round-robin start are the pop's own memory between rounds.
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
        #: the link's waiting health records, taken by a round to ride in its pipeline, and where
        #: their replies go (see RedisLink.take_scripts); None: not in a crawl
        self.riders: Callable[[], list[Any]] | None = None
        self.delivered: Callable[[list[Any], list[tuple[bool, Any]]], None] = lambda calls, outcomes: None
        self.stated: bool | None = None  # the busy flag Redis has for this worker
        self.run_id: str | None = None  # the Redis server's run id, as last checked
        self.shard_wait: dict[int, float] = {}
        self.empty: set[int] = set()
        self.empty_wait = 0.25  # (inline, without a wake-up thread: look again soon)
        self.cands: dict[int, list[str]] = {}
        self.rr = 0
        self.cluster = is_cluster(server)
        self._fresh: set[int] = set()  # shards given work for idle workers, not told yet (the Redis thread's)
        self._owe_idle = False  # this worker turned idle, not told yet
        self._told_at = -1e18
        self.push = server.register_script(lua.PUSH)
        self.pop = server.register_script(lua.POP)
        self.ack = server.register_script(lua.ACK)
        self.beat = server.register_script(lua.HEARTBEAT)
        self.release = server.register_script(lua.RELEASE)
        self.reject = server.register_script(lua.REJECT)
        self.counts = server.register_script(lua.COUNTS)
        self.reclaim = server.register_script(lua.RECLAIM)
        self.wake = server.register_script(lua.WAKE)
        self.workers = server.register_script(lua.WORKERS)
        self.items = server.register_script(lua.ITEMS)

    def run(self, job: Round) -> Round:
        """The Redis thread: run *job*'s calls in order; stop at the first Redis error."""
        try:
            if job.check_server and self._server_changed():
                job.new_server = True
                return job
            for shard, domains in job.wakes.items():  # (their pop must be able to take them)
                cands = self.cands.setdefault(shard, [])
                cands += [d for d in domains if d not in cands]
            queue, wait = self._pop_plan(job) if job.pops else ([], None)
            first, queue = queue[:1], queue[1:]  # (one shard asked for them all; the next if it had fewer)
            popped = self._writes(job, [self._pop_call(shard, self.clock(), job.pops) for shard in first])
            if job.beat is not None:
                self._heartbeat(job, job.beat)
            if job.foreign:
                self._adopt_foreign(job)
            if job.pops:
                self._pop_round(job, first, popped, queue, wait)
            if job.leave:
                self.crew("leave")
                self.stated = None
                self._owe_idle = True
            else:
                self._state(job)
            if job.counts:
                self._count(job)
            elif job.look:
                self._look(job)
            self._notify(force=job.leave)
        except RedisError as exc:
            job.error = exc
        return job

    def owes_notice(self) -> bool:
        """Whether a wake entry is waiting for its turn (``wakeup.NOTIFY_EVERY``)."""
        return bool(self._fresh) or self._owe_idle

    def _notify(self, *, force: bool = False) -> None:
        """Tell idle workers (the wake stream): shards got work, or this worker turned idle."""
        if not self.owes_notice():
            return
        now = time.monotonic()
        if not force and now - self._told_at < wakeup.NOTIFY_EVERY:
            return
        wakeup.notify(self.server, self.shards.workers()[3], self._fresh, self._owe_idle)
        self._told_at, self._owe_idle = now, False
        self._fresh = set()

    def scripts(self, calls: list[tuple[Any, list[str], list[Any]]], *, partial: bool = False) -> list[Any]:
        """Several script calls in one pipeline (one round trip per node; run in order on one
        Redis). A script the node does not have yet is loaded and run on its own. The first
        error is raised, unless *partial*: then the replies stop before it (and it is the last)."""
        if not calls:
            return []
        if len(calls) == 1:
            script, keys, args = calls[0]
            return [script(keys=keys, args=args)]
        out = _until_error(run_scripts(self.server, calls))
        if out and not partial and isinstance(out[-1], Exception):
            raise out[-1]
        return out

    def _server_changed(self) -> bool:
        """Whether another Redis server answers than at the last check (a Sentinel failover, or a
        restart without persistence). Not asked of a cluster (each node has its own run id)."""
        if not hasattr(self.server, "info") or type(self.server).__name__ == "RedisCluster":
            return False
        run_id = text(self.server.info("server").get("run_id", ""))
        changed = self.run_id is not None and run_id != self.run_id
        self.run_id = run_id
        return changed

    def _writes(self, job: Round, pops: list[tuple[Any, list[str], list[Any]]]) -> list[Any]:
        """The round's pushes and items, then its acknowledgements, hand-backs, refusals and wakes, the
        health records waiting on the link (``riders``: before the pops, which take tokens by
        them), then *pops* (the first pop calls; their replies are returned): one pipeline, one
        round trip per node. One Redis runs it in order (a page's links before its
        acknowledgement, even when the worker dies while sending); on a cluster the round's
        acknowledgements follow pushes and items an earlier round confirmed
        (``Batching._plan_writes``), and the close's last round (``ordered``) sends its pushes
        and items first and the rest once they are confirmed."""
        keys = self.shards.keys
        groups = _push_groups(job.pushes)
        pushes = [(self.push, g[0].keys, _push_args(g)) for g in groups]
        items = self._item_calls(job)
        rest = [(self.ack, keys(s), [self.boost, self.worker, *ids]) for s, ids in job.acks.items()]
        rest += [(self.release, keys(s), [self.boost, self.worker, m, *ids]) for s, m, ids in job.releases]
        rest += [(self.reject, keys(s), [self.boost, e, self.worker, why]) for s, e, why in job.rejects]
        rest += [(self.wake, keys(s), [self.clock(), *domains]) for s, domains in job.wakes.items()]
        riders = self.riders() if self.riders is not None else []
        first = [*pushes, *items]
        if job.ordered:  # (a cluster's last round: the pushes and items in before the acks go)
            early = self.scripts(first, partial=True)
            self._pushed(job, groups, early[: len(pushes)])
            self._items_in(job, early[len(pushes) :])
            first = []
        calls = [*first, *rest, *((s, k, a) for s, k, a, _ in riders), *pops]
        outcomes = run_scripts(self.server, calls) if calls else []
        written = len(first) + len(rest)
        if riders:
            self.delivered(riders, outcomes[written : written + len(riders)])
        replies = _until_error(outcomes[:written])
        if first:
            self._pushed(job, groups, replies[: len(pushes)])
            self._items_in(job, replies[len(pushes) : len(first)])
        replies = replies[len(first) :]
        if replies and isinstance(replies[-1], Exception):
            raise replies[-1]
        job.acked = True
        for shard, reply in zip(job.acks, replies):
            job.missed.update(lease_id(shard, text(entry)) for entry in reply)
        for reply in replies[len(job.acks) : len(job.acks) + len(job.releases)]:
            job.dead.extend(reply[1])
        popped = outcomes[written + len(riders) :]
        for ok, res in popped:
            if not ok:
                raise res
        return [res for _, res in popped]

    @staticmethod
    def _items_in(job: Round, replies: list[Any]) -> None:
        """The pages whose items Redis had already (up to the first error, raised)."""
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
            job.again.update(text(page) for page in reply)

    def _item_calls(self, job: Round) -> list[tuple[Any, list[str], list[Any]]]:
        """``lua/items.lua`` once per items list: the marks it forgets, then each page's items."""
        by_key: dict[str, list[Any]] = {key: [len(pages), *pages] for key, pages in job.forget.items()}
        for write in job.items:
            by_key.setdefault(write.key, [0]).extend([write.page, len(write.payloads), *write.payloads])
        return [(self.items, [key, marks_key(key)], [self.worker, *args]) for key, args in by_key.items()]

    def _pushed(self, job: Round, groups: list[list[Push]], replies: list[Any]) -> None:
        """The pushes Redis confirmed (up to the first error, raised)."""
        for group, reply in zip(groups, replies):
            if isinstance(reply, Exception):
                raise reply
            for queued in reply:
                job.pushed.append(bool(int(queued)))
                if int(queued) == 2:
                    self._fresh.add(group[0].shard)

    def _heartbeat(self, job: Round, held: dict[int, list[str]]) -> None:
        """Extend this worker's leases (and requeue everyone's expired ones) on the shards it holds
        leases in, on every shard when *job.sweep*: one pipeline."""
        now = self.clock()
        shards = range(self.shards.count) if job.sweep or job.reclaim else sorted(held)
        args = [self.boost, self.worker, now, now + self.lease, int(job.reclaim)]
        calls = [(self.beat, self.shards.keys(s), [*args, *held.get(s, ())]) for s in shards]
        for shard, (_, requeued) in zip(shards, self.scripts(calls) if calls else []):
            job.requeued += int(requeued)
            if int(requeued):
                job.requeued_shards.append(shard)
                self._fresh.add(shard)

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
            self._owe_idle = self._owe_idle or not busy
            self.stated = busy

    def _count(self, job: Round) -> None:
        """The crawl's remaining work: every shard's entries, and the live workers with work of their own.

        The shards are counted one after the other, so a worker may move work from a shard not
        counted yet into one counted already (lease, push the page's links, acknowledge): it
        turns busy first, which moves the epoch; a count is *stable* when the epoch did not move.
        Dead workers' leases are handed back first.
        """
        look = (self.workers, self.shards.workers(), ["look", self.clock(), self.worker])
        keys = [[self.shards.name(what, s) for what in COUNTED] for s in range(self.shards.count)]
        if self.cluster:  # (a call per shard, in its slot; nodes answer a pipeline in any order:
            # the looks go before and after)
            before = self.scripts([look])[0]
            per_shard = [c[0] for c in self.scripts([(self.counts, k, []) for k in keys])]
            after = self.scripts([look])[0]
        else:  # one call for every shard, one round trip, in order
            before, all_shards, after = self.scripts([look, (self.counts, [k for g in keys for k in g], []), look])
            per_shard = list(all_shards)
        (epoch, busy, dead), (epoch_after, busy_after, _) = before, after
        self._hand_back(job, dead)
        total = [0, 0, 0, 0]
        for shard, counted in enumerate(per_shard):
            for i, n in enumerate(counted):
                total[i] += int(n)
            if int(counted[0]):
                job.ready_shards.append(shard)
        job.count = (total[0], total[1], total[2], total[3])
        job.others_busy = max(int(busy), int(busy_after))
        job.stable = int(epoch) == int(epoch_after)

    def _look(self, job: Round) -> None:
        """The workers only (one call): who else is busy, and the dead workers' leases handed back."""
        _, busy, dead = self.crew("look")
        self._hand_back(job, dead)
        job.others_busy = int(busy)

    def _hand_back(self, job: Round, dead: list[Any]) -> None:
        """Every shard's leases of these *dead* workers back to ready, then the workers forgotten."""
        dead = [text(w) for w in dead if text(w) != self.worker]
        if not dead:
            return
        for shard in range(self.shards.count):
            job.reclaimed += int(self.reclaim(keys=self.shards.keys(shard), args=[self.boost, *dead]))
        self.crew("forget", *dead)
        job.dead_workers = dead
        self._fresh.update(range(self.shards.count))

    def _adopt_foreign(self, job: Round) -> None:
        """Members of the plain scrapy-redis key (e.g. a pickle pushed by stock scrapy-redis) are
        moved aside as rejected, never executed."""
        key = self.shards.key
        members = self.server.zrange(key, 0, 99)
        for member in members:
            self.server.hset(self.shards.name("rejected", 0), member, member)
            self.server.zrem(key, member)
        job.foreign_found = list(members)

    def _pop_plan(self, job: Round) -> tuple[list[int], float | None]:
        """The shards to pop from, round-robin from the shard after the last one that served (so
        every shard with work gets its turn), and the soonest wait of those that must wait."""
        n = self.shards.count
        now = self.clock()
        wait: float | None = None
        queue: list[int] = []
        for step in range(n):
            shard = (self.rr + step) % n
            at = self.shard_wait.get(shard, 0)
            if at > now:
                wait = at if wait is None else min(wait, at)
            else:
                queue.append(shard)
        return queue, wait

    def _pop_round(
        self, job: Round, batch: list[int], replies: list[Any], queue: list[int], wait: float | None
    ) -> None:
        """Lease up to ``job.pops`` entries: *batch*'s pops went with the round's writes (their
        *replies*); the pops of as many more shards as entries are still wanted go in one pipeline
        each, the shards that had nothing due making way for the next ones."""
        now = self.clock()
        tries: dict[int, int] = {}
        while True:
            for shard, res in zip(batch, replies):
                outcome = self._popped(job, shard, now, res)
                if outcome == "retry":  # the due domains were not the expected ones: again, at most 3 times
                    tries[shard] = tries.get(shard, 0) + 1
                    if tries[shard] < 3:
                        queue.insert(0, shard)
                elif isinstance(outcome, float):
                    wait = outcome if wait is None else min(wait, outcome)
            missing = job.pops - len(job.popped)
            if not queue or missing <= 0:
                break
            # the next shards, the first for what the others (one entry each) leave: a shard that
            # had nothing due makes way for the next, and no more is asked than is wanted
            batch, queue = queue[:missing], queue[missing:]
            wants = [missing - len(batch) + 1] + [1] * (len(batch) - 1)
            replies = self.scripts([self._pop_call(shard, now, n) for shard, n in zip(batch, wants)])
        job.wait = wait

    def _pop_call(self, shard: int, now: float, want: int) -> tuple[Any, list[str], list[Any]]:
        """The pop script's call on *shard* for up to *want* entries, gated on the domains its
        last reply said are due."""
        gated = self.registry is not None
        cands = self.cands.get(shard, []) if gated else []
        keys = self.shards.keys(shard)
        if cands:
            keys = [*keys, *(self.registry.health_key(d) for d in cands)]
        args = [self.boost, now, now + self.lease, self.worker, self.scan, 1 if gated else 0, want, *cands]
        return (self.pop, keys, args)

    def _popped(self, job: Round, shard: int, now: float, res: Any) -> float | str | None:
        """One pop's reply: "retry", the time to look at *shard* again (nothing due), or None."""
        status, extra, payload, requeued, dropped, states, nxt, more = res
        self.cands[shard] = [text(d) for d in nxt]
        job.requeued += int(requeued)
        job.dropped.extend(dropped)
        job.states.extend(states)
        status = text(status)
        if status == "retry":
            return "retry"
        self.empty.discard(shard)
        if status == "ok":
            job.popped.append((shard, text(extra), payload))
            job.popped += [(shard, text(more[i]), more[i + 1]) for i in range(0, len(more) - 1, 2)]
            self.rr = (shard + 1) % self.shards.count  # the next pop starts after the shard that served
        elif status == "wait":
            at = float(text(extra))
            self.shard_wait[shard] = at
            return at
        else:  # empty: look again later, or when another worker's push wakes this one
            self.shard_wait[shard] = now + self.empty_wait
            self.empty.add(shard)
        return None
