"""A hostile writer of a domain's health hash in Redis: every field is checked on its own, a bad
one reported once per domain and field, counted, and never acted on (in Python or in Lua)."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import redis
from scrapy import Spider
from scrapy.utils.test import get_crawler

from scrapy_openclaw.distributed.fields import typed_fields
from scrapy_openclaw.distributed.health import RedisHealthRegistry

DOMAIN = "a.test"
HOSTILE = {
    "requests": "inf",  # OverflowError in int(float(...))
    "ctl_hold": "1e300",  # a hold until the end of time
    "failures": "-3",
    "health": "nan",
    "rate": "9" * 1_000_000,  # a megabyte of digits
    "circuit": "pwned",
    "ctl_down": "7",
}


class _Spider(Spider):
    name = "hostile"


def _registry(url: str) -> RedisHealthRegistry:
    return RedisHealthRegistry(get_crawler(_Spider, {"REDIS_URL": url}))


def test_each_field_is_checked_on_its_own() -> None:
    seen: list[str] = []
    typed = typed_fields(
        {**HOSTILE, "successes": "12", "latency": "", "hold_until": "0.5"}, lambda n, v: seen.append(n)
    )
    assert sorted(seen) == sorted(HOSTILE)
    assert typed == {"successes": 12, "latency": None, "hold_until": 0.5}


def test_hostile_health_fields_are_reported_counted_and_ignored(redis_server: Any, caplog: Any) -> None:
    registry = _registry(redis_server.url)
    now = time.time()
    registry.ensure(DOMAIN)
    for _ in range(3):
        registry.record_success(DOMAIN, 0.05, now)
    own = registry.state(DOMAIN)
    client = redis.Redis.from_url(redis_server.url)
    key = registry.health_key(DOMAIN)
    client.hset(key, mapping=HOSTILE)
    fields = {k.decode(): v.decode() for k, v in client.hgetall(key).items()}
    with caplog.at_level(logging.WARNING, logger="scrapy_openclaw.distributed.health"):
        registry.refresh(DOMAIN, fields)
        registry.refresh(DOMAIN, fields)  # read again: counted again, not warned again
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == len(HOSTILE), warnings
    assert all(DOMAIN in w and "Ignoring health field" in w for w in warnings)
    assert max(len(w) for w in warnings) < 400  # the megabyte is not copied into the log
    stats = registry.crawler.stats
    assert stats.get_value("openclaw/redis/invalid_fields") == 2 * len(HOSTILE)
    state = registry.state(DOMAIN)
    assert state.requests == own.requests and math.isfinite(state.health)
    assert not registry.given_up(DOMAIN)
    assert registry.ready_at(DOMAIN) < now + 60  # not held until the year 1e300

    # The Lua scripts load the same hash: no script error, nothing forged acted on, the hash repaired.
    assert registry.try_acquire(DOMAIN, now + 1, token=False)
    repaired = {k.decode(): v.decode() for k, v in client.hgetall(key).items()}
    assert float(repaired["ctl_hold"]) == 0 and float(repaired["ctl_down"]) in (0, 1)
    assert math.isfinite(float(repaired["requests"])) and float(repaired["failures"]) >= 0
    assert repaired["circuit"] == "closed" and len(repaired["rate"]) < 40
    assert 0 <= float(repaired["health"]) <= 100
    client.close()
