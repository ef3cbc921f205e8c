"""Bounded memory per domain: idle domains are forgotten (locally, and their Redis hash expires)."""

from __future__ import annotations

import json
import time
from typing import Any

import redis
from scrapy import Request
from scrapy.utils.test import get_crawler

from scrapy_openclaw.errors import Classification, ErrorClass
from scrapy_openclaw.health import HealthRegistry
from scrapy_openclaw.policy import PolicySet
from tests.test_pqueues import HEALTH, QueueSpider, make_queue

T0 = 1_700_000_000.0
TTL = 100.0
REFUSED = Classification(ErrorClass.NETWORK, "connection_refused")
HTTP_429 = Classification(ErrorClass.PROTOCOL_RETRYABLE, "http_429", 429)


def registry(**health: Any) -> HealthRegistry:
    return HealthRegistry(
        PolicySet.from_settings(
            get_crawler(QueueSpider, {"OPENCLAW_POLICY": {"defaults": {"health": health}}}).settings
        ),
        idle_ttl=TTL,
    )


def test_an_idle_domain_is_forgotten_after_the_ttl_and_not_before() -> None:
    reg = registry()
    reg.record_success("quiet.test", 0.1, now=T0)
    reg.record_success("busy.test", 0.1, now=T0)
    reg.record_success("pending.test", 0.1, now=T0)
    reg.record_success("recent.test", 0.1, now=T0 + 50)
    assert reg.evict_idle(T0 + TTL - 1) == []
    reg.state("quiet.test", T0 + 99)  # reading (metrics, the log table) is no use: it does not keep it
    assert reg.evict_idle(T0 + TTL + 1, keep={"busy.test", "pending.test"}) == ["quiet.test"]
    assert sorted(reg.domains()) == ["busy.test", "pending.test", "recent.test"]
    assert reg.evicted == 1
    assert HealthRegistry(PolicySet({}, [])).evict_idle(T0 + 10**6) == []  # idle_ttl 0: never


def test_state_that_matters_outlives_idleness_and_goes_when_it_ends() -> None:
    reg = registry(
        circuit_failures=2, circuit_cooldown=500, circuit_cooldown_max=500, circuit_jitter=0, give_up_after=None
    )
    reg.record_success("limit.test", 0.1, now=T0)
    reg.record_failure("limit.test", HTTP_429, now=T0 + 2)  # a learned limit: stale after the ttl
    assert reg.state("limit.test", T0 + 2).limit is not None
    reg.record_failure("held.test", HTTP_429, now=T0, retry_after=300)
    reg.record_failure("open.test", REFUSED, now=T0)
    reg.record_failure("open.test", REFUSED, now=T0)
    reg.control("ctl-rate.test", now=T0, ctl_rate=2.0)
    reg.control("ctl-down.test", now=T0, ctl_down=1)
    reg.control("ctl-hold.test", now=T0, ctl_hold=T0 + 400)
    reg.set_crawl_delay("robots.test", 5.0)
    reg._domains["robots.test"].born = T0
    kept = {"held.test", "open.test", "ctl-rate.test", "ctl-down.test", "ctl-hold.test", "robots.test"}
    assert reg.evict_idle(T0 + TTL + 10) == ["limit.test"]
    assert set(reg.domains()) == kept
    # the hold ends at T0+300, the operator's at T0+400; the circuit's cool-down ends (half-open) but
    # it is not closed: still kept
    assert sorted(reg.evict_idle(T0 + 450)) == ["ctl-hold.test", "held.test"]
    assert set(reg.domains()) == {"open.test", "ctl-rate.test", "ctl-down.test", "robots.test"}


def test_the_snapshot_holds_only_what_is_left_and_a_forgotten_domain_comes_back_fresh() -> None:
    reg = registry(circuit_failures=2, circuit_cooldown=500, circuit_cooldown_max=500, circuit_jitter=0)
    for i in range(200):
        reg.record_success(f"d{i}.test", 0.1, now=T0)
    reg.record_failure("d7.test", HTTP_429, now=T0 + 1)
    reg.record_failure("down.test", REFUSED, now=T0)
    reg.record_failure("down.test", REFUSED, now=T0)
    before = len(json.dumps(reg.snapshot()))
    assert len(reg.evict_idle(T0 + TTL + 2)) == 200
    data = json.loads(json.dumps(reg.snapshot()))
    assert list(data["domains"]) == ["down.test"]
    assert len(json.dumps(data)) < before / 100
    again = registry(circuit_failures=2, circuit_cooldown=500, circuit_cooldown_max=500, circuit_jitter=0)
    again.restore(data)
    assert again.state("down.test", T0 + 200).circuit == "open"
    # d7 learned a limit and was forgotten: back, it starts as a new domain would
    fresh = reg.state("d7.test", T0 + 300)
    assert (fresh.requests, fresh.health, fresh.limit, fresh.circuit) == (0, 100.0, None, "closed")
    assert reg.try_acquire("d7.test", T0 + 300)
    reg.record_success("d7.test", 0.1, now=T0 + 300)
    assert reg.state("d7.test", T0 + 300).successes == 1


