"""The Redis health registry follows the local HealthRegistry's policy, rule for rule.

The controller exists twice: in Python (scrapy_openclaw/health/registry/)
and ported to Lua (scrapy_openclaw/distributed/lua/health.lua). These tests
feed both the same events at the same times and compare every stored field,
so a change to one side that is not made on the other fails here.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from scrapy import Spider
from scrapy.utils.test import get_crawler

from scrapy_openclaw.distributed.health import RedisHealthRegistry
from scrapy_openclaw.errors import Classification, ErrorClass
from scrapy_openclaw.health import HealthRegistry
from scrapy_openclaw.policy import PolicySet
from tests.health_records import record

C429 = Classification(ErrorClass.PROTOCOL_RETRYABLE, "http_429", 429)
C503 = Classification(ErrorClass.PROTOCOL_RETRYABLE, "http_503", 503)
C500 = Classification(ErrorClass.PROTOCOL_RETRYABLE, "http_500", 500)
TIMEOUT = Classification(ErrorClass.NETWORK, "timeout")
REFUSED = Classification(ErrorClass.NETWORK, "connection_refused")
C404 = Classification(ErrorClass.PROTOCOL_PERMANENT, "http_404", 404)
BAN200 = Classification(ErrorClass.BLOCKED, "blocked_policy", 200)
BAN403 = Classification(ErrorClass.BLOCKED, "blocked_cloudflare", 403)
BAN429 = Classification(ErrorClass.BLOCKED, "blocked_captcha", 429)


class _Spider(Spider):
    name = "parity"


def _pair(url: str, health: dict[str, Any] | None = None) -> tuple[HealthRegistry, RedisHealthRegistry]:
    settings = {"REDIS_URL": url, "OPENCLAW_POLICY": {"defaults": {"health": health or {}}}}
    crawler = get_crawler(_Spider, settings)

    def pinned(a: float, b: float) -> float:  # the jitter's random source, the same for both
        return a + 0.3 * (b - a)

    return (
        HealthRegistry(PolicySet.for_crawler(crawler), uniform=pinned),
        RedisHealthRegistry(crawler, uniform=pinned),
    )


def _compare(local: HealthRegistry, shared: RedisHealthRegistry, where: str) -> None:
    ours = local.snapshot()["domains"]
    theirs = shared.snapshot()["domains"]
    assert set(ours) == set(theirs), where
    for domain, fields in ours.items():
        for name, value in fields.items():
            other = theirs[domain][name]
            if isinstance(value, float) and other is not None:
                assert math.isclose(value, other, rel_tol=1e-9, abs_tol=1e-9), (where, domain, name, value, other)
            else:
                assert value == other, (where, domain, name, value, other)


def _apply(reg: Any, event: tuple[Any, ...]) -> Any:
    kind, domain, now, *rest = event
    if kind == "acquire":
        return reg.try_acquire(domain, now, token=rest[0])
    if kind == "ok":
        return reg.record_success(domain, rest[0], now)
    if kind == "crawl_delay":
        return reg.set_crawl_delay(domain, rest[0], owed=rest[1] if len(rest) > 1 else 0)
    if kind == "control":
        return reg.control(domain, now, **rest[0])
    if kind == "declare":
        return reg.declare_limit(domain, rest[0], now)
    failed_before = rest[2] if len(rest) > 2 else None
    latency = rest[3] if len(rest) > 3 else None
    return reg.record_failure(domain, rest[0], now, retry_after=rest[1], failed_before=failed_before, latency=latency)


def _drive(local: HealthRegistry, shared: RedisHealthRegistry, events: list[tuple[Any, ...]]) -> None:
    for i, event in enumerate(events):
        assert _apply(local, event) == _apply(shared, event), f"event {i}: {event}"
        _compare(local, shared, f"after event {i}: {event}")


def test_scripted_story_matches(redis_server: Any) -> None:
    """Slow start, a 429 without Retry-After (brief hold, threshold), latency congestion,
    Retry-After, the circuit opening, half-open probe, closing: field for field."""
    local, shared = _pair(
        redis_server.url,
        {"initial_rate": 2.0, "base_rate": 50.0, "burst": 3, "circuit_failures": 3, "circuit_cooldown": 5.0},
    )
    t = 1_000_000.0
    events: list[tuple[Any, ...]] = [("acquire", "a", t, True)]
    for i in range(24):  # slow start: +50% per success while nothing is learned (and a latency baseline)
        events += [("acquire", "a", t + i * 0.15, True), ("ok", "a", t + i * 0.15 + 0.1, 0.1)]
    t += 4
    events += [("fail", "a", t, C429, None), ("acquire", "a", t + 0.01, True), ("acquire", "a", t + 0.5, True)]
    for i in range(8):  # latency climbs: congestion from latency alone
        events.append(("ok", "a", t + 1 + i * 0.3, 0.1 + i * 0.4))
    _drive(local, shared, events)
    assert local.snapshot()["domains"]["a"]["last_decrease"] > t + 1  # the latency cut happened
    events = []
    t += 5
    events += [("fail", "a", t, C503, 2.0), ("acquire", "a", t + 1, False), ("acquire", "a", t + 2.5, False)]
    events += [
        ("fail", "a", t + 3, TIMEOUT, None),
        ("fail", "a", t + 3.1, REFUSED, None),
        ("fail", "a", t + 3.2, C500, None),
        ("fail", "a", t + 3.3, C404, None),
    ]
    events += [
        ("acquire", "a", t + 4, True),
        ("acquire", "a", t + 9, False),  # cooldown over: probe
        ("acquire", "a", t + 9.1, False),
        ("fail", "a", t + 9.5, TIMEOUT, None),  # re-opens
        ("acquire", "a", t + 15, True),
        ("ok", "a", t + 15.2, 0.2),
        ("acquire", "a", t + 15.3, True),
    ]
    events += [("ok", "b", t + 16, None), ("fail", "b", t + 16.5, C429, 600.0), ("acquire", "b", t + 17, True)]
    events += [  # the operator's hold counts as held time
        ("control", "c", t + 20, {"ctl_hold": t + 30}),
        ("acquire", "c", t + 25, True),
        ("control", "c", t + 26, {"ctl_hold": 0.0}),
        ("acquire", "c", t + 27, True),
    ]
    _drive(local, shared, events)
    assert local.snapshot()["domains"]["c"]["blocked_seconds"] == pytest.approx(6.0)


@pytest.mark.parametrize("retry_after", [1.0, 2.0, 5.0])
def test_the_plateau_after_a_long_hold_matches(redis_server: Any, retry_after: float) -> None:
    """A limit measured by two 429s that hold the domain *retry_after* seconds, then clean answers
    for 40 s: the cubic's plateau (slower past its flat point after a hold over a second) the same,
    field for field, in both implementations."""
    local, shared = _pair(redis_server.url, {"initial_rate": 4.0, "burst": 2})
    t = 3_000_000.0
    events: list[tuple[Any, ...]] = []
    for i in range(20):  # slow start
        events += [("acquire", "a", t + i * 0.1, True), ("ok", "a", t + i * 0.1 + 0.05, 0.05)]
    t += 3
    events.append(("fail", "a", t, C429, retry_after))  # first cut: a guess
    t += retry_after + 2
    for i in range(10):
        events += [("acquire", "a", t + i * 0.1, True), ("ok", "a", t + i * 0.1 + 0.05, 0.05)]
    t += 2
    events.append(("fail", "a", t, C429, retry_after))  # measured: on to the cubic
    t += retry_after
    for i in range(160):  # 40 s of clean answers through the plateau and past it
        events += [("acquire", "a", t + i * 0.25, True), ("ok", "a", t + i * 0.25 + 0.05, 0.05)]
    _drive(local, shared, events)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_event_sequences_match(redis_server: Any, seed: int) -> None:
    rng = random.Random(seed)
    local, shared = _pair(
        redis_server.url, {"circuit_failures": 4, "circuit_cooldown": 3.0, "initial_rate": rng.choice([1.0, 4.0, 10.0])}
    )
    now = 2_000_000.0
    events = []
    for _ in range(400):
        now += rng.expovariate(5.0)
        domain = rng.choice(["x.test", "y.test"])
        r = rng.random()
        if r < 0.4:
            events.append(("acquire", domain, now, rng.random() < 0.8))
        elif r < 0.78:
            events.append(("ok", domain, now, rng.choice([None, rng.uniform(0.01, 2.0)])))
        elif r < 0.8:  # the site declares a limit (RateLimit headers), or none any more
            events.append(("declare", domain, now, rng.choice([0.0, rng.uniform(0.5, 50.0)])))
        else:
            c = rng.choice([C429, C503, C503, C500, C500, TIMEOUT, REFUSED, C404, BAN200, BAN403])
            failed_before = rng.choice([None, None, now - rng.uniform(0, 3)])  # a retry of a URL that failed
            events.append(("fail", domain, now, c, rng.choice([None, None, rng.uniform(0, 5)]), failed_before))
    _drive(local, shared, events)


def test_declared_limits_match(redis_server: Any) -> None:
    """A limit the site declares (RateLimit headers): slow start ends at once, the pace sits just
    under it, moves with it both ways, a 429 under it still cuts and the cubic climbs back to the
    declared ceiling, never past it; a Crawl-delay and the operator's ceiling still bind."""
    local, shared = _pair(redis_server.url, {"initial_rate": 2.0, "circuit_jitter": 0.0})
    t = 7_000_000.0
    events: list[tuple[Any, ...]] = [("acquire", "d.test", t, True), ("ok", "d.test", t + 0.1, 0.1)]
    events.append(("declare", "d.test", t + 0.2, 40.0))
    for i in range(30):
        events += [("acquire", "d.test", t + 0.3 + i * 0.03, True), ("ok", "d.test", t + 0.32 + i * 0.03, 0.02)]
    events += [("declare", "d.test", t + 2, 8.0), ("fail", "d.test", t + 2.5, C429, 1.0)]
    for i in range(60):  # the cubic back up, held at the declared ceiling
        events += [("acquire", "d.test", t + 4 + i * 0.5, True), ("ok", "d.test", t + 4.02 + i * 0.5, 0.02)]
    _drive(local, shared, events)
    assert local.state("d.test", t + 34).rate == pytest.approx(8.0 * 0.95)  # back at the ceiling, not past it
    events = [("declare", "d.test", t + 40, 40.0), ("acquire", "d.test", t + 40.1, True)]
    events += [("control", "d.test", t + 41, {"ctl_rate": 5.0}), ("ok", "d.test", t + 41.1, 0.02)]
    events += [("crawl_delay", "e.test", t + 1, 2.0), ("declare", "e.test", t + 1.5, 30.0)]
    events += [("acquire", "e.test", t + 2, True), ("declare", "e.test", t + 3, 0.0), ("ok", "e.test", t + 3.1, 0.1)]
    _drive(local, shared, events)
    state = local.state("d.test", t + 42)
    assert state.rate == pytest.approx(5.0) and state.declared == 40.0  # (the operator's ceiling binds)


