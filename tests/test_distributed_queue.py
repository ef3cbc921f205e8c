"""Unit tests of the leased Redis queue and its Lua scripts, against a real redis-server."""

from __future__ import annotations

import json
import os
import pickle
import time
from typing import Any

import pytest
from scrapy import Request, Spider
from scrapy.utils.test import get_crawler

from scrapy_openclaw import meta as M
from scrapy_openclaw.distributed import configure, serializer
from scrapy_openclaw.distributed.connection import client_from_settings
from scrapy_openclaw.distributed.queue import LEASE, LeasedDeadlineQueue
from scrapy_openclaw.distributed.rounds import COUNTED
from scrapy_openclaw.settings import OpenClawSettings
from tests.health_records import forge, record


class _Spider(Spider):
    name = "unit"

    def parse(self, response: Any) -> None:
        pass


class FakeClock:
    """A clock the test moves: leases and not-before times pass without sleeping."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def _queue(url: str, clock: Any = time.time, **settings: Any) -> LeasedDeadlineQueue:
    base = {"REDIS_URL": url, "OPENCLAW_DISTRIBUTED_LEASE": 2.0, "OPENCLAW_HEALTH_ENABLED": False}
    base.update(settings)
    crawler = get_crawler(_Spider, base)
    spider = _Spider.from_crawler(crawler)
    crawler.spider = spider
    server = client_from_settings(crawler.settings)  # a cluster client on a cluster
    return LeasedDeadlineQueue(server, spider, "%(spider)s:requests", serializer, clock=clock)


@pytest.fixture
def queues(redis_any: Any) -> Any:
    """Queues on one Redis, then on a 3-master Redis Cluster (the same scripts).

    ``clock=``: a :class:`FakeClock` shared by the queues of a test (default: the wall clock).
    """
    yield from queue_maker(redis_any)


def queue_maker(redis_any: Any) -> Any:
    """The body of the ``queues`` fixture (a generator: its loops stop at teardown)."""
    made: list[LeasedDeadlineQueue] = []

    def make(clock: Any = time.time, **settings: Any) -> LeasedDeadlineQueue:
        q = _queue(redis_any.url, clock=clock, **settings)
        made.append(q)
        return q

    yield make
    for q in made:
        if q._loop.running:
            q._loop.stop()


def test_priority_order_and_fifo(queues: Any) -> None:
    q = queues()
    q.push(Request("http://a.test/1", priority=0))
    q.push(Request("http://a.test/2", priority=5))
    q.push(Request("http://a.test/3", priority=0))
    urls = [q.pop().url for _ in range(3)]
    assert urls == ["http://a.test/2", "http://a.test/1", "http://a.test/3"]
    assert q.pop() is None


def test_deadline_aging_and_expired_boost(queues: Any) -> None:
    q = queues(OPENCLAW_POLICY={"defaults": {"deadline": {"aging_window": 10}}})
    now = time.time()
    q.push(Request("http://a.test/high", priority=50))
    # half way through its window: 0 + 100 * 0.5 = 50.x > 50 ... just beyond
    q.push(Request("http://a.test/aging", priority=0, meta={M.DEADLINE: now + 4}))
    q.push(Request("http://a.test/expired", priority=-10, meta={M.DEADLINE: now - 1}))
    urls = [q.pop().url for _ in range(3)]
    assert urls == ["http://a.test/expired", "http://a.test/aging", "http://a.test/high"]


def test_expired_drop_becomes_dead_letter(queues: Any) -> None:
    from scrapy_openclaw import signals as openclaw_signals

    q = queues(OPENCLAW_POLICY={"defaults": {"deadline": {"expired": "drop"}}})
    letters: list[Any] = []
    q.crawler.signals.connect(
        lambda dead_letter, **kw: letters.append(dead_letter), signal=openclaw_signals.dead_letter, weak=False
    )
    q.push(Request("http://a.test/late", meta={M.DEADLINE: time.time() - 1}))
    q.push(Request("http://a.test/ok"))
    assert q.pop().url == "http://a.test/ok"
    assert [d.url for d in letters] == ["http://a.test/late"]
    assert d_class(letters) == ["deadline"]


def _ready(q: LeasedDeadlineQueue) -> int:
    """Entries waiting in the ready sets (all domains)."""
    shards = [[q.shards.name(what, i) for what in COUNTED] for i in range(q.shards.count)]
    return sum(int(q.runner.counts(keys=keys)[0][0]) for keys in shards)


def _key(q: LeasedDeadlineQueue, what: str, domain: str = "a.test") -> str:
    """The key *what* of *domain*'s shard."""
    return q.shards.name(what, q.shards.of(domain))


def d_class(letters: list[Any]) -> list[str]:
    return [d.error_class for d in letters]


def test_not_before_waits_in_delayed_set(queues: Any) -> None:
    clock = FakeClock()
    q = queues(clock=clock)
    q.push(Request("http://a.test/later", meta={M.NOT_BEFORE: clock() + 0.6}))
    assert q.pop() is None
    assert len(q) == 1
    clock.advance(0.8)
    assert q.pop().url == "http://a.test/later"


def test_lease_ack_and_idempotency(queues: Any) -> None:
    q = queues()
    q.push(Request("http://a.test/1"))
    req = q.pop()
    lease = req.meta[LEASE]
    assert q.server.zcard(_key(q, "inflight")) == 1
    assert len(q) == 0  # our own lease is not pending work for us
    q.ack(lease)
    q.ack(lease)
    assert q.server.zcard(_key(q, "inflight")) == 0
    assert q.server.hlen(_key(q, "data")) == 0


