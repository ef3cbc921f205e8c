"""The Redis queue pops in the local queue's order: priority, deadline aging, expired deadlines.

The same requests go through the local ``DeadlinePriorityQueue`` (the add-on's
``SCHEDULER_PRIORITY_QUEUE``) and the Redis ``LeasedDeadlineQueue`` (a real
redis-server), both on one fake clock, and come out in the same order. What
is compared, and why not more:

* **One domain**: the whole pop order, also while time passes between pops
  (aging lines cross priorities, deadlines expire and jump to the front, or
  are dropped as dead letters with ``expired: drop``).
* **Several domains**: each domain's own order, and the sequence of effective
  priorities (``e(t)``, expired ones first by deadline). Which of several
  domains *tied* on that score goes first is round-robin on both sides, but
  not the same round-robin: the local queue ranks a never-served domain by
  when it was first queued, the Redis queue by its name (served ones go by
  when they were last served on both). Pops happen at one instant here, so
  each domain's order does not depend on how the domains interleave.
* **One shard** (``OPENCLAW_DISTRIBUTED_SHARDS = 1``): with several shards
  the Redis queue's pops take turns across shards (one Lua script per shard,
  one cluster slot), so the global order is the local one only within a shard.
* **FIFO within a priority**: the Redis queue is FIFO among equal priorities
  (time-ordered entry ids); the local queue follows Scrapy's memory queue
  class, LIFO by default, so the local side here gets ``FifoMemoryQueue``.

Numbers are exact binary fractions (boost 128, aging window 16: the aging
slope is 8 points a second; times on 1/8 s), so both sides' arithmetic is
exact and a tie on one side is a tie on the other.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scrapy import Request, Spider
from scrapy.squeues import FifoMemoryQueue
from scrapy.utils.test import get_crawler

from scrapy_openclaw import meta as M
from scrapy_openclaw import signals as openclaw_signals
from scrapy_openclaw.distributed import serializer
from scrapy_openclaw.distributed.connection import client_from_settings
from scrapy_openclaw.distributed.queue import LeasedDeadlineQueue
from scrapy_openclaw.pqueues import DeadlinePriorityQueue

T0 = 1_800_000_000.0
BOOST, WINDOW = 128.0, 16.0


class _Spider(Spider):
    name = "parity"

    def parse(self, response: Any) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


class Pair:
    """The local and the Redis queue, same settings, one clock; dead letters of both recorded."""

    def __init__(self, redis_url: str, expired: str = "boost") -> None:
        self.clock = Clock()
        self.dead: dict[str, list[str]] = {"local": [], "redis": []}
        base = {
            "REDIS_URL": redis_url,
            "OPENCLAW_HEALTH_ENABLED": False,  # (domain health gating is not what is compared here)
            "OPENCLAW_DISTRIBUTED_SHARDS": 1,
            "OPENCLAW_QUEUE_AGING_BOOST": BOOST,
            "OPENCLAW_POLICY": {"defaults": {"deadline": {"aging_window": WINDOW, "expired": expired}}},
        }
        local_crawler = self._crawler(base, "local")
        self.local = DeadlinePriorityQueue.from_crawler(local_crawler, FifoMemoryQueue, "")
        self.local._clock = self.clock
        redis_crawler = self._crawler(base, "redis")
        server = client_from_settings(redis_crawler.settings)
        server.flushdb()
        self.remote = LeasedDeadlineQueue(
            server, redis_crawler.spider, "%(spider)s:requests", serializer, clock=self.clock
        )

    def _crawler(self, settings: dict[str, Any], side: str) -> Any:
        crawler = get_crawler(_Spider, settings)
        crawler.spider = crawler._create_spider()
        crawler.signals.connect(
            lambda dead_letter, **kw: self.dead[side].append(dead_letter.url),
            signal=openclaw_signals.dead_letter,
            weak=False,
        )
        return crawler

    def push(self, url: str, priority: int, deadline: float | None) -> None:
        for queue in (self.local, self.remote):
            meta = {} if deadline is None else {M.DEADLINE: deadline}
            queue.push(Request(url, priority=priority, meta=meta))

    def pop_both(self) -> tuple[Request | None, Request | None]:
        return self.local.pop(), self.remote.pop()

    def close(self) -> None:
        self.local.close()
        if self.remote._loop.running:
            self.remote._loop.stop()


@pytest.fixture
def pair(redis_server: Any) -> Any:
    made: list[Pair] = []

    def make(expired: str = "boost") -> Pair:
        made.append(Pair(redis_server.url, expired))
        return made[-1]

    yield make
    for p in made:
        p.close()


def score(request: Request, now: float) -> tuple[int, float]:
    """The effective priority a pop at *now* ranks *request* by: (tier, e(t)); expired first, by deadline."""
    deadline = request.meta.get(M.DEADLINE)
    if deadline is None:
        return 1, float(request.priority)
    if deadline <= now:
        return 2, -deadline
    return 1, max(request.priority, request.priority + BOOST + (now - deadline) * BOOST / WINDOW)


def drain(p: Pair, steps: list[float] | None = None) -> tuple[list[Request], list[Request]]:
    """Pop both queues to the end (advancing the clock by *steps* between pops, if given)."""
    local: list[Request] = []
    remote: list[Request] = []
    for i in range(1000):
        a, b = p.pop_both()
        if a is None and b is None:
            break
        if a is not None:
            local.append(a)
        if b is not None:
            remote.append(b)
        if a is None or b is None:  # one side is done: the other must be too
            break
        if steps:
            p.clock.now += steps[i % len(steps)]
    return local, remote


def test_example_one_domain(pair: Any) -> None:
    """Priority first; a deadline ages its request up (8 points a second over the 16 s window
    before it); a passed deadline goes first; equal priorities FIFO."""
    p = pair()
    now = T0
    p.push("http://a.test/p10", 10, None)
    p.push("http://a.test/p0-first", 0, None)
    p.push("http://a.test/p0-second", 0, None)
    p.push("http://a.test/aging", -50, now + 4)  # e = -50 + 128 - 4 * 8 = 46 > 10
    p.push("http://a.test/far", 5, now + 100)  # e = 5 (its line is still far below)
    p.push("http://a.test/expired", -100, now - 1)  # past its deadline: to the front
    local, remote = drain(p)
    expected = ["expired", "aging", "p10", "far", "p0-first", "p0-second"]
    assert [r.url.rsplit("/", 1)[1] for r in local] == expected
    assert [r.url for r in remote] == [r.url for r in local]


def test_example_several_domains(pair: Any) -> None:
    """Across domains the best effective priority goes first; each domain keeps its own order."""
    p = pair()
    now = T0
    p.push("http://a.test/a1", 1, None)
    p.push("http://b.test/b5", 5, None)
    p.push("http://c.test/c-aging", 0, now + 10)  # e = 0 + 128 - 80 = 48
    p.push("http://a.test/a-late", -5, now - 2)
    p.push("http://b.test/b1", 1, None)
    local, remote = drain(p)
    assert [r.url.rsplit("/", 1)[1] for r in remote] == ["a-late", "c-aging", "b5", "a1", "b1"]
    assert [r.url for r in remote] == [r.url for r in local]


def test_example_expired_drop(pair: Any) -> None:
    p = pair(expired="drop")
    p.push("http://a.test/late", 0, T0 - 1)
    p.push("http://a.test/soon", 0, T0 + 20)  # (its aging line starts at T0 + 4)
    p.push("http://a.test/plain", 1, None)
    first = p.pop_both()
    assert [r.url for r in first if r is not None] == ["http://a.test/plain"] * 2
    p.clock.now += 21  # "soon" expires too
    local, remote = drain(p)
    assert local == remote == []
    assert sorted(p.dead["local"]) == sorted(p.dead["redis"]) == ["http://a.test/late", "http://a.test/soon"]


# --- properties ---------------------------------------------------------------------------

#: (domain, priority, deadline offset from T0 in 1/8 s, or None)
_REQUEST = st.tuples(
    st.sampled_from(["a.test", "b.test", "c.test", "d.test"]),
    st.integers(-20, 20),
    st.one_of(st.none(), st.integers(-40, 400).map(lambda n: n / 8)),
)
_PARITY = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _push_all(p: Pair, requests: list[tuple[str, int, float | None]]) -> None:
    for i, (domain, priority, offset) in enumerate(requests):
        p.push(f"http://{domain}/{i}", priority, None if offset is None else T0 + offset)


@_PARITY
@given(
    requests=st.lists(_REQUEST.map(lambda r: ("a.test", *r[1:])), min_size=1, max_size=24),
    expired=st.sampled_from(["boost", "drop"]),
    steps=st.lists(st.integers(0, 24).map(lambda n: n / 8), min_size=1, max_size=4),
)
def test_one_domain_same_order_as_time_passes(pair: Any, requests: Any, expired: str, steps: list[float]) -> None:
    p = pair(expired)
    _push_all(p, requests)
    local, remote = drain(p, steps)
    assert [r.url for r in remote] == [r.url for r in local]
    assert sorted(p.dead["redis"]) == sorted(p.dead["local"])


@_PARITY
@given(
    requests=st.lists(_REQUEST, min_size=1, max_size=24),
    later=st.integers(0, 400).map(lambda n: n / 8),
)
def test_several_domains_same_order_per_domain_and_same_scores(pair: Any, requests: Any, later: float) -> None:
    p = pair()
    _push_all(p, requests)
    p.clock.now = T0 + later  # every pop at this one instant
    local, remote = drain(p)
    assert len(remote) == len(local) == len(requests)
    for domain in {d for d, _, _ in requests}:
        assert [r.url for r in remote if domain in r.url] == [r.url for r in local if domain in r.url]
    now = p.clock.now
    assert [score(r, now) for r in remote] == [score(r, now) for r in local]


def test_the_redis_side_really_is_redis(pair: Any) -> None:
    """(The comparison is worth something only if the Redis queue holds its entries in Redis.)"""
    p = pair()
    p.push("http://a.test/1", 0, None)
    assert isinstance(p.remote.server, redis.Redis)
    assert p.remote.server.zcard(p.remote.shards.name("q", 0)) == 1