def test_ban_pages_match(redis_server: Any) -> None:
    """Ban pages (error class blocked): their own penalty, a hold (blocked_hold, passed as the
    wait the way the ban middleware passes it), a rate cut, the circuit; a retry's ban page is
    still the domain's, never the page's."""
    local, shared = _pair(redis_server.url, {"blocked_penalty": 35.0, "circuit_failures": 4, "circuit_jitter": 0.0})
    t = 6_000_000.0
    events: list[tuple[Any, ...]] = []
    for i in range(10):
        events += [("acquire", "s.test", t + 0.1 * i, True), ("ok", "s.test", t + 0.1 * i + 0.05, 0.05)]
    events += [
        ("fail", "s.test", t + 2, BAN200, 30.0),
        ("acquire", "s.test", t + 3, True),
        ("fail", "s.test", t + 40, BAN403, 30.0, t + 2),  # a retry, banned again
        ("fail", "s.test", t + 40.2, BAN429, 60.0),
        ("fail", "s.test", t + 40.3, BAN200, 0.0),
        ("acquire", "s.test", t + 200, False),
        ("ok", "s.test", t + 200.1, 0.05),
    ]
    events += [("fail", "u.test", t + 1, BAN200, None), ("fail", "u.test", t + 1.5, BAN403, None, t)]
    _drive(local, shared, events)
    state = local.state("s.test", t + 2.5)
    assert state.circuit == "closed"