def test_expired_lease_is_requeued_by_another_worker(queues: Any) -> None:
    clock = FakeClock()
    dead, live = queues(clock=clock), queues(clock=clock)
    dead.push(Request("http://a.test/1"))
    req = dead.pop()
    assert live.pop() is None
    assert len(live) == 1  # the dead worker's lease still counts for others
    clock.advance(2.2)  # lease is 2 s, the "dead" worker never heartbeats (no reactor)
    again = live.pop()
    assert again is not None and again.url == req.url
    assert live.stats.get_value("openclaw/distributed/lease_expired") == 1
    # the dead worker's late ack must not remove the live worker's lease
    dead.ack(req.meta[LEASE])
    assert live.server.hget(_key(live, "owner"), again.meta[LEASE].partition("/")[2]) is not None
    live.ack(again.meta[LEASE])
    assert len(live) == 0


def test_late_ack_after_requeue_removes_waiting_entry(queues: Any) -> None:
    clock = FakeClock()
    a, b = queues(clock=clock), queues(clock=clock)
    a.push(Request("http://a.test/1"))
    req = a.pop()
    clock.advance(2.2)
    b._tick()  # heartbeat of another worker re-queues the expired lease
    assert _ready(b) == 1
    a.ack(req.meta[LEASE])  # finished after all: no second fetch
    assert b.pop() is None and len(b) == 0


def test_after_a_failover_the_first_beat_takes_back_a_lease_the_new_server_has_waiting_inline(queues: Any) -> None:
    """The promoted replica never saw a pop: the entry waits there inline (no DATA value, no owner).
    The holder's first beat after the failover leases it to itself again, found by its place in
    the ready set, so another worker does not fetch it a second time; its ack then clears it."""
    a, b = queues(), queues()
    a.push(Request("http://a.test/held", priority=3))
    a.push(Request("http://a.test/other"))
    names = [_key(a, what) for what in ("q", "domains", "data", "inflight", "owner")]
    before = {k: a.server.dump(k) for k in names}  # (what the replica has: the pop not replicated)
    held = a.pop()
    assert held is not None and held.url == "http://a.test/held"
    for k, dumped in before.items():
        a.server.delete(k)
        if dumped is not None:
            a.server.restore(k, 0, dumped)
    assert a.server.hlen(_key(a, "data")) == 0 and _ready(a) == 2  # (both inline, the lease lost)
    a._reclaim = True
    a._tick()  # the first beat after the failover
    assert a.stats.get_value("openclaw/distributed/leases_reclaimed") is None  # (not a dead worker's)
    assert a.server.hget(_key(a, "owner"), held.meta[LEASE].partition("/")[2]) == a.worker.encode()
    assert _ready(a) == 1
    got = b.pop()
    assert got is not None and got.url == "http://a.test/other" and b.pop() is None
    a.ack(held.meta[LEASE])
    b.ack(got.meta[LEASE])
    assert a.server.hlen(_key(a, "data")) == 0 and a.server.zcard(_key(a, "inflight")) == 0 and _ready(a) == 0


def test_an_acknowledgement_sent_again_after_a_failover_finds_the_entry_waiting_inline(queues: Any) -> None:
    """Pop and ack both lost with the old master: the ack sent again (the replay) removes the entry
    the new server has waiting inline, so it is not fetched a second time; a retry copy's ack too."""
    a, b = queues(), queues()
    for path in ("done", "retried", "other"):
        a.push(Request(f"http://a.test/{path}"))
    names = [_key(a, what) for what in ("q", "domains", "data", "inflight", "owner", "found")]
    before = {k: a.server.dump(k) for k in names}
    done, retried = a.pop(), a.pop()
    assert [done.url, retried.url] == ["http://a.test/done", "http://a.test/retried"]
    a.ack(done.meta[LEASE])
    copy = retried.copy()
    copy.meta[M.NOT_BEFORE] = time.time() + 600  # (its copy waits: the original is finished)
    a.push(copy, dupe=("unit:dupefilter", "f" * 40))  # (a fingerprinted push: replayed)
    for k, dumped in before.items():  # the promoted replica: none of that reached it
        a.server.delete(k)
        if dumped is not None:
            a.server.restore(k, 0, dumped)
    assert _ready(a) == 3
    a._replay()
    a._kick()
    assert a.stats.get_value("openclaw/distributed/replayed_writes") == 2  # (the ack, the copy's push)
    assert _ready(a) == 1 and a.server.zcard(_key(a, "delayed")) == 1
    got = b.pop()
    assert got is not None and got.url == "http://a.test/other" and b.pop() is None


def test_retry_copy_acks_the_original_atomically(queues: Any) -> None:
    q = queues()
    q.push(Request("http://a.test/1"))
    req = q.pop()
    retry = req.copy()
    retry.meta[M.NOT_BEFORE] = time.time() + 30
    q.push(retry)
    assert q.server.zcard(_key(q, "inflight")) == 0
    assert q.server.zcard(_key(q, "delayed")) == 1


def test_heartbeat_keeps_lease(queues: Any) -> None:
    clock = FakeClock()
    a, b = queues(clock=clock), queues(clock=clock)
    a.push(Request("http://a.test/1"))
    a.pop()
    for _ in range(3):
        clock.advance(0.9)
        a._last_beat = 0
        a._tick()
    assert b.pop() is None  # still leased after 2.7 s > lease