def test_the_queue_sweeps_idle_domains_keeping_those_with_pending_work_and_reports_memory() -> None:
    q = make_queue({"DOWNLOADER_MIDDLEWARES": HEALTH, "OPENCLAW_HEALTH_IDLE_TTL": TTL})
    reg = q.registry
    assert reg is not None and reg.idle_ttl == TTL
    now = q._clock.now
    for i in range(50):
        reg.record_success(f"old{i}.test", 0.1, now=now)
    q.push(Request("http://waiting.test/1"))
    q.push(Request("http://waiting.test/2"))
    reg.record_success("waiting.test", 0.1, now=now)
    q.push(Request("http://later.test/1", meta={"openclaw_not_before": now + 10_000}))
    reg.record_success("later.test", 0.1, now=now)
    assert q.pop().url.startswith("http://waiting.test/")  # the first sweep: nothing idle yet
    stats = q.crawler.stats
    assert stats.get_value("openclaw/health/domains") == 52 and stats.get_value("openclaw/queue/domains") == 1
    assert 200 < stats.get_value("openclaw/health/bytes_per_domain") < 5000
    assert 0 < stats.get_value("openclaw/queue/bytes_per_request") < 5000
    q._clock.now = now + TTL + 61
    assert q.pop().url.startswith("http://waiting.test/")
    assert sorted(reg.domains()) == ["later.test", "waiting.test"]
    assert stats.get_value("openclaw/health/evicted") == 50
    assert stats.get_value("openclaw/health/domains") == 2
    q.close()


def test_a_redis_health_hash_expires_when_idle_unless_its_state_matters(redis_server: Any) -> None:
    from scrapy_openclaw.distributed.health import RedisHealthRegistry

    crawler = get_crawler(QueueSpider, {"REDIS_URL": redis_server.url, "OPENCLAW_HEALTH_IDLE_TTL": TTL})
    reg = RedisHealthRegistry(crawler)
    server = reg.server
    now = time.time()
    reg.ensure("a.test")
    reg.record_success("a.test", 0.1, now=now)
    ttl = server.pttl(reg._key("a.test"))
    assert TTL * 1000 - 5000 < ttl <= TTL * 1000
    server.pexpire(reg._key("a.test"), 5000)
    reg.record_success("a.test", 0.1, now=now + 1)  # not every save: a PEXPIRE per response costs
    assert server.pttl(reg._key("a.test")) <= 5000
    reg.record_success("a.test", 0.1, now=now + TTL / 4 + 2)  # once it must move by a quarter of itself
    assert server.pttl(reg._key("a.test")) > TTL * 1000 - 5000
    assert server.pttl(reg._key("a.test") + ":fit") > TTL * 1000 - 5000  # (the fit's history with it)
    reg.ensure("held.test")
    reg.hold("held.test", now + 1000)  # outlives its hold by the ttl
    assert server.pttl(reg._key("held.test")) > 1000 * 1000
    reg.ensure("down.test")
    reg.control("down.test", now=now, ctl_down=1)  # given up by the operator: never expires
    assert server.pttl(reg._key("down.test")) == -1
    reg.control("down.test", now=now, ctl_down=0)
    assert 0 < server.pttl(reg._key("down.test")) <= TTL * 1000


def test_a_worker_forgets_idle_domains_in_its_cache_and_reads_them_from_redis_again(redis_server: Any) -> None:
    """Distributed mode: the worker's cache of the Redis registry is swept by its queue, so a broad
    crawl's worker does not keep every domain it ever met; the state lives on in Redis."""
    from tests.test_distributed_queue import FakeClock, _queue

    clock = FakeClock()
    q = _queue(
        redis_server.url,
        clock=clock,
        OPENCLAW_HEALTH_ENABLED=True,
        OPENCLAW_HEALTH_IDLE_TTL=TTL,
        OPENCLAW_HEALTH_REGISTRY_CLASS="scrapy_openclaw.distributed.health.RedisHealthRegistry",
    )
    try:
        reg = q.registry
        assert reg is not None
        for i in range(30):
            q.push(Request(f"http://old{i}.test/"))
        reg.record_failure("old0.test", REFUSED, now=clock())
        q.push(Request("http://held.test/"))
        reg.hold("held.test", clock() + 10 * TTL)
        q.push(Request("http://ready.test/"))
        q._sweep_idle()  # the first sweep: nothing idle yet
        assert len(reg.domains()) == 32
        assert len(reg._policy_json) == 1  # one policy JSON for all domains without a rule
        clock.advance(TTL + 61)
        q._ready.append(Request("http://ready.test/"))  # leased ahead, not handed out yet
        q._sweep_idle()
        assert sorted(reg.domains()) == ["held.test", "ready.test"]
        assert not any(name.startswith("old") for name in reg._known)
        assert q.stats.get_value("openclaw/health/evicted") == 30
        q._sweep_idle()  # not due again yet
        assert q.stats.get_value("openclaw/health/evicted") == 30
        q.push(Request("http://old0.test/again"))  # met again: ensured, read from Redis
        assert reg.state("old0.test").failures == 1
    finally:
        q._loop.stop()


def test_a_workers_registry_stays_bounded_over_many_domains_and_grows_without_the_sweep(redis_server: Any) -> None:
    """The worker memory benchmark's driver, 3,000 domains on a fake clock (0.5 s apart, idle TTL
    300 s): with the sweep the registry holds the last TTL's domains (600) plus those met since the
    last sweep, at 1,000 domains as at 3,000; without it, every domain met."""
    from benchmarks.workermemory import IDLE_TTL, STEP, TICK_EVERY, measure

    bound = (IDLE_TTL + min(60.0, IDLE_TTL / 4)) / STEP + TICK_EVERY
    swept = measure(redis_server.url, 3000, IDLE_TTL, checkpoints=(1000, 2000, 3000))
    held = [p["held"] for p in swept["points"]]
    assert all(IDLE_TTL / STEP <= n <= bound for n in held), held
    assert swept["evicted"] == 3000 - held[-1]
    redis.Redis.from_url(redis_server.url).flushall()
    kept = measure(redis_server.url, 2000, 0.0, checkpoints=(1000, 2000))
    assert [p["held"] for p in kept["points"]] == [1000, 2000] and kept["evicted"] == 0