def test_page_and_domain_verdicts_match(redis_server: Any) -> None:
    """Broken pages among healthy ones (page verdicts, the 5xx share), a 503 window
    (the share climbs: domain verdicts, the circuit), a dead host, Crawl-delay."""
    local, shared = _pair(redis_server.url, {"circuit_jitter": 0.0})
    t = 5_000_000.0
    events: list[tuple[Any, ...]] = []
    for i in range(40):  # every 5th page of m.test always answers 503; its retries come later
        now = t + 0.05 * i
        events.append(("fail", "m.test", now, C503, None) if i % 5 == 4 else ("ok", "m.test", now, 0.02))
        if i % 5 == 0 and i:
            events.append(("fail", "m.test", now + 0.01, C503, None, now - 0.2))  # a retry: the page's
    for i in range(8):  # then the whole host goes down
        events.append(("fail", "m.test", t + 3 + 0.01 * i, C503, None))
    events += [("fail", "dead.test", t + 0.1 * i, REFUSED, None) for i in range(4)]
    events += [
        ("crawl_delay", "m.test", t + 9, 2.0, 1),
        ("acquire", "m.test", t + 20, True),
        ("acquire", "m.test", t + 20.5, True),
        ("acquire", "m.test", t + 22.1, True),
    ]
    _drive(local, shared, events)
    for reg in (local, shared):
        assert reg.given_up("dead.test", t + 10) and not reg.given_up("m.test", t + 10)


def test_cache_serves_reads_without_round_trips(redis_server: Any) -> None:
    """state()/ready_at()/blocked_until()/domains() are answered from the last script reply."""
    _, shared = _pair(redis_server.url)
    now = time.time()
    shared.record_failure("c.test", C429, now, retry_after=30)
    calls = []
    shared.server.execute_command = lambda *a, **k: calls.append(a)  # any Redis call would land here
    assert shared.domains() == ["c.test"]
    assert shared.blocked_until("c.test", now) >= now + 29
    assert shared.ready_at("c.test", now) >= now + 29
    assert shared.state("c.test", now).failures == 1 and shared.concurrency("c.test") >= 1
    assert calls == []