def test_pickle_payload_is_refused_not_executed(queues: Any, tmp_path: Any) -> None:
    q = queues()
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self) -> Any:
            return (os.system, (f"touch {marker}",))

    q.server.zadd(q.key, {pickle.dumps(Evil(), protocol=-1): -10})  # popped first
    q.push(Request("http://a.test/good"))
    got = q.pop()
    assert got is not None and got.url == "http://a.test/good"
    assert not marker.exists()
    assert q.stats.get_value("openclaw/distributed/rejected") == 1
    assert q.server.hlen(q.shards.name("rejected", 0)) == 1


def test_serializer_refuses_garbage() -> None:
    with pytest.raises(serializer.RefusedPayload, match="pickle"):
        serializer.loads(pickle.dumps({"url": "x"}))
    with pytest.raises(serializer.RefusedPayload):
        serializer.loads(b'{"no": "url"}')
    assert serializer.loads(serializer.dumps({"url": "http://a"})) == {"url": "http://a"}


def test_configure_writes_addon_priority_settings() -> None:
    from scrapy.settings import Settings

    settings = Settings({"REDIS_URL": "redis://127.0.0.1:1/0"})
    configure(settings, OpenClawSettings.read(settings))
    assert settings["SCHEDULER_QUEUE_CLASS"].endswith("LeasedDeadlineQueue")
    assert settings["SCHEDULER_SERIALIZER"] == "scrapy_openclaw.distributed.serializer"
    assert settings["OPENCLAW_DLQ_URI"] == "redis://127.0.0.1:1/0"
    assert settings.getpriority("SCHEDULER") == settings.getpriority("SCHEDULER_PERSIST")
    user = Settings({"SCHEDULER_PERSIST": False}, priority="project")
    configure(user, OpenClawSettings.read(user))
    assert user.getbool("SCHEDULER_PERSIST") is False


def test_redis_health_registry_shares_tokens(redis_server: Any) -> None:
    from scrapy_openclaw.distributed.health import RedisHealthRegistry
    from scrapy_openclaw.errors import Classification, ErrorClass

    policy = {"defaults": {"health": {"initial_rate": 8.0, "burst": 2}}}  # (2 tokens: a quarter second's worth)
    regs = []
    for _ in range(2):
        crawler = get_crawler(_Spider, {"REDIS_URL": redis_server.url, "OPENCLAW_POLICY": policy})
        regs.append(RedisHealthRegistry(crawler))
    now = time.time()
    taken = [r.try_acquire("a.test", now) for r in regs for _ in range(2)]
    assert taken.count(True) == 2  # one burst of 2 for both workers together
    c429 = Classification(ErrorClass.PROTOCOL_RETRYABLE, "http_429", 429)
    regs[0].record_failure("a.test", c429, now, retry_after=5)
    # the other worker's next call sees the hold (its cache refreshes from the reply)
    assert regs[1].try_acquire("a.test", now + 2, token=False) is False
    state = regs[1].state("a.test", now + 2)
    assert state.hold_until >= now + 4.9 and state.health < 100 and state.failures == 1
    assert regs[1].ready_at("a.test", now + 2) >= now + 4.9


def test_held_domain_does_not_stall_others(queues: Any) -> None:
    """Per-domain ready sets: a held domain with many (higher-priority) requests steps aside."""
    q = queues(
        OPENCLAW_HEALTH_ENABLED=True,
        OPENCLAW_DISTRIBUTED_SCAN=2,
        OPENCLAW_HEALTH_REGISTRY_CLASS="scrapy_openclaw.distributed.health.RedisHealthRegistry",
    )
    assert q.registry is not None
    for host in ("h1", "h2", "h3", "h4", "h5"):
        for i in range(40):
            q.push(Request(f"http://{host}.test/{i}", priority=10))
        q.registry.hold(f"{host}.test", time.time() + 60)
    q.push(Request("http://free.test/1", priority=0))
    got = q.pop()
    assert got is not None and got.url == "http://free.test/1"
    assert q.pop() is None  # everything else is held: a wait, not a busy loop
    assert q._wake_at <= time.time() + 61
    assert len(q) == 200


def test_given_up_domain_is_handed_out_ungated(queues: Any) -> None:
    """A domain down past give_up_after steps back into the pop (no token, no wait), so the
    worker's health middleware turns its requests into dead letters instead of waiting; a
    domain down for less still waits out its cool-down."""
    from scrapy_openclaw.errors import Classification, ErrorClass

    refused = Classification(ErrorClass.NETWORK, "connection_refused")
    q = queues(
        OPENCLAW_HEALTH_ENABLED=True,
        OPENCLAW_POLICY={
            "defaults": {"health": {"give_up_after": 2.0, "circuit_failures": 1, "circuit_cooldown": 60.0}}
        },
        OPENCLAW_HEALTH_REGISTRY_CLASS="scrapy_openclaw.distributed.health.RedisHealthRegistry",
    )
    for i in range(3):
        q.push(Request(f"http://down.test/{i}", priority=1))
    q.push(Request("http://flaky.test/0"))
    now = time.time()
    for domain in ("down.test", "flaky.test"):  # both open, with a 60 s cool-down ahead
        assert q.registry.record_failure(domain, refused, now - 1.0) == "open"
    # down.test's outage began 5 s ago (another worker saw its first failures)
    forge(q.server, q.registry._key("down.test"), down_since=now - 5.0)
    assert not q.registry.given_up("down.test")  # this worker's cache is a step behind ...
    got = [q.pop() for _ in range(3)]
    assert sorted(r.url for r in got if r is not None) == [f"http://down.test/{i}" for i in range(3)]
    assert q.registry.given_up("down.test")  # ... until the pop's reply refreshed it
    assert q.pop() is None and not q.registry.given_up("flaky.test")  # down 1 s: it waits
    assert len(q) == 1


