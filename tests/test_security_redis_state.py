"""A hostile writer of a domain's health hash in Redis: every field is checked on its own, a bad
one reported once per domain and field, counted, and never acted on (in Python or in Lua)."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import pytest
import redis
from scrapy import Spider
from scrapy.utils.test import get_crawler

from scrapy_openclaw.distributed.fields import read_state, typed_fields
from scrapy_openclaw.distributed.health import RedisHealthRegistry
from tests.health_records import forge, record

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


#: The same forgeries written into the record itself (numbers and other types; MessagePack)
HOSTILE_VALUES: dict[str, Any] = {
    "requests": float("inf"),
    "ctl_hold": 1e300,
    "failures": -3,
    "health": float("nan"),
    "rate": [1, 2, 3],
    "circuit": 7,
    "ctl_down": 7,
    "latency": "x" * 100_000,
}


def _written(client: Any, key: str, how: str) -> dict[str, Any]:
    """Write the forgery as *how* says; returns the fields as a reader of the key gets them."""
    if how == "record":
        forge(client, key, **HOSTILE_VALUES)
        return HOSTILE_VALUES
    # an earlier version's hash of text fields, which the scripts still read (and replace)
    client.delete(key)
    client.hset(key, mapping=HOSTILE)
    return HOSTILE


@pytest.mark.parametrize("how", ["record", "legacy_hash"])
def test_hostile_health_fields_are_reported_counted_and_ignored(redis_server: Any, caplog: Any, how: str) -> None:
    registry = _registry(redis_server.url)
    now = time.time()
    registry.ensure(DOMAIN)
    for _ in range(3):
        registry.record_success(DOMAIN, 0.05, now)
    own = registry.state(DOMAIN)
    client = redis.Redis.from_url(redis_server.url)
    key = registry.health_key(DOMAIN)
    hostile = _written(client, key, how)
    fields = read_state(client, key)
    if how == "legacy_hash":
        fields["health"] = "50"  # (a record without a health is no record: the other fields are read)
    with caplog.at_level(logging.WARNING, logger="scrapy_openclaw.distributed.health"):
        registry.refresh(DOMAIN, fields)
        registry.refresh(DOMAIN, fields)  # read again: counted again, not warned again
    forged = set(hostile) - ({"health"} if how == "legacy_hash" else set())
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == len(forged), warnings
    assert all(DOMAIN in w and "Ignoring health field" in w for w in warnings)
    assert max(len(w) for w in warnings) < 400  # the megabyte is not copied into the log
    stats = registry.crawler.stats
    assert stats.get_value("openclaw/redis/invalid_fields") == 2 * len(forged)
    state = registry.state(DOMAIN)
    assert state.requests == own.requests and math.isfinite(state.health)
    assert not registry.given_up(DOMAIN)
    assert registry.ready_at(DOMAIN) < now + 60  # not held until the year 1e300

    # The Lua scripts load the same key: no script error, nothing forged acted on, the record repaired.
    assert registry.try_acquire(DOMAIN, now + 1, token=False)
    repaired = record(client, key)
    assert repaired["ctl_hold"] == 0 and repaired["ctl_down"] in (0, 1)
    assert math.isfinite(repaired["requests"]) and repaired["failures"] >= 0
    assert repaired["circuit"] == "closed" and isinstance(repaired["rate"], (int, float))
    assert 0 <= repaired["health"] <= 100 and "latency" not in repaired
    client.close()


@pytest.mark.parametrize("value", [b"\xc1 not MessagePack", b"\x93\x01\x02\x03", b"9" * 2_000_000])
def test_a_record_that_is_not_a_map_is_not_read_and_is_replaced(redis_server: Any, value: bytes) -> None:
    registry = _registry(redis_server.url)
    now = time.time()
    registry.ensure(DOMAIN)
    client = redis.Redis.from_url(redis_server.url)
    key = registry.health_key(DOMAIN)
    client.set(key, value)
    assert read_state(client, key) == {}
    registry.refresh(DOMAIN, value)  # (the cache keeps its own view)
    assert registry.state(DOMAIN).health == 100
    registry.record_success(DOMAIN, 0.05, now)
    repaired = record(client, key)
    assert repaired["requests"] == 1 and repaired["circuit"] == "closed" and repaired["pid"]
    client.close()


def test_an_earlier_versions_hash_is_read_once_and_replaced_by_a_record(redis_server: Any) -> None:
    registry = _registry(redis_server.url)
    now = time.time()
    client = redis.Redis.from_url(redis_server.url)
    key = registry.health_key(DOMAIN)
    # what the previous layout left: text fields, the policy's JSON, an operator's ceiling
    client.hset(
        key,
        mapping={
            "policy": registry.policy_json(DOMAIN),
            "health": "80",
            "rate": "4.5",
            "tokens": "1",
            "updated": repr(now - 1),
            "requests": "12",
            "successes": "12",
            "ctl_rate": "2",
            "circuit": "closed",
            "latency": "",
            "ttl_at": "p",
        },
    )
    client.sadd(registry._domains_key(DOMAIN), DOMAIN)
    assert read_state(client, key)["ctl_rate"] == "2"
    registry.record_success(DOMAIN, 0.05, now)
    assert client.type(key) == b"string"
    stored = record(client, key)
    assert stored["requests"] == 13 and stored["ctl_rate"] == 2 and stored["health"] >= 80
    assert registry.state(DOMAIN).requests == 13
    client.close()