def test_each_circuit_change_is_reported_by_the_worker_that_caused_it(redis_server: Any) -> None:
    """Two workers share a domain: the one whose failure opens the circuit reports it; the other,
    whose cached view still says closed, does not report it again (stats and signals count once)."""
    health = {"circuit_failures": 2, "circuit_cooldown": 5.0, "circuit_jitter": 0.0}
    _, worker_a = _pair(redis_server.url, health)
    _, worker_b = _pair(redis_server.url, health)
    t = 3_000_000.0
    assert worker_b.record_success("s.test", 0.1, t) is None  # b's cache: closed
    assert worker_a.record_failure("s.test", TIMEOUT, t + 1) is None
    assert worker_a.record_failure("s.test", TIMEOUT, t + 2) == "open"
    assert worker_b.state("s.test", t + 2).circuit == "closed"  # stale until b's next call
    assert worker_b.record_failure("s.test", TIMEOUT, t + 3) is None
    assert worker_b.state("s.test", t + 3).circuit == "open"
    # cool-down over: b's probe comes back and b closes the circuit; a's late answer does not
    assert worker_b.try_acquire("s.test", t + 8)
    assert worker_b.record_success("s.test", 0.1, t + 8.1) == "closed"
    assert worker_a.record_success("s.test", 0.1, t + 8.2) is None


def test_give_up_clock_matches(redis_server: Any) -> None:
    """down_since (the outage clock) is a shared field: both sides start it at the opening
    that began the outage, keep it through failed probes, stop it when a probe comes back."""
    health = {
        "circuit_failures": 2,
        "circuit_cooldown": 1.0,
        "circuit_cooldown_max": 2.0,
        "circuit_jitter": 0.0,
        "give_up_after": 10.0,
        "unreachable_give_up": None,
    }
    local, shared = _pair(redis_server.url, health)
    t = 4_000_000.0
    events: list[tuple[Any, ...]] = [("fail", d, t + dt, TIMEOUT, None) for dt in (0, 0.5) for d in ("g", "h")]
    events += [("acquire", "h", t + 2, False), ("ok", "h", t + 2.1, 0.1)]  # h recovers: its clock stops
    for k in range(1, 4):  # g's probes fail: its outage goes on
        events += [("acquire", "g", t + 3 * k, False), ("fail", "g", t + 3 * k + 0.1, TIMEOUT, None)]
    _drive(local, shared, events)
    # (reads bring a record up to the time asked: compare, then stop comparing snapshots)
    for reg in (local, shared):
        assert reg.down_for("h", t + 30) == 0.0 and not reg.given_up("h", t + 30)
        assert reg.down_for("g", t + 9.9) == pytest.approx(9.4)
        assert not reg.given_up("g", t + 9.9)
        assert reg.given_up("g", t + 10.6)