def test_item_failures_requeue_a_bounded_number_of_times(queues: Any) -> None:
    from scrapy_openclaw import signals as openclaw_signals

    q = queues(OPENCLAW_DISTRIBUTED_MAX_RELEASES=2)
    letters: list[Any] = []
    q.crawler.signals.connect(
        lambda dead_letter, **kw: letters.append(dead_letter), signal=openclaw_signals.dead_letter, weak=False
    )
    q.push(Request("http://a.test/1"))
    for _ in range(2):
        req = q.pop()
        q.release(req.meta[LEASE])  # its item failed in a pipeline: fetched again
        assert letters == []
    req = q.pop()
    q.release(req.meta[LEASE])
    assert [(d.url, d.reason) for d in letters] == [("http://a.test/1", "item_failed")]
    assert q.pop() is None and len(q) == 0
    assert q.server.hlen(_key(q, "data")) == 0


def test_workers_with_another_aging_boost_leave_no_stale_entry(queues: Any) -> None:
    policy = {"defaults": {"deadline": {"aging_window": 10}}}
    a = queues(OPENCLAW_POLICY=policy, OPENCLAW_QUEUE_AGING_BOOST=10.0)
    b = queues(OPENCLAW_POLICY=policy, OPENCLAW_QUEUE_AGING_BOOST=20.0)
    a.push(Request("http://a.test/1", meta={M.DEADLINE: time.time() + 60}))
    first = b.pop()  # b's boost differs: its unindex misses a's aging member
    assert first is not None and first.url == "http://a.test/1"
    a.push(Request("http://a.test/2", meta={M.DEADLINE: time.time() + 60}))
    second = a.pop()
    assert second is not None and second.url == "http://a.test/2"
    assert a.server.zcard(_key(a, "a")) == 0  # the stale member was dropped on the way


def test_pops_take_turns_across_shards(queues: Any) -> None:
    q = queues()
    a, b = "a.test", next(f"b{i}.test" for i in range(100) if q.shards.of(f"b{i}.test") != q.shards.of("a.test"))
    for i in range(4):
        q.push(Request(f"http://{a}/{i}"))
        q.push(Request(f"http://{b}/{i}"))
    hosts = [q.pop().url.split("/")[2] for _ in range(6)]
    assert hosts.count(a) == 3 and hosts.count(b) == 3
    assert all(x != y for x, y in zip(hosts, hosts[1:]))  # alternating


def test_a_released_domain_is_popped_again_at_once(queues: Any) -> None:
    """An operator's release reaches the pop now, not at the old hold's end: the shard's last
    pop said "wait 600 s", and no push to that shard came to say otherwise (the domain's
    requests were all queued before the hold). In a crawl it stalled the released domain."""
    from scrapy_openclaw.control.channel import ControlChannel
    from scrapy_openclaw.control.controller import Controller

    q = queues(
        OPENCLAW_HEALTH_ENABLED=True,
        OPENCLAW_HEALTH_REGISTRY_CLASS="scrapy_openclaw.distributed.health.RedisHealthRegistry",
    )
    held, free = "127.0.0.2", "127.0.0.3"  # (different shards)
    assert q.shards.of(held) != q.shards.of(free)
    controller = Controller.for_crawler(q.crawler)
    assert controller.registry is q.registry
    controller.channel = ControlChannel(q.crawler, controller, q.server, q.link, poll=0.2)
    for i in range(3):
        q.push(Request(f"http://{held}/{i}"))
    q.push(Request(f"http://{free}/0"))
    controller.execute({"command": "hold", "domain": held, "for": 600}, who="test")
    got = q.pop()
    assert got is not None and got.url == f"http://{free}/0"
    assert q.pop() is None  # the held domain's shard waits for the hold's end
    assert q.runner.shard_wait[q.shards.of(held)] > time.time() + 500
    controller.execute({"command": "release", "domain": held}, who="test")
    got = q.pop()
    assert got is not None and got.url.startswith(f"http://{held}/")


def test_an_entry_holds_its_info_and_payload_in_one_value(queues: Any) -> None:
    """A ready entry without a deadline is its ready-set member alone (payload included); one with
    a deadline, or a delayed one, is one DATA value; a lease of either is held by DATA, its info
    line rebuilt byte for byte (priority, domain), and gone with the acknowledgement."""
    q = queues()
    q.push(Request("http://a.test/deadline", priority=2, meta={M.DEADLINE: time.time() + 600}))
    q.push(Request("http://a.test/plain"))
    q.push(Request("http://a.test/low", priority=-3))
    assert q.server.hlen(_key(q, "data")) == 1  # (the deadline's; the others are inline)
    q.push(Request("http://a.test/post", method="POST", body=b"x" * 2000, priority=-5))
    assert q.server.hlen(_key(q, "data")) == 2  # (a large payload is not: a pop reads heads)
    assert not q.server.exists(_key(q, "info"))  # (one hash entry per request, not two)
    [info, large] = sorted((v.split(b"\n", 1)[0].split(b"\x01") for v in q.server.hvals(_key(q, "data"))), key=len)[
        ::-1
    ]
    assert large == [b"a.test", b"-5"]
    assert info[:2] == [b"a.test", b"2"] and info[3:] == [b"300.0", b"boost"]
    assert float(info[2]) == pytest.approx(time.time() + 600, abs=60)
    members = sorted((m.split(b"\x01") for m in q.server.zrange(_key(q, "q"), 0, -1)), key=len)
    assert [len(m[1]) for m in members] == [11, 11, 11, 11]  # (the compact priority order)
    assert [len(m) for m in members] == [3, 3, 4, 4]  # (inline: the id, then the payload)
    assert {b"http://a.test/plain", b"http://a.test/low"} == {
        json.loads(m[3].decode())["url"].encode() for m in members[2:]
    }
    leased = [q.pop() for _ in range(4)]
    assert [r.url for r in leased] == [
        "http://a.test/deadline",
        "http://a.test/plain",
        "http://a.test/low",
        "http://a.test/post",
    ]
    assert leased[3].body == b"x" * 2000
    assert q.server.zcard(_key(q, "q")) == 0
    values = {r.url: q.server.hget(_key(q, "data"), r.meta[LEASE].partition("/")[2]) for r in leased}
    assert values["http://a.test/plain"].split(b"\n", 1)[0] == b"a.test"  # priority 0 left out
    assert values["http://a.test/low"].split(b"\n", 1)[0] == b"a.test\x01-3"
    for r in leased:
        q.ack(r.meta[LEASE])
    assert q.server.hlen(_key(q, "data")) == 0 and q.server.zcard(_key(q, "inflight")) == 0


def test_an_entry_with_json_info_from_before_the_compact_form_is_served_in_turn_and_cleaned_up(
    queues: Any,
) -> None:
    """Entries queued before 2026-12-06 (JSON info, a 22-character priority order in the ready set)
    and new ones share a domain: each is served (the old one first: its order sorts first), and
    acknowledged without a trace; a domain the compact form cannot hold is queued as JSON."""
    q = queues()
    request = Request("http://a.test/old", priority=5)
    payload = q.encode(request)
    q._encoded = None
    entry = "hou5yrxqs820ed29006u"  # (the id format of that version and this one)
    server = q.server
    server.hset(_key(q, "data"), entry, '{"dom":"a.test","p":5}\n' + payload)
    server.zadd(_key(q, "q"), {f"a.test\x01{1e10 - 5:022.6f}\x01{entry}": 0})
    server.zadd(_key(q, "domains"), {"a.test": 0})
    q.push(Request("http://a.test/new", priority=9))
    got = [q.pop(), q.pop()]
    assert [r.url for r in got] == ["http://a.test/old", "http://a.test/new"]
    for r in got:
        q.ack(r.meta[LEASE])
    assert server.hlen(_key(q, "data")) == 0 and server.zcard(_key(q, "q")) == 0
    assert server.zcard(_key(q, "inflight")) == 0
    assert q._info(Request("http://b.test/"), '{"odd":1}') == '{"dom":"{\\"odd\\":1}"}'
    assert q._info(Request("http://b.test/", priority=-3), "b.test") == "b.test\x01-3"


def test_an_entry_of_format_2_held_by_its_data_value_is_served_in_turn_beside_inline_ones(queues: Any) -> None:
    """A crawl written by the previous version (format 2: every entry a DATA value, its ready-set
    member "<domain>\\1<order>\\1<id>") goes on with this one's inline entries in one order."""
    q = queues()
    payload = q.encode(Request("http://a.test/old", priority=5))
    q._encoded = None
    entry = "hou5yrxqs820ed29006u"
    server = q.server
    server.hset(_key(q, "data"), entry, "a.test\x015\n" + payload)
    server.zadd(_key(q, "q"), {f"a.test\x01{int(1e10) - 5:011d}\x01{entry}": 0})
    server.zadd(_key(q, "domains"), {"a.test": 0})
    q.push(Request("http://a.test/new", priority=9))
    q.push(Request("http://a.test/last", priority=5))  # (same priority, a later id: after the old one)
    assert _ready(q) == 3
    got = [q.pop() for _ in range(3)]
    assert [r.url for r in got] == ["http://a.test/new", "http://a.test/old", "http://a.test/last"]
    for r in got:
        q.ack(r.meta[LEASE])
    assert server.hlen(_key(q, "data")) == 0 and _ready(q) == 0
    assert server.zcard(_key(q, "inflight")) == 0 and server.zcard(_key(q, "domains")) == 0


def test_an_entry_queued_by_an_earlier_version_is_still_served_and_cleaned_up(queues: Any) -> None:
    """Entries of the layout before info and payload shared a value (info in the info hash)."""
    q = queues()
    request = Request("http://a.test/old")
    payload = q.encode(request)
    q._encoded = None
    entry = "1796409139.440116-1493ca-000000000011"  # (the id format of that version)
    server = q.server
    server.hset(_key(q, "data"), entry, payload)
    server.hset(_key(q, "info"), entry, json.dumps({"p": 0, "d": 0.0, "w": 300.0, "x": "boost", "dom": "a.test"}))
    server.zadd(_key(q, "q"), {f"a.test\x01{1e10:022.6f}\x01{entry}": 0})
    server.zadd(_key(q, "domains"), {"a.test": 0})
    server.incr(_key(q, "count"))
    q.push(Request("http://a.test/new"))
    got = [q.pop(), q.pop()]
    assert [r.url for r in got] == ["http://a.test/old", "http://a.test/new"]  # (FIFO across both id formats)
    for r in got:
        q.ack(r.meta[LEASE])
    assert server.hlen(_key(q, "data")) == 0
    assert not server.exists(_key(q, "info"))
    assert _ready(q) == 0