def test_limit_fit_matches(redis_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client above a token bucket's rate, 429s with Retry-After: the cuts from the second 429
    on take the fitted limit (Lindley's recursion over the history, limitfit.py / h_fit), and
    both registries learn the same one, bit for bit."""
    from scrapy_openclaw.health.registry import limitfit

    fits: list[float | None] = []
    fit = limitfit.LimitHistory.fit
    monkeypatch.setattr(
        limitfit.LimitHistory, "fit", lambda self, guess, top=0.0: fits.append(fit(self, guess, top)) or fits[-1]
    )
    local, shared = _pair(redis_server.url)
    rng = random.Random(5)
    rate, burst = 40.0, 10
    tokens, filled, t = float(burst), 1_000_000.0, 1_000_000.0
    events: list[tuple[Any, ...]] = []
    while t < 1_000_000.0 + 16:
        tokens = min(burst, tokens + (t - filled) * rate)
        filled = t
        latency = rng.uniform(0.002, 0.01)
        if tokens >= 1:
            tokens -= 1
            events.append(("ok", "a", t + latency, latency))
            t += 1.0 / (rate * rng.uniform(0.95, 1.25))
        else:
            events.append(("fail", "a", t + latency, C429, 1.0, None, latency))
            t += 1.0 + latency
    _drive(local, shared, events)
    assert any(f is not None for f in fits), fits  # the fit took part
    limit = local.snapshot()["domains"]["a"]["threshold"]
    assert limit is not None and 0.9 * rate <= limit <= rate


@pytest.mark.parametrize(
    ("rate", "burst", "refusals", "low", "burst_cap"), [(50.0, 5, 2, 0.95, None), (100.0, 2, 3, 0.9, 2)]
)
def test_limit_fit_replaces_a_low_window_alike(
    redis_server: Any, rate: float, burst: int, refusals: int, low: float, burst_cap: int | None
) -> None:
    """The second 429 at the end of the probe, when the 2xx window reads low: both registries
    take the fitted limit instead (the Lua port of the same rule), field for field. On a site
    whose bucket holds 2, a 429 while resuming from a hold halves the burst and keeps the pace."""
    latency = 0.005
    probe = HealthRegistry()  # the client's own pace decides when it sends: replayed on the pair
    tokens, filled, events, failures = float(burst), 1_000_000.0, [], 0
    for i in range(10_000):
        sent = 1_000_000.0 + i / 1000
        if not probe.try_acquire("a", now=sent):
            continue
        events.append(("acquire", "a", sent, True))
        tokens = min(burst, tokens + (sent - filled) * rate)
        filled = sent
        if tokens >= 1:
            tokens -= 1
            event: tuple[Any, ...] = ("ok", "a", sent + latency, latency)
        else:
            event = ("fail", "a", sent + latency, C429, 1.0, None, latency)
            failures += 1
        events.append(event)
        _apply(probe, event)
        if failures == refusals:
            break
    local, shared = _pair(redis_server.url)
    _drive(local, shared, events)
    state = local.snapshot()["domains"]["a"]
    assert failures == refusals
    assert low * rate <= state["threshold"] <= rate
    assert burst_cap is None or state["burst_cap"] <= burst_cap


def _bucket_events(
    t0: float, seconds: float, rate_at: Callable[[float], float], retry_after: float | None
) -> list[tuple[Any, ...]]:
    """A client paced by its own registry against a token bucket of 3 refilling at ``rate_at(sent)``
    req/s, answers after 5 ms (429 past it): the events to replay on the pair."""
    latency = 0.005
    probe = HealthRegistry()  # the client's own pace decides when it sends: replayed on the pair
    tokens, filled, events = 3.0, t0, []
    for i in range(round(seconds * 1000)):
        sent = t0 + i / 1000
        if not probe.try_acquire("a", now=sent):
            continue
        events.append(("acquire", "a", sent, True))
        tokens = min(3.0, tokens + (sent - filled) * rate_at(sent))
        filled = sent
        if tokens >= 1:
            tokens -= 1
            event: tuple[Any, ...] = ("ok", "a", sent + latency, latency)
        else:
            event = ("fail", "a", sent + latency, C429, retry_after, None, latency)
        events.append(event)
        _apply(probe, event)
    return events


@pytest.mark.parametrize(("high", "low", "retry_after"), [(30.0, 5.0, 1.0), (30.0, 5.0, None), (40.0, 30.0, 1.0)])
def test_a_limit_that_falls_restarts_the_fit_alike(
    redis_server: Any, monkeypatch: pytest.MonkeyPatch, high: float, low: float, retry_after: float | None
) -> None:
    """30 -> 5 (or 40 -> 30) req/s at 15 s: the second cut in a row at no more than the learned limit begins the
    fit's history again (pacing.begin_after_fall): with Retry-After where a hold refilled the
    bucket (LimitHistory.refilled / h_fit_refilled, its 429s judged at once), without it as if
    trimmed (LimitHistory.restart / h_fit_restart); the pace interval in which the refusals began
    is no reference, and without Retry-After refusals of requests sent after a cut cut again
    within the second: field for field alike, and the same history."""
    import msgpack
    import redis

    from scrapy_openclaw.health.registry import limitfit

    restarts: list[int] = []
    begin = "refilled" if retry_after else "restart"
    original = getattr(limitfit.LimitHistory, begin)
    monkeypatch.setattr(
        limitfit.LimitHistory, begin, lambda self, index: restarts.append(index) or original(self, index)
    )
    t0 = 1_200_000.0
    events = _bucket_events(t0, 22.0, lambda at: high if at < t0 + 15 else low, retry_after)
    assert restarts, "the limit's fall never restarted the fit: the test proves nothing"
    local, shared = _pair(redis_server.url)
    _drive(local, shared, events)
    history = local.histories.by_domain["a"]
    client = redis.Redis.from_url(redis_server.url)
    stored = [int(v) for v in client.lrange(shared._keys("a")[2], 0, -1)]
    assert stored == [history.start, *history.events]
    assert history.start >= limitfit.fit_bin(t0 + 15, t0)  # (begun again after the fall)
    record = msgpack.unpackb(client.get(shared._keys("a")[0]), raw=True)  # (its policy is packed bytes)
    assert history.full == bool(retry_after) == (record.get(b"fitfull") == 1)
    if low > high / 2:  # (a fall by a quarter: fitted from the new bucket, not half the pace; 17.8 before)
        assert 0.9 * low <= local.state("a").limit <= low
    assert local.state("a").refusals_flat == 0.0


@pytest.mark.parametrize("retry_after", [1.0, None])
def test_a_block_is_ridden_out_alike(
    redis_server: Any, monkeypatch: pytest.MonkeyPatch, retry_after: float | None
) -> None:
    """30 req/s, then nothing from 10 s to 25 s, then 30 again: once nothing has got through for
    a while (pacing.dry / h_dry) the refusals halve the pace, keep the learned limit and begin the
    fit's history again (pacing.ride_out): field for field alike, and the same history."""
    import redis

    from scrapy_openclaw.health.registry import pacing

    ridden: list[float] = []
    original = pacing.ride_out
    monkeypatch.setattr(pacing, "ride_out", lambda d, p, now, *rest: ridden.append(now) or original(d, p, now, *rest))
    t0 = 1_300_000.0
    events = _bucket_events(t0, 35.0, lambda at: 0.0 if t0 + 10 <= at < t0 + 25 else 30.0, retry_after)
    assert ridden and all(t0 + 10 < at < t0 + 26 for at in ridden), "no block was ridden out: the test proves nothing"
    local, shared = _pair(redis_server.url)
    _drive(local, shared, events)
    history = local.histories.by_domain.get("a")
    stored = [int(v) for v in redis.Redis.from_url(redis_server.url).lrange(shared._keys("a")[2], 0, -1)]
    assert stored == ([history.start, *history.events] if history is not None else [])
    assert local.state("a").limit >= 0.8 * 30.0  # (the block left the limit where it was)


def test_limit_fit_histories_match(redis_server: Any) -> None:
    """The history itself, Python's array and Redis's list: kept from birth, dropped when 60 s of
    it hold no 429, started again (as if trimmed) by a later 429, trimmed with 429s in it."""
    import redis

    local, shared = _pair(redis_server.url)
    client = redis.Redis.from_url(redis_server.url)
    key = shared._keys("a")[2]

    def same() -> None:
        history = local.histories.by_domain.get("a")
        stored = [int(v) for v in client.lrange(key, 0, -1)]
        assert stored == ([history.start, *history.events] if history is not None else [])

    t = 1_000_000.0
    events: list[tuple[Any, ...]] = [("acquire", "a", t, True)]
    events += [("ok", "a", t + 0.1 * i, 0.01) for i in range(1, 620)]
    _drive(local, shared, events)
    same()
    assert "a" not in local.histories.by_domain  # 62 s, no 429: dropped on both sides
    events = [("fail", "a", t + 63.0, C429, 1.0, None, 0.01)]
    events += [("ok", "a", t + 64 + 0.1 * i, 0.02) for i in range(140)]
    events += [("fail", "a", t + 78.5, C429, 1.0, None, 0.01)]
    events += [("ok", "a", t + 80 + 0.1 * i, 0.02) for i in range(100)]
    _drive(local, shared, events)
    same()
    history = local.histories.by_domain["a"]
    assert history.start > 0 and any(e < 0 for e in history.events)


def test_rate_signals_and_pace_independent_refusals_match(redis_server: Any) -> None:
    """A 429 or a 503 with Retry-After keeps health over its floor and opens no circuit; every
    third request refused however slowly asked is found pace-independent (then the page's),
    and the pace comes back: field for field, the pace intervals included."""
    local, shared = _pair(redis_server.url, {"circuit_failures": 2, "circuit_jitter": 0.0})
    t, events = 3_000_000.0, []
    for i in range(12):  # a 503 limiter with Retry-After, then 429s without one
        events += [("ok", "m", t + i * 0.4, 0.05), ("fail", "m", t + i * 0.4 + 0.2, C503 if i < 6 else C429, 1.0)]
    for i in range(90):  # every third refused, at whatever pace the registry allows
        now = t + 10 + i * 0.7
        events.append(("acquire", "n", now, True))
        events.append(("fail", "n", now + 0.3, C429, 1.0) if i % 3 == 2 else ("ok", "n", now + 0.3, 0.3))
    _drive(local, shared, events)
    m, n = local.state("m"), local.state("n")
    assert m.health >= 50.0 and m.circuit == "closed"
    assert n.refusals_flat > 0.0 and n.limit is None


def test_a_flat_share_over_a_half_rises_into_a_rate_signal_alike(redis_server: Any) -> None:
    """Refusals proved flat at a share over a half (as a 2 req/s bucket of 10 once was, wrongly):
    8 of 10 refused keeps them flat, then every one refused makes them a rate signal again (the
    rise capped at 0.9, refusals._risen / h_pace_sample): field for field."""
    t = 3_050_000.0
    proved = HealthRegistry()
    proved.record_success("f", 0.005, t)
    proved._domains["f"].refusals_flat = 0.6
    local, shared = _pair(redis_server.url)
    local.restore(proved.snapshot())
    shared.restore(proved.snapshot())
    events: list[tuple[Any, ...]] = []
    for i in range(20):
        now = t + 1.0 + 0.1 * i
        events.append(("fail", "f", now, C429, 1.0, None, 0.005) if i >= 2 else ("ok", "f", now, 0.005))
    _drive(local, shared, events[:10])
    assert local._domains["f"].refusals_flat == 0.6
    _drive(local, shared, events[10:])
    assert local._domains["f"].refusals_flat == 0.0


def test_refusals_proved_flat_on_slow_starts_answers_match(redis_server: Any) -> None:
    """The answers to what slow start sent (answered after the first cut, known by their
    latency) are the reference of the pace-independence proof: field for field alike."""
    local, shared = _pair(redis_server.url)
    t, events, seen = 3_100_000.0, [], 0
    for i in range(9):  # slow start's burst, answered a second later; every third refused
        events.append(("acquire", "s", t + i * 0.01, True))
    for i in range(9):
        answer = t + 1.0 + i * 0.02
        seen += 1
        if seen % 3 == 0:
            events.append(("fail", "s", answer, C429, 1.0, None, None, 1.0))
        else:
            events.append(("ok", "s", answer, 1.0))
    for i in range(12):  # then one a second or so, at whatever pace the registry allows
        now = t + 2.5 + i * 0.9
        seen += 1
        events.append(("acquire", "s", now, True))
        if seen % 3 == 0:
            events.append(("fail", "s", now + 1.0, C429, 1.0, None, None, 1.0))
        else:
            events.append(("ok", "s", now + 1.0, 1.0))
    _drive(local, shared, events)
    assert local.state("s").refusals_flat > 0.0


def test_four_answers_to_slow_start_with_one_refused_between_are_the_reference_alike(redis_server: Any) -> None:
    """Slow start's four answers, the third refused and the fourth (sent after it) through, are the
    reference (refusals._close_slow_start / h_close_slow_start, the open interval's send times
    of its first refusal and last success): both prove the refusals flat at the next interval."""
    from tests.test_moving_limits import HETERO_EVERY_THIRD

    local, shared = _pair(redis_server.url)
    t, latency, events = 3_150_000.0, 0.21, []
    for at, ok in HETERO_EVERY_THIRD[:9]:
        events.append((t + at, 0, ("acquire", "e", t + at, True)))
        answer = (
            ("ok", "e", t + at + latency, latency) if ok else ("fail", "e", t + at + latency, C429, 1.0, None, latency)
        )
        events.append((t + at + latency, 1, answer))
    _drive(local, shared, [event for _, _, event in sorted(events)])
    assert local.state("e").refusals_flat > 0.0


def test_the_first_fit_from_a_whole_burst_matches(redis_server: Any) -> None:
    """The first fit (two episodes) is the middle of the band of rates where a whole burst
    explains the history (LimitHistory._whole / fit_whole): a real record of a 503 limiter of
    10 req/s with a bucket of 3, through both registries, field for field, learns 10 or just under."""
    from tests.test_moving_limits import LIMITER_503

    local, shared = _pair(redis_server.url)
    t, latency, events = 3_250_000.0, 0.001, []
    for at, ok in LIMITER_503:
        events.append((t + at, 0, ("acquire", "w", t + at, True)))
        answer = (
            ("ok", "w", t + at + latency, latency) if ok else ("fail", "w", t + at + latency, C503, 2.0, None, latency)
        )
        events.append((t + at + latency, 1, answer))
    _drive(local, shared, [event for _, _, event in sorted(events)])
    limit = local.state("w").limit
    assert limit is not None and 9.5 <= limit <= 10.0


def test_a_remembered_domain_matches_through_its_plateau_and_first_cuts(redis_server: Any) -> None:
    """Site memory: both start a known domain at its remembered limit, hold it through the
    longer plateau, probe past it, and become ordinary at the first cut (a 503 cut too)."""
    t = 1_000_000.0
    local, _ = _pair(redis_server.url)
    crawler = get_crawler(_Spider, {"REDIS_URL": redis_server.url})
    shared = RedisHealthRegistry(crawler, uniform=lambda a, b: a + 0.3 * (b - a), clock=lambda: t)
    for reg in (local, shared):
        reg.remembered.remember("known", limit=9.8, burst=4)
        reg.remembered.remember("outage", limit=20.0, burst=2)
    for domain in ("known", "outage"):  # first met at t: made from memory (the worker's push ensures it)
        local.state(domain, t)
        shared.ensure(domain)
    events: list[tuple[Any, ...]] = []
    for i in range(400):  # 40 s at the remembered pace: the plateau, then the probe beyond it
        events += [("acquire", "known", t + i * 0.1, True), ("ok", "known", t + i * 0.1 + 0.02, 0.02)]
    events += [("ok", "outage", t + 1, 0.05), *(("fail", "outage", t + 2 + i, TIMEOUT, None) for i in range(3))]
    events.sort(key=lambda e: e[2])
    _drive(local, shared, events)
    domains = local.snapshot()["domains"]
    assert domains["known"]["cuts"] == 3 and domains["known"]["rate"] > 9.8 * 1.02  # probing past the memory
    assert domains["outage"]["cuts"] == 2  # a timeout's cut ends the longer plateau too
    _drive(local, shared, [("fail", "known", t + 40.1, C429, None), ("acquire", "known", t + 41.5, True)])
    assert local.snapshot()["domains"]["known"]["cuts"] == 2  # an ordinary domain from its first cut


def test_a_rounds_records_of_one_domain_in_one_call_leave_what_one_by_one_leaves(redis_server: Any) -> None:
    """During a crawl the records of one domain that wait for the same round go in one script
    call (``link.merged``: one read and one write of the state). The same calls, one by one on
    one domain and merged on another: the same hash, field for field, and the same fit history.
    A change of another kind between records (a token taken) splits them."""
    import redis

    from scrapy_openclaw.distributed.link import merged

    _, shared = _pair(redis_server.url, {"initial_rate": 4.0, "burst": 3, "circuit_failures": 3})
    calls: list[tuple[Any, list[str], list[Any]]] = []

    def capture(script: Any, domain: str, args: list[Any]) -> None:
        calls.append((script, shared._keys(domain), [*args, domain]))
        return None  # (as if Redis were away: the cache answers; the calls are replayed below)

    shared._run = capture  # type: ignore[method-assign]
    t = 2_000_000.0
    events: list[tuple[Any, ...]] = []
    for i in range(30):  # slow start, then 429s with and without Retry-After, 503s, a flapping stretch
        at = t + 0.05 * i
        if i % 7 == 3:
            events.append(("fail", "x", at, C429, 1.0 if i % 2 else None, None, 0.02))
        elif i % 11 == 5:
            events.append(("fail", "x", at, C503, None, None, 0.3))
        else:
            events.append(("ok", "x", at, 0.02 + 0.001 * i))
        if i == 17:
            events.append(("acquire", "x", at + 0.01, True))
    for event in events:
        _apply(shared, event)
    assert len(calls) == len(events)

    def on(domain: str) -> list[tuple[Any, list[str], list[Any], Any]]:
        return [(s, shared._keys(domain), [*a[:-1], domain], None) for s, _, a in calls]

    for script, keys, args, _ in on("one.test"):
        script(keys=keys, args=args)
    together = merged(on("all.test"))
    assert [len(a) // 16 for s, _, a, _ in together if s is shared._record] == [18, 12]  # (split by the token)
    for script, keys, args, _ in together:
        script(keys=keys, args=args)
    client = redis.Redis.from_url(redis_server.url)
    one, every = (record(client, shared._keys(d)[0]) for d in ("one.test", "all.test"))
    del one["ttl_at"], every["ttl_at"]  # (when the TTL was set: at the first record, or the last)
    assert one == every and one["requests"] > 0
    assert client.lrange(shared._keys("one.test")[2], 0, -1) == client.lrange(shared._keys("all.test")[2], 0, -1)
    client.close()


def test_a_fit_history_gone_under_its_start_is_begun_again_by_merged_records_as_by_single_ones(
    redis_server: Any,
) -> None:
    """A round's notes to the fit history are one RPUSHX; when the list expired or was removed
    under the start the record keeps, it is begun again as if trimmed, the same whether the
    round's records came in one call or one by one: the list then holds what followed."""
    import redis

    from scrapy_openclaw.distributed.link import merged

    _, shared = _pair(redis_server.url)
    calls: list[tuple[Any, list[str], list[Any]]] = []

    def capture(script: Any, domain: str, args: list[Any]) -> None:
        calls.append((script, shared._keys(domain), [*args, domain]))
        return None

    shared._run = capture  # type: ignore[method-assign]
    t = 3_000_000.0
    first = [("ok", "x", t + 0.05 * i, 0.02) for i in range(8)]
    then = [("ok", "x", t + 1 + 0.05 * i, 0.02) for i in range(6)] + [("fail", "x", t + 1.4, C429, 1.0, None, 0.02)]
    for event in [*first, *then]:
        _apply(shared, event)
    assert len(calls) == len(first) + len(then)

    def on(domain: str, part: list[Any]) -> list[tuple[Any, list[str], list[Any], Any]]:
        return [(s, shared._keys(domain), [*a[:-1], domain], None) for s, _, a in part]

    client = redis.Redis.from_url(redis_server.url)
    for domain, merge in (("one.test", False), ("all.test", True)):
        before, after = on(domain, calls[: len(first)]), on(domain, calls[len(first) :])
        for script, keys, args, _ in merged(before) if merge else before:
            script(keys=keys, args=args)
        assert client.llen(shared._keys(domain)[2]) == 1 + len(first)  # (the start, then 8 notes)
        client.delete(shared._keys(domain)[2])  # (gone: expired, or removed by hand)
        together = merged(after) if merge else after
        assert len(together) == (1 if merge else len(then))
        for script, keys, args, _ in together:
            script(keys=keys, args=args)
    one, every = (client.lrange(shared._keys(d)[2], 0, -1) for d in ("one.test", "all.test"))
    assert one == every and len(one) == 1 + len(then)  # begun again: its start, then what followed
    assert int(one[0]) == 0 and int(one[-1]) < 0  # (a young domain's start; the 429 last)
    records = [record(client, shared._keys(d)[0]) for d in ("one.test", "all.test")]
    for r in records:
        del r["ttl_at"]
    assert records[0] == records[1]
    client.close()


def test_a_snapshot_restored_into_redis_is_the_record_the_scripts_read(redis_server: Any) -> None:
    """A checkpoint's health snapshot written into Redis (``restore``) is a record like the
    scripts' own: they read it (an open circuit stays open), and the first writer wins."""
    local, shared = _pair(redis_server.url, {"circuit_failures": 2, "circuit_cooldown": 60.0, "circuit_jitter": 0.0})
    now = time.time()
    for i in range(2):
        local.record_failure("down.test", TIMEOUT, now + i)
    local.record_success("up.test", 0.1, now)
    data = local.snapshot()
    shared.restore(data)
    client = redis.Redis.from_url(redis_server.url)
    stored = record(client, shared.health_key("down.test"))
    assert stored["circuit"] == "open" and stored["failures"] == 2 and "latency" not in stored
    assert not shared.try_acquire("down.test", now + 3)  # the script reads the restored circuit
    assert shared.try_acquire("up.test", now + 3)
    assert record(client, shared.health_key("down.test"))["circuit"] == "open"
    _, other = _pair(redis_server.url)
    other.restore({**data, "domains": {"down.test": {**data["domains"]["down.test"], "failures": 9}}})
    assert record(client, shared.health_key("down.test"))["failures"] == 2  # (already there: kept)
    client.close()