def test_a_health_record_is_one_read_and_one_write_and_keeps_the_policy_it_was_handed(redis_server: Any) -> None:
    from redis import Redis

    from scrapy_openclaw.distributed.health import RedisHealthRegistry, policy_id

    def registry(rate: float) -> RedisHealthRegistry:
        policy = {"defaults": {"health": {"initial_rate": rate}}}
        return RedisHealthRegistry(get_crawler(_Spider, {"REDIS_URL": redis_server.url, "OPENCLAW_POLICY": policy}))

    old, new = registry(8.0), registry(4.0)
    assert policy_id(old.policy_json("a.test")) != policy_id(new.policy_json("a.test"))
    server = Redis.from_url(redis_server.url)
    server.config_resetstat()
    now = time.time()
    for i in range(3):
        old.record_success("a.test", 0.1, now + i)
    key = old.health_key("a.test")
    stats = server.info("commandstats")
    assert int(stats["cmdstat_set"]["calls"]) == 3  # one write per record, the policy with the state
    assert int(stats["cmdstat_get"]["calls"]) == 3  # (its one read)
    assert "cmdstat_hset" not in stats and "cmdstat_hmget" not in stats
    stored = record(server, key)
    assert stored["pid"] == policy_id(old.policy_json("a.test")) and stored["pol"]["initial_rate"] == 8.0
    new.record_success("a.test", 0.1, now + 4)  # (a worker started with another policy file)
    stored = record(server, key)
    assert stored["pid"] == policy_id(new.policy_json("a.test")) and stored["pol"]["initial_rate"] == 4.0
    assert int(server.info("commandstats")["cmdstat_set"]["calls"]) == 4


def test_a_domain_made_ready_sooner_is_popped_at_once_not_at_the_time_redis_parked_it(queues: Any) -> None:
    """The pop parks a domain that has no token in its shard's domain index until its ready
    time (a 600 s operator hold's end). When the domain becomes ready sooner (the operator
    releases it, refusals turn out pace-independent, the site declares a higher limit), the
    worker that saw it says so with its next pop, and the entry goes out at once."""
    q = queues(
        OPENCLAW_HEALTH_ENABLED=True,
        OPENCLAW_HEALTH_REGISTRY_CLASS="scrapy_openclaw.distributed.health.RedisHealthRegistry",
    )
    q.push(Request("http://held.test/0"))
    q.registry.control("held.test", ctl_hold=time.time() + 600)
    assert q.pop() is None  # parked in Redis until the hold's end
    assert q.pop() is None
    q.registry.control("held.test", ctl_hold=0)  # released
    got = q.pop()
    assert got is not None and got.url == "http://held.test/0"


def test_refusals_found_pace_independent_in_redis_wake_the_domain_its_shard_parked(queues: Any) -> None:
    """The pace comes back when Redis's record says the refusals are pace-independent (judged
    there, maybe on another worker's answers): the worker that reads it wakes the domain, and
    its next pop takes the entry instead of waiting for the slow pace's next token."""
    from scrapy_openclaw.distributed.fields import read_state

    q = queues(
        OPENCLAW_HEALTH_ENABLED=True,
        OPENCLAW_HEALTH_REGISTRY_CLASS="scrapy_openclaw.distributed.health.RedisHealthRegistry",
    )
    for i in range(2):
        q.push(Request(f"http://every3rd.test/{i}"))
    key = q.registry.health_key("every3rd.test")
    assert q.pop() is not None
    now = time.time()
    # refused every third answer whatever the pace: cut to the floor, no token for 5 s
    forge(q.server, key, rate=0.2, tokens=0.0, updated=now, cuts=1, threshold=0.2)
    q.registry.refresh("every3rd.test", read_state(q.server, key))
    assert q.pop() is None  # parked in Redis until the slow pace's next token
    # another worker's answers proved them pace-independent: the pace is back
    forge(q.server, key, rate=10.0, tokens=1.0, cuts=0, threshold=None, refusals_flat=0.33)
    q.registry.refresh("every3rd.test", read_state(q.server, key))
    got = q.pop()
    assert got is not None and got.url == "http://every3rd.test/1"


def test_a_crawl_is_marked_with_its_format_and_an_earlier_versions_crawl_is_said(queues: Any, caplog: Any) -> None:
    """A new crawl gets this version's format, silently; a crawl an earlier version started
    (its mark older, or none on a crawl with work) is read, marked, and the operator told that
    the earlier workers cannot read what this one queues; a newer format is refused."""
    import logging

    from scrapy_openclaw.distributed.queue import FORMAT
    from scrapy_openclaw.exceptions import QueueFormatError

    q = queues()
    key = q.shards.format_key()
    with caplog.at_level(logging.WARNING, logger="scrapy_openclaw.distributed.queue"):
        q.check_format(0)
        assert q.server.get(key) == str(FORMAT).encode() and not caplog.records
        q.server.delete(key)
        q.check_format(3)  # (work in a crawl without the mark: an earlier version's)
        q.server.set(key, 1)
        q.check_format(0)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and all("earlier scrapy-openclaw" in m and "upgrade them" in m for m in said)
    assert q.server.get(key) == str(FORMAT).encode()
    q.server.set(key, FORMAT + 1)
    with pytest.raises(QueueFormatError, match="newer scrapy-openclaw"):
        q.check_format(0)


def _calls(server: Any, reset: bool = False) -> dict[str, int]:
    """``INFO commandstats`` calls summed over the nodes (*reset*: zeroed first)."""
    nodes = [n.redis_connection for n in server.get_primaries()] if hasattr(server, "get_primaries") else [server]
    calls: dict[str, int] = {}
    for node in nodes:
        if reset:
            node.config_resetstat()
            continue
        for name, stat in node.info("commandstats").items():
            calls[name] = calls.get(name, 0) + int(stat["calls"])
    return calls


def test_one_pop_call_leases_several_entries_within_the_domains_tokens(queues: Any) -> None:
    """A round that wants several entries asks one shard for them all: one read and one write
    of the domain's health record, one token per entry, and no more entries than the domain
    has tokens (the others stay queued for its next token); the leases are written together."""
    from scrapy_openclaw.distributed.fields import read_state
    from scrapy_openclaw.distributed.rounds import Round

    clock = FakeClock()  # (no token comes back while the test runs)
    q = queues(
        clock,
        OPENCLAW_HEALTH_ENABLED=True,
        OPENCLAW_POLICY={"defaults": {"health": {"initial_rate": 12.0, "burst": 3}}},  # (3 tokens)
        OPENCLAW_HEALTH_REGISTRY_CLASS="scrapy_openclaw.distributed.health.RedisHealthRegistry",
    )
    for i in range(6):
        q.push(Request(f"http://many.test/{i}"))
    key, shard = q.registry.health_key("many.test"), q.shards.of("many.test")
    tokens = read_state(q.server, key)["tokens"]
    assert 2 <= tokens < 6
    q.runner.cands[shard], q.runner.rr = ["many.test"], shard  # (due, and its shard's turn)
    _calls(q.server, reset=True)
    job = Round()
    job.pops = 8
    q.runner.run(job)
    assert [s for s, _, _ in job.popped] == [shard] * int(tokens)  # one entry per token
    assert len({entry for _, entry, _ in job.popped}) == int(tokens)
    calls = _calls(q.server)
    assert calls["cmdstat_get"] == 1 and calls["cmdstat_set"] == 1  # the record: read once, written once
    # the leases' writes, one command each for the call: out of the ready set, into the in-flight
    # set and the domain's score (one ZADD each), owner and payload (one HSET each)
    assert calls["cmdstat_zrem"] == 1 and calls["cmdstat_zadd"] == 2 and calls["cmdstat_hset"] == 2
    assert read_state(q.server, key)["tokens"] < 1
    assert job.states[0] == b"many.test" and len(job.states) == 2  # (the worker's cache gets it once)
    clock.advance(10)  # tokens again (the pop's last reply named the domain: it may gate it)
    assert q.runner.cands[shard] == ["many.test"]
    q.runner.rr = shard
    job = Round()
    job.pops = 3
    q.runner.run(job)
    assert len(job.popped) == 6 - int(tokens)
    assert all(s == shard for s, _, _ in job.popped)  # (the first leases had expired: 2 s)


def test_a_worker_turning_idle_makes_another_count_again_unless_it_found_the_crawl_over(queues: Any) -> None:
    """A worker turning idle tells the others to count the crawl's work (it may be over). One
    whose last count already found nothing left and no other worker busy learns nothing new
    from it: three workers finishing together each counted every shard twice more before."""
    clock = FakeClock()
    q = queues(clock=clock)
    len(q)  # (a count: nothing queued, nobody busy)
    counted = q.work.counted_at
    clock.advance(0.05)
    q._on_wake(set(), True)
    assert q.work.counted_at == counted  # no count: the crawl was over but for this worker
    other = queues(clock=clock)
    other.runner.join()  # another worker, busy
    clock.advance(0.05)
    len(q)
    assert q.work.others_busy == 1
    clock.advance(0.05)
    q._on_wake(set(), True)
    assert q.work.counted_at == clock.now  # counted again at once: the other one may be done
    other.runner.crew("leave")
    q.push(Request("http://a.test/1"))
    len(q)
    assert q.work.others_busy == 0 and q.work.ready == 1
    clock.advance(0.05)
    q._on_wake(set(), True)
    assert q.work.counted_at == clock.now  # work was left: counted again


def test_a_worker_the_engine_finds_empty_leases_more_ahead_and_less_once_redis_has_less(queues: Any) -> None:
    """A pop round leases ``prefetch`` entries ahead; one that follows the engine finding the
    buffer empty, and gets all it asked, makes the next ask twice as many (fewer, fuller rounds
    when the downloader drains a round's worth before the next one is back), up to twice
    ``CONCURRENT_REQUESTS``; a round that gets less than it asked halves it, down to ``prefetch``."""
    from scrapy_openclaw.distributed.rounds import Round

    q = queues(CONCURRENT_REQUESTS=6)
    assert (q.prefetch, q.ahead, q.most_ahead) == (4, 4, 12)
    for i in range(60):
        q.push(Request(f"http://d{i}.test/"))

    def pop_round(ran_dry: bool) -> tuple[int, int]:
        q._ran_dry = ran_dry
        job = Round()
        job.pops = q.ahead
        q._apply(job, q.runner.run(job))
        return job.pops, len(job.popped)

    assert pop_round(ran_dry=True) == (4, 4) and q.ahead == 8  # all it asked, after the engine found none
    assert pop_round(ran_dry=False) == (8, 8) and q.ahead == 8  # the buffer never ran dry: as it was
    assert pop_round(ran_dry=True) == (8, 8) and q.ahead == 12  # (at most twice CONCURRENT_REQUESTS)
    asked, popped = pop_round(ran_dry=True)
    while popped == asked:  # (until the 60 run out)
        assert q.ahead == 12
        asked, popped = pop_round(ran_dry=True)
    assert q.ahead == 6  # Redis had less than asked: halved
    while popped:
        asked, popped = pop_round(ran_dry=True)
    assert q.ahead == 4  # (never below prefetch)
    assert len(q._ready) == 60
    q._ready.clear()
    assert q.pop() is None and q._ran_dry  # the engine asked and found the buffer empty


def test_a_waiting_worker_reads_the_wake_stream_in_one_call_on_a_cluster_too(queues: Any) -> None:
    """A hungry worker's wait is one ``XREAD BLOCK`` on the stream's node: redis-py's cluster
    client asked ``COMMAND GETKEYS`` before every XREAD (its keys have no fixed place), two
    round trips per wait and an idle cluster worker's calls doubled."""
    import threading

    from scrapy_openclaw.distributed import wakeup

    q = queues()
    key = q.shards.workers()[3]
    woken: list[tuple[set[int], bool]] = []
    got = threading.Event()

    def on_wake(shards: set[int], idle: bool) -> None:
        woken.append((shards, idle))
        got.set()

    waiter = wakeup.Wakeup(q.server, key, on_wake, lambda fn, *args: fn(*args), block=0.2)
    _calls(q.server, reset=True)
    waiter.start()
    waiter.want(True)
    try:
        for _ in range(3):  # (a few waits that time out empty, then one that gets an entry)
            time.sleep(0.25)
        wakeup.notify(q.server, key, {3, 5}, idle=True)
        assert got.wait(10)
    finally:
        waiter.stop()
    assert woken == [({3, 5}, True)]
    calls = _calls(q.server)
    assert calls["cmdstat_xread"] >= 1  # (how many waits timed out first depends on the machine)
    assert "cmdstat_command" not in calls


def test_the_queue_and_the_shared_health_registry_of_a_crawler_use_one_client(redis_any: Any) -> None:
    """One client per crawler: the Redis thread that runs the queue's rounds and the registry's
    records holds one set of connections (a handshake of two or three round trips each), and a
    cluster's slot map is read once."""
    from scrapy_openclaw.distributed.health import RedisHealthRegistry
    from scrapy_openclaw.distributed.scheduler import OpenClawRedisScheduler

    def crawler() -> Any:
        from scrapy.settings import Settings

        settings = Settings({"REDIS_URL": redis_any.url})
        configure(settings, OpenClawSettings.read(settings))  # (what the add-on sets in distributed mode)
        names = ("REDIS_URL", "REDIS_PARAMS", "SCHEDULER_QUEUE_CLASS", "SCHEDULER_SERIALIZER", "DUPEFILTER_CLASS")
        made = get_crawler(_Spider, {name: settings[name] for name in names})
        made.spider = _Spider.from_crawler(made)
        return made

    first = crawler()
    registry = RedisHealthRegistry(first)
    scheduler = OpenClawRedisScheduler.from_crawler(first)
    assert scheduler.server is registry.server
    assert OpenClawRedisScheduler.from_crawler(crawler()).server is not registry.server  # (one per crawler)


def test_a_signal_about_a_domain_goes_to_redis_at_once_a_success_waits_for_the_next_round(redis_server: Any) -> None:
    """During a crawl a health record rides the queue's next round (up to
    ``OPENCLAW_DISTRIBUTED_ROUND_GAP``); one
    the other workers must learn soon (a 429's hold) goes at once, the records waiting with it."""
    from scrapy_openclaw.distributed.fields import read_state
    from scrapy_openclaw.distributed.health import RedisHealthRegistry
    from scrapy_openclaw.errors import Classification, ErrorClass

    reg = RedisHealthRegistry(get_crawler(_Spider, {"REDIS_URL": redis_server.url}))
    now = time.time()
    reg.record_success("a.test", 0.1, now)  # (known to Redis before the crawl's thread starts)
    link = reg.link
    link.ride_wait = 0.05  # (as the queue sets it: the round gap)
    link.start_background()
    try:
        reg.record_success("a.test", 0.1, now + 0.1)
        assert len(link._scripts) == 1 and link._ride_timer is not None  # waits for a round
        c429 = Classification(ErrorClass.PROTOCOL_RETRYABLE, "http_429", 429)
        reg.record_failure("a.test", c429, now + 0.2, retry_after=5)
        assert link._ride_timer is None  # sent at once, with the success before it
    finally:
        assert link._executor is not None
        link._executor.shutdown(wait=True)
    assert not link._scripts
    state = read_state(reg.server, reg.health_key("a.test"))
    assert state["hold_until"] >= now + 5 and state["failures"] == 1


def test_the_round_gap_is_a_setting_and_the_longest_a_health_record_waits_for_a_round(queues: Any) -> None:
    """``OPENCLAW_DISTRIBUTED_ROUND_GAP``: rounds further apart (fewer round trips, more pages
    crawled twice after a crash); a health record waits for a round no longer than that."""
    assert queues().round_gap == 0.05
    q = queues(OPENCLAW_DISTRIBUTED_ROUND_GAP=0.2)
    assert q.round_gap == 0.2 and q.link.ride_wait == 0.2
