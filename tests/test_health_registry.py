"""Unit tests of the HealthRegistry: scoring, AIMD, token bucket, circuit, holds, persistence."""

from __future__ import annotations

import json
import math
import time

import pytest
from scrapy.exceptions import NotConfigured
from scrapy.settings import Settings
from scrapy.utils.misc import build_from_crawler
from scrapy.utils.test import get_crawler

from scrapy_openclaw.errors import Classification, ErrorClass
from scrapy_openclaw.health import DomainHealthMiddleware, DomainState, HealthRegistry
from scrapy_openclaw.policy import PolicySet

T0 = 1_700_000_000.0
D = "example.com"
HTTP_429 = Classification(ErrorClass.PROTOCOL_RETRYABLE, "http_429", 429)
HTTP_500 = Classification(ErrorClass.PROTOCOL_RETRYABLE, "http_500", 500)
HTTP_404 = Classification(ErrorClass.PROTOCOL_PERMANENT, "http_404", 404)
TIMEOUT = Classification(ErrorClass.NETWORK, "timeout")
REFUSED = Classification(ErrorClass.NETWORK, "refused")


def registry(**health: float) -> HealthRegistry:
    policy = {"defaults": {"health": health}} if health else {}
    return HealthRegistry(PolicySet.from_settings(Settings({"OPENCLAW_POLICY": policy})))


# --- scoring -------------------------------------------------------------------


def test_new_domain_starts_healthy() -> None:
    state = registry().state(D, T0)
    assert isinstance(state, DomainState)
    assert (state.health, state.circuit, state.hold_until, state.requests) == (100.0, "closed", 0.0, 0)
    # slow start from initial_rate; a quarter second's worth of tokens; Scrapy's per-domain concurrency
    assert (state.rate, state.tokens, state.burst, state.concurrency) == (10.0, 2.0, 2, 8)
    assert state.limit is None  # nothing learned yet


@pytest.mark.parametrize(
    ("classification", "expected"),
    [(HTTP_429, 80.0), (TIMEOUT, 90.0), (REFUSED, 90.0), (HTTP_500, 95.0), (HTTP_404, 100.0)],
)
def test_failures_cost_their_penalty(classification: Classification, expected: float) -> None:
    reg = registry(recovery_per_minute=0)
    before = 5 if classification is HTTP_500 else 0
    for _ in range(before):  # five 500s could be five broken pages: they cost nothing ...
        reg.record_failure(D, classification, now=T0)
    assert reg.state(D, T0).health == 100.0
    reg.record_failure(D, classification, now=T0)  # ... a sixth in a row is the domain's
    state = reg.state(D, T0)
    assert state.health == expected
    assert (state.requests, state.failures) == (before + 1, before + 1)
    # a 429 says "slower", not "sick": it is no failure in a row towards the circuit
    assert state.consecutive_failures == (0 if expected == 100.0 or classification is HTTP_429 else 1)


def test_success_raises_health_slowly_and_is_capped() -> None:
    reg = registry(recovery_per_minute=0)
    reg.record_failure(D, HTTP_429, now=T0)
    for i in range(3):
        reg.record_success(D, 0.01, now=T0 + 0.1 * i)
    assert reg.state(D, T0 + 1).health == 83.0
    for i in range(50):
        reg.record_success(D, 0.01, now=T0 + 1 + 0.1 * i)
    state = reg.state(D, T0 + 10)
    assert state.health == 100.0
    assert (state.successes, state.consecutive_failures) == (53, 0)


def test_health_recovers_while_quiet() -> None:
    reg = registry(recovery_per_minute=12, timeout_penalty=20, circuit_failures=1000)
    for i in range(3):
        reg.record_failure(D, TIMEOUT, now=T0 + i)
    assert reg.state(D, T0 + 2).health == pytest.approx(40.0 + 12 * 2 / 60)
    assert reg.state(D, T0 + 2 + 150).health == pytest.approx(70.4)
    assert reg.state(D, T0 + 3600).health == 100.0


def test_health_scales_concurrency_and_caps_rate() -> None:
    reg = registry(
        base_concurrency=10,
        base_rate=10,
        min_rate=0.5,
        recovery_per_minute=0,
        circuit_floor=0,
        circuit_failures=1000,
        timeout_penalty=20,
    )
    for i in range(3):
        reg.record_failure(D, TIMEOUT, now=T0 + 10 * i)
    state = reg.state(D, T0 + 30)
    assert state.health == 40.0
    assert state.concurrency == 3  # min(base_concurrency 10, Scrapy's 8) x 40%
    assert reg.concurrency(D, 20) == 4  # a slot of its own concurrency (DOWNLOAD_SLOTS): capped at 10
    assert state.rate <= 4.0
    for i in range(2):
        reg.record_failure(D, TIMEOUT, now=T0 + 40 + 10 * i)
    state = reg.state(D, T0 + 60)
    assert (state.health, state.concurrency, state.rate) == (0.0, 1, 0.5)  # floors: 1 and min_rate


# --- AIMD ----------------------------------------------------------------------


def test_slow_start_then_the_delivered_rate_then_growth_then_the_cubic() -> None:
    reg = registry(initial_rate=2, rate_probe=0.004, rate_decrease=0.85, throttle_penalty=0, circuit_floor=0)
    assert reg.state(D, T0).rate == 2.0
    for i in range(1, 4):  # slow start: +50% per success, no ceiling
        reg.record_success(D, 0.01, now=T0 + 0.1 * i)
    assert reg.state(D, T0 + 0.3).rate == pytest.approx(2 * 1.5**3)
    for i in range(200):  # nothing paces it now: the site delivers 40 pages/s for 5 s
        reg.record_success(D, 0.01, now=T0 + 1 + 0.025 * i)
    assert reg.state(D, T0 + 6).rate == math.inf  # unpaced: reported as unbounded
    reg.record_failure(D, HTTP_429, now=T0 + 6, retry_after=0)
    state = reg.state(D, T0 + 6)
    # the first 429: the limit is what the site delivered, not the (unbounded) allowed rate
    assert 35 <= state.limit <= 40  # (the last 1 s window and the open one)
    assert state.rate == pytest.approx(0.85 * state.limit)
    first = state.limit
    # That first limit is a guess: the rate grows by half per second until a second signal ...
    reg.record_success(D, 0.01, now=T0 + 7)
    rate = reg.state(D, T0 + 7).rate
    assert rate == pytest.approx(1.5 * 0.85 * first)
    reg.record_failure(D, HTTP_429, now=T0 + 7.5, retry_after=0)
    limit = reg.state(D, T0 + 7.5).limit
    # what it delivered lately, but never below half the rate (one bad window cannot collapse it)
    assert 0.5 * rate <= limit < rate
    # ... then the cubic: back near the limit after K = cbrt(0.15 / 0.004) = 3.35 s, flat there ...
    rates = []
    for t in (1, 2, 3.35, 4.5, 8, 12):
        reg.record_success(D, 0.01, now=T0 + 7.5 + t)
        rates.append(reg.state(D, T0 + 7.5 + t).rate / limit)
    assert rates == sorted(rates)  # never down without a signal
    assert rates[2] == pytest.approx(1.0, abs=0.01)
    assert rates[3] < 1.01  # the plateau: probing past the limit starts slowly ...
    # ... past 1.02 x the limit with answers clean (at K + cbrt(0.02 / 0.004) = 5.06 s) the
    # limit has moved: x1.5 per second from there (a learned limit ages; it is no ceiling)
    assert rates[4] == pytest.approx(1.02 * 1.5 ** (8 - 3.347 - (0.02 / 0.004) ** (1 / 3)), abs=0.01)
    assert rates[5] > 10.0  # a low guess is left behind within seconds


def test_an_outage_is_no_limit_503s_keep_probing_up_a_429_settles_on_the_cubic() -> None:
    """After the first cut the rate grows by half per second; a second 503 (an outage says
    nothing of a limit) keeps it growing so, a second 429 (or latency) starts the cubic plateau."""

    def after_two_cuts(second: Classification, retry_after: float | None = 0) -> list[float]:
        reg = registry(initial_rate=8, rate_probe=0.0001, rate_decrease=0.9, throttle_penalty=0, circuit_floor=0)
        for i in range(100):  # 20 pages/s delivered for 5 s
            reg.record_success(D, 0.01, now=T0 + 0.05 * i)
        reg.record_failure(D, HTTP_429, now=T0 + 5, retry_after=0)
        reg.record_failure(D, second, now=T0 + 6.5, retry_after=retry_after)
        after = reg.state(D, T0 + 6.5).rate
        rates = []
        for t in (1, 2, 3):
            reg.record_success(D, 0.01, now=T0 + 6.5 + t)
            rates.append(reg.state(D, T0 + 6.5 + t).rate / after)
        return rates

    probing = after_two_cuts(HTTP_503, retry_after=None)
    assert probing[-1] > 1.5**2.5  # x1.5 per second: past 2.8x after 3 s
    plateau = after_two_cuts(HTTP_429)
    assert plateau[-1] < 1.15  # the cubic, flat near the measured limit
    # a 503 that says when to come back is a limiter's refusal, measured as a 429 is
    assert after_two_cuts(HTTP_503, retry_after=2)[-1] < 1.15  # (held 2 s: the cubic starts later)


def test_burst_of_429s_decreases_once_per_second_and_stops_at_min_rate() -> None:
    reg = registry(initial_rate=8, rate_decrease=0.5, min_rate=0.5, throttle_penalty=0, circuit_floor=0)
    # (no success yet: nothing delivered, so the allowed rate is the limit)
    for i in range(10):  # ten 429s within half a second: one decrease
        reg.record_failure(D, HTTP_429, now=T0 + 0.05 * i, retry_after=0)
    assert reg.state(D, T0 + 0.5).rate == pytest.approx(4.0)
    for i in range(1, 10):
        reg.record_failure(D, HTTP_429, now=T0 + 1.0 * i, retry_after=0)
    assert reg.state(D, T0 + 9).rate == pytest.approx(0.5)


def test_rising_latency_is_a_congestion_signal() -> None:
    reg = registry(initial_rate=8, latency_factor=3, rate_decrease=0.5, circuit_floor=0)
    reg.record_failure(D, HTTP_429, now=T0 - 10, retry_after=0)  # leave slow start
    for i in range(20):
        reg.record_success(D, 0.1, now=T0 + 0.05 * i)
    rate = reg.state(D, T0 + 1).rate
    for i in range(20):  # latency rises tenfold, no errors
        reg.record_success(D, 1.0, now=T0 + 2 + 0.5 * i)
    state = reg.state(D, T0 + 12)
    assert state.latency == pytest.approx(1.0, abs=0.05)
    assert state.rate < rate / 2
    assert state.health == 100.0  # slower, not sicker


def test_a_domains_first_answers_form_its_baseline_and_are_no_congestion() -> None:
    """Start-up latency (connection set-up, every domain of a crawl beginning at once) is
    not the site's: within its first answers a slow one does not cut the pace."""
    reg = registry(initial_rate=8, latency_factor=3)
    latencies = [0.01, 0.01, 0.3, 0.5, 0.4, 0.2] + [0.01] * 14
    for i, latency in enumerate(latencies):
        reg.record_success(D, latency, now=T0 + 0.05 * i)
    state = reg.state(D, T0 + 1)
    assert state.limit is None and state.rate > 8
    for i in range(20):  # past the warm-up the same rise is congestion
        reg.record_success(D, 0.5, now=T0 + 2 + 0.05 * i)
    assert reg.state(D, T0 + 3).limit is not None


def test_small_latency_jitter_is_not_congestion() -> None:
    reg = registry(initial_rate=4, base_rate=100)
    for i in range(40):
        reg.record_success(D, 0.001 if i % 2 else 0.02, now=T0 + 0.25 * i)
    assert reg.state(D, T0 + 10).rate > 100 * 0.99
    assert reg.state(D, T0 + 10).limit is None


# --- token bucket --------------------------------------------------------------


def test_token_bucket_allows_a_burst_then_the_rate() -> None:
    reg = registry(initial_rate=12, burst=3)
    assert [reg.try_acquire(D, T0) for _ in range(4)] == [True, True, True, False]
    assert reg.ready_at(D, T0) == pytest.approx(T0 + 1 / 12, abs=1e-6)
    assert not reg.try_acquire(D, T0 + 0.08)
    assert reg.try_acquire(D, T0 + 1 / 12 + 1e-6)
    assert reg.ready_at(D, T0 + 1 / 12 + 1e-6) == pytest.approx(T0 + 2 / 12, abs=1e-6)
    assert reg.state(D, T0 + 100).tokens == 3.0  # refills to the burst, no further


def test_a_refund_gives_back_a_token_and_wakes_the_domain_once() -> None:
    """A request the HTTP cache answered never reached the site: its token goes back."""
    reg = registry(initial_rate=12, burst=3)
    assert [reg.try_acquire(D, T0) for _ in range(4)] == [True, True, True, False]
    epoch = reg.readiness_epoch
    reg.refund(D, T0)
    assert reg.readiness_epoch == epoch + 1 and reg.try_acquire(D, T0)
    for _ in range(5):
        reg.refund(D, T0)
    assert reg.state(D, T0).tokens == 3.0 and reg.readiness_epoch == epoch + 2  # the burst caps it
    assert reg.state(D, T0).health == 100.0 and reg.state(D, T0).requests == 0  # no signal either


def test_a_slow_domain_gets_no_burst_after_a_pause() -> None:
    # burst 5, but at 2 req/s a quarter second holds less than one request:
    # after a hold the domain resumes at its pace, not with five at once
    reg = registry(initial_rate=2, burst=5)
    assert [reg.try_acquire(D, T0 + 60) for _ in range(2)] == [True, False]
    assert reg.state(D, T0 + 60).burst == 1


def test_token_false_checks_only_hold_and_circuit() -> None:
    reg = registry(burst=1)
    assert reg.try_acquire(D, T0)
    assert not reg.try_acquire(D, T0)
    assert reg.try_acquire(D, T0, token=False)
    reg.hold(D, T0 + 5)
    assert not reg.try_acquire(D, T0 + 1, token=False)


# --- circuit breaker -----------------------------------------------------------


def test_consecutive_failures_open_the_circuit_and_one_probe_decides() -> None:
    reg = registry(circuit_failures=3, circuit_cooldown=10, circuit_floor=0, connection_penalty=1, circuit_jitter=0)
    for i in range(3):
        assert reg.state(D, T0 + i).circuit == "closed"
        changed = reg.record_failure(D, REFUSED, now=T0 + i)
        assert changed == (None if i < 2 else "open")  # the record says what it changed
    state = reg.state(D, T0 + 2)
    assert (state.circuit, state.concurrency) == ("open", 1)
    assert not reg.try_acquire(D, T0 + 5)
    assert reg.ready_at(D, T0 + 5) == pytest.approx(T0 + 12, abs=1e-6)
    # Cool-down over: half-open, exactly one probe.
    assert reg.state(D, T0 + 12).circuit == "half_open"
    assert reg.try_acquire(D, T0 + 12)
    assert not reg.try_acquire(D, T0 + 12.1)
    assert not reg.try_acquire(D, T0 + 12.1, token=False)
    assert reg.ready_at(D, T0 + 12.1) > T0 + 12.1
    # The probe fails: open again, for twice the cool-down.
    assert reg.record_failure(D, REFUSED, now=T0 + 13) == "open"
    assert reg.record_failure(D, REFUSED, now=T0 + 13.5) is None  # already open
    assert reg.state(D, T0 + 13).circuit == "open"
    assert reg.ready_at(D, T0 + 13) == pytest.approx(T0 + 33, abs=1e-6)
    assert not reg.try_acquire(D, T0 + 32.9)
    # The next probe succeeds: closed.
    assert reg.try_acquire(D, T0 + 33)
    assert reg.record_success(D, 0.05, now=T0 + 33.1) == "closed"
    assert reg.record_success(D, 0.05, now=T0 + 33.2) is None
    state = reg.state(D, T0 + 33.1)
    assert (state.circuit, state.consecutive_failures) == ("closed", 0)
    assert reg.try_acquire(D, T0 + 33.1)


def test_low_health_opens_the_circuit() -> None:
    reg = registry(circuit_floor=50, circuit_failures=1000, recovery_per_minute=0, timeout_penalty=20)
    for i in range(3):
        reg.record_failure(D, TIMEOUT, now=T0 + i)
    assert reg.state(D, T0 + 2).circuit == "open"  # 40 < 50


def test_a_domain_down_past_give_up_after_is_given_up_for_good() -> None:
    reg = registry(circuit_failures=1, circuit_cooldown=2, circuit_cooldown_max=2, circuit_jitter=0, give_up_after=30)
    assert not reg.given_up(D, T0)  # never seen: no state made up
    assert D not in reg.domains()
    reg.record_success(D, 0.1, now=T0 - 100)  # it answered once: give_up_after applies
    reg.record_failure(D, REFUSED, now=T0)
    for t in range(3, 30, 3):  # probes keep failing: the outage's clock runs from the first opening
        assert reg.try_acquire(D, T0 + t, token=False)
        reg.record_failure(D, REFUSED, now=T0 + t + 0.1)
        assert not reg.given_up(D, T0 + t + 0.2)
    assert reg.down_for(D, T0 + 29) == pytest.approx(29)
    assert reg.given_up(D, T0 + 30)
    assert reg.try_acquire(D, T0 + 33, token=False)
    reg.record_success(D, 0.1, now=T0 + 33.1)  # too late: given up stays given up
    assert reg.given_up(D, T0 + 34)


def test_a_closed_circuit_restarts_the_outage_clock_and_none_never_gives_up() -> None:
    reg = registry(circuit_failures=1, circuit_cooldown=5, circuit_cooldown_max=5, circuit_jitter=0, give_up_after=8)
    reg.record_success(D, 0.1, now=T0 - 100)
    reg.record_failure(D, REFUSED, now=T0)
    assert reg.down_for(D, T0 + 4) == pytest.approx(4)
    assert reg.try_acquire(D, T0 + 5, token=False)
    assert reg.record_success(D, 0.1, now=T0 + 5.1) == "closed"
    assert reg.down_for(D, T0 + 6) == 0.0
    reg.record_failure(D, REFUSED, now=T0 + 7)  # a new outage
    assert not reg.given_up(D, T0 + 14)
    assert reg.given_up(D, T0 + 15.5)
    never = registry(circuit_failures=1, circuit_jitter=0, give_up_after=None, unreachable_give_up=None)
    never.record_failure(D, REFUSED, now=T0)
    assert not never.given_up(D, T0 + 86400 * 30)


def test_results_while_open_do_not_close_the_circuit() -> None:
    reg = registry(circuit_failures=1, circuit_cooldown=10)
    reg.record_failure(D, REFUSED, now=T0)
    reg.record_success(D, 0.01, now=T0 + 1)  # an in-flight request came back fine
    assert reg.state(D, T0 + 1).circuit == "open"


def test_lost_probe_is_replaced_after_a_while() -> None:
    reg = registry(circuit_failures=1, circuit_cooldown=5, circuit_jitter=0)
    reg.record_failure(D, REFUSED, now=T0)
    assert reg.try_acquire(D, T0 + 5)
    assert not reg.try_acquire(D, T0 + 9)
    assert not reg.try_acquire(D, T0 + 34)  # a slow probe is not a lost one
    assert reg.try_acquire(D, T0 + 36)  # after the cool-down and at least 30 s


HTTP_503 = Classification(ErrorClass.PROTOCOL_RETRYABLE, "http_503", 503)


def reopen_after(reg: HealthRegistry, now: float) -> float:
    """Fail the domain's probe (or first request) at *now*; the cool-down that follows."""
    reg.record_failure(D, REFUSED, now=now)
    assert reg.state(D, now).circuit == "open"
    return reg.blocked_until(D, now) - now


def test_cooldown_doubles_with_each_failed_probe_up_to_the_cap() -> None:
    reg = registry(circuit_failures=1, circuit_cooldown=1, circuit_cooldown_max=10, circuit_jitter=0)
    now, cooldowns = T0, []
    for _ in range(7):
        cooldowns.append(reopen_after(reg, now))
        now += cooldowns[-1]
        assert reg.state(D, now).circuit == "half_open"
        assert reg.try_acquire(D, now)  # the probe goes out ... and fails (next loop)
    assert cooldowns == pytest.approx([1, 2, 4, 8, 10, 10, 10])


def test_cooldown_is_forgiven_while_the_domain_stays_closed() -> None:
    reg = registry(circuit_failures=1, circuit_cooldown=1, circuit_cooldown_max=60, circuit_jitter=0)
    now = T0
    for _ in range(4):  # 1 + 2 + 4 + 8 s: a long outage
        now += reopen_after(reg, now)
        reg.try_acquire(D, now)
    reg.record_success(D, 0.01, now=now)  # the probe is answered: closed
    assert reg.state(D, now).circuit == "closed"
    # A relapse right after closing carries on where the outage left off ...
    assert reopen_after(reg, now + 0.5) == pytest.approx(16)
    now += 0.5 + 16
    reg.try_acquire(D, now)
    reg.record_success(D, 0.01, now=now)
    # ... while each cool-down's worth of healthy time forgives one doubling:
    # 3 s closed after five openings in a row: back to 2**(5 - 3) = 4 s.
    assert reopen_after(reg, now + 3) == pytest.approx(4)
    now += 3 + 4
    reg.try_acquire(D, now)
    reg.record_success(D, 0.01, now=now)
    # A flapping site (a few seconds of 503s every ten) starts from the base every time.
    assert reopen_after(reg, now + 60) == pytest.approx(1)


def test_cooldown_jitter_stays_within_its_share() -> None:
    seen = []
    for pick in (lambda a, b: a, lambda a, b: b):
        reg = HealthRegistry(
            PolicySet.from_settings(
                Settings(
                    {
                        "OPENCLAW_POLICY": {
                            "defaults": {
                                "health": {"circuit_failures": 1, "circuit_cooldown": 10, "circuit_jitter": 0.2}
                            }
                        }
                    }
                )
            ),
            uniform=pick,
        )
        seen.append(reopen_after(reg, T0))
    assert seen == pytest.approx([8.0, 12.0])
    reg = registry(circuit_failures=1, circuit_cooldown=10, circuit_jitter=0.2)
    for i in range(20):
        reg.record_failure(f"{i}.test", REFUSED, now=T0)
    cooldowns = {round(reg.blocked_until(f"{i}.test", T0) - T0, 6) for i in range(20)}
    assert all(8.0 <= c <= 12.0 for c in cooldowns)
    assert len(cooldowns) > 1  # domains failing together do not all probe together


def test_a_burst_of_503s_is_one_congestion_event() -> None:
    reg = registry(circuit_failures=1000, circuit_floor=0, recovery_per_minute=0)
    for i in range(8):  # a 503 window begins: the requests in flight all fail together
        reg.record_failure(D, HTTP_503, now=T0 + 0.01 * i)
    state = reg.state(D, T0 + 0.1)
    assert state.health == 80.0  # one penalty ...
    # ... for the three failures in a row that the 5xx share marks as the domain's
    # (the first five could still have been five broken pages)
    assert state.consecutive_failures == 3
    reg.record_failure(D, HTTP_503, now=T0 + 1.5)  # a later one is a new event
    assert reg.state(D, T0 + 1.5).health == 60.0
    reg.record_failure(D, REFUSED, now=T0 + 1.6)  # not congestion: each costs its own penalty
    reg.record_failure(D, REFUSED, now=T0 + 1.7)
    assert reg.state(D, T0 + 1.7).health == 40.0


def test_failures_while_the_circuit_is_open_cost_no_health() -> None:
    reg = registry(circuit_failures=3, circuit_cooldown=1, circuit_jitter=0, recovery_per_minute=0)
    for i in range(8):  # five that could be broken pages, then three the 5xx share blames on the domain
        reg.record_failure(D, HTTP_503, now=T0 + 0.01 * i)
    assert reg.state(D, T0 + 0.1).circuit == "open"
    reg.record_failure(D, HTTP_503, now=T0 + 0.5)  # still in flight when it opened
    now = T0 + 0.07
    for _ in range(4):  # four failed probes, seconds apart
        now = reg.blocked_until(D, now)
        assert reg.try_acquire(D, now)
        reg.record_failure(D, HTTP_503, now=now)
    state = reg.state(D, now)
    assert (state.circuit, state.health, state.failures) == ("open", 80.0, 13)
    assert state.hold_until < now  # no hold of its own: the cool-down decides (16 s now)
    assert reg.blocked_until(D, now) == pytest.approx(now + 16, abs=1e-6)


def test_a_flapping_site_is_found_again_within_seconds_with_the_defaults() -> None:
    """A 3 s window of 503s every 10 s (no Retry-After), at the default policy."""
    reg = registry()
    now, sent, down = T0, 0, lambda t: (t - T0) % 10 < 3
    while now < T0 + 60:
        if reg.try_acquire(D, now):
            sent += 1
            if down(now):
                reg.record_failure(D, HTTP_503, now=now + 0.02)
            else:
                reg.record_success(D, 0.02, now=now + 0.02)
        now += 0.05
        if not down(now) and now - T0 > 4 and (now - T0) % 10 > 5.5:
            # at most two and a half seconds after each window: closed and sending again (at
            # this slow pace the five failures that could still be broken pages take a second,
            # so the circuit opens a second into the window and its probes come later)
            state = reg.state(D, now)
            assert state.circuit == "closed", (now - T0, state)
    state = reg.state(D, now)
    assert state.health > 50 and state.rate > 2
    assert sent > 150  # most of the time at a useful pace, not at the floor


# --- holds ---------------------------------------------------------------------


def test_retry_after_holds_the_domain_capped() -> None:
    reg = registry(retry_after_cap=60)
    reg.record_failure(D, HTTP_429, now=T0, retry_after=7)
    assert reg.state(D, T0).hold_until == T0 + 7
    assert reg.ready_at(D, T0 + 1) == T0 + 7
    assert reg.blocked_until(D, T0 + 1) == T0 + 7
    assert not reg.try_acquire(D, T0 + 6.9)
    assert reg.try_acquire(D, T0 + 7)
    reg.record_failure(D, HTTP_429, now=T0 + 8, retry_after=10_000)
    assert reg.state(D, T0 + 8).hold_until == T0 + 68


def test_throttle_without_retry_after_holds_briefly() -> None:
    reg = registry(initial_rate=4, rate_decrease=0.5)
    reg.record_failure(D, HTTP_429, now=T0)
    assert reg.state(D, T0).hold_until == pytest.approx(T0 + 0.5, abs=1e-6)  # one interval at the new rate
    reg.record_failure(D, HTTP_500, now=T0 + 1)
    assert reg.state(D, T0 + 1).hold_until == pytest.approx(T0 + 0.5, abs=1e-6)  # a 500 is no throttle


def test_holds_only_extend() -> None:
    reg = registry()
    reg.hold(D, T0 + 10)
    reg.hold(D, T0 + 5)
    assert reg.state(D, T0).hold_until == T0 + 10


# --- policies ------------------------------------------------------------------


def test_per_domain_policy_overrides_apply_to_that_domain_only() -> None:
    policy = {
        "defaults": {"health": {"base_concurrency": 4}},
        "domains": {
            "slow.example.com": {"health": {"initial_rate": 1, "burst": 2, "throttle_penalty": 50}},
            "*.cdn.example.com": {"health": {"circuit_failures": 1}},
        },
    }
    reg = HealthRegistry(PolicySet.from_settings(Settings({"OPENCLAW_POLICY": policy})))
    for domain in ("slow.example.com", "a.cdn.example.com", "other.example.com"):
        reg.record_failure(domain, HTTP_429, now=T0, retry_after=0)
    slow, cdn, other = (reg.state(d, T0) for d in reg.domains())
    assert (slow.health, slow.rate) == (50.0, 0.9)
    assert (cdn.health, cdn.circuit) == (80.0, "closed")  # (a 429 never opens it) ...
    reg.record_failure("a.cdn.example.com", REFUSED, now=T0 + 1)
    assert reg.state("a.cdn.example.com", T0 + 1).circuit == "open"  # ... a refused connection at once
    assert (other.health, other.circuit, other.rate, other.concurrency) == (80.0, "closed", 9.0, 3)
    assert reg.policy("slow.example.com").burst == 2 and reg.policy("other.example.com").burst == 5


# --- persistence ---------------------------------------------------------------


def test_snapshot_is_json_safe_and_restores_exactly() -> None:
    reg = registry(circuit_failures=2, circuit_cooldown=10)
    reg.record_success(D, 0.2, now=T0)
    reg.record_failure("b.test", REFUSED, now=T0)
    reg.record_failure("b.test", REFUSED, now=T0 + 0.5)
    reg.record_failure("b.test", HTTP_429, now=T0 + 1, retry_after=30)
    reg.try_acquire(D, T0 + 1)
    data = json.loads(json.dumps(reg.snapshot(), allow_nan=False))
    other = registry(circuit_failures=2, circuit_cooldown=10)
    other.restore(data)
    assert other.domains() == [D, "b.test"]
    for domain in other.domains():
        assert other.state(domain, T0 + 2) == reg.state(domain, T0 + 2)
    assert other.state("b.test", T0 + 2).circuit == "open"
    assert not other.try_acquire("b.test", T0 + 20)


def test_snapshot_without_cooldown_fields_restores_with_the_policy_cooldown() -> None:
    reg = registry(circuit_failures=1, circuit_cooldown=10, circuit_jitter=0)
    reg.record_failure(D, REFUSED, now=T0)
    data = json.loads(json.dumps(reg.snapshot()))
    for fields in data["domains"].values():  # as written before cool-downs grew
        del fields["cooldown"], fields["opens"]
    other = registry(circuit_failures=1, circuit_cooldown=10, circuit_jitter=0)
    other.restore(data)
    assert other.blocked_until(D, T0 + 1) == pytest.approx(T0 + 10, abs=1e-6)
    assert other.state(D, T0 + 10).circuit == "half_open"


def test_a_snapshot_from_before_burst_caps_or_with_a_negative_one_leaves_the_bucket_uncapped() -> None:
    reg = registry(burst=10)
    reg.record_success(D, 0.01, now=T0)
    data = json.loads(json.dumps(reg.snapshot()))
    for value in (None, -5):
        fields = data["domains"][D]
        if value is None:
            del fields["burst_cap"]  # written before the field existed
        else:
            fields["burst_cap"] = value  # hostile
        other = registry(burst=10)
        other.restore(data)
        assert other._domains[D].burst_cap == 0
        assert other.state(D, T0).burst == reg.state(D, T0).burst


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "expected a dict"),
        ({"version": 99, "domains": {}}, "unsupported version 99"),
        ({"version": 1, "domains": []}, "'domains' must be a mapping"),
        ({"version": 1, "domains": {"a.test": {"health": "high"}}}, "domain 'a.test': field 'health'"),
        ({"version": 1, "domains": {"a.test": {"colour": 1}}}, "unknown field 'colour'"),
        ({"version": 1, "domains": {"a.test": {"circuit": "ajar"}}}, "'ajar' is not closed/open/half_open"),
        ({"version": 1, "domains": {"a.test": {"requests": True}}}, "field 'requests'"),
    ],
)
def test_restore_rejects_bad_data_naming_the_spot(data: object, message: str) -> None:
    reg = registry()
    reg.record_success(D, 0.1, now=T0)
    with pytest.raises(ValueError, match=message):
        reg.restore(data)
    assert reg.domains() == [D]  # nothing lost


# --- wiring --------------------------------------------------------------------


class _OtherRegistry(HealthRegistry):
    pass


def test_for_crawler_is_one_registry_of_the_configured_class() -> None:
    crawler = get_crawler(settings_dict={"OPENCLAW_HEALTH_REGISTRY_CLASS": f"{__name__}._OtherRegistry"})
    reg = HealthRegistry.for_crawler(crawler)
    assert type(reg) is _OtherRegistry
    assert HealthRegistry.for_crawler(crawler) is reg
    assert HealthRegistry.for_crawler(get_crawler()) is not reg


def test_middleware_switched_off_is_not_configured() -> None:
    crawler = get_crawler(settings_dict={"OPENCLAW_HEALTH_ENABLED": False})
    with pytest.raises(NotConfigured):
        build_from_crawler(DomainHealthMiddleware, crawler)


# --- page or domain ------------------------------------------------------------


def test_a_page_that_keeps_failing_while_its_siblings_succeed_is_the_pages_trouble() -> None:
    reg = registry()
    now = T0
    first_failure = None
    for i in range(200):  # every 5th page is broken for good; each is retried twice
        now += 0.01
        if i % 5 == 4:
            assert reg.judge(D, HTTP_503, now=now) == "page"  # one 503 among successes
            reg.record_failure(D, HTTP_503, now=now)
            first_failure = now
        else:
            reg.record_success(D, 0.01, now=now)
        if i % 5 == 1 and first_failure is not None:  # a retry of the last broken page
            assert reg.judge(D, HTTP_503, failed_before=first_failure, now=now) == "page"
            reg.record_failure(D, HTTP_503, now=now, failed_before=first_failure)
    state = reg.state(D, now)
    assert (state.health, state.circuit, state.consecutive_failures, state.limit) == (100.0, "closed", 0, None)
    assert state.rate == math.inf  # never slowed down


def test_a_503_window_is_the_domains_trouble_and_opens_the_circuit() -> None:
    reg = registry(circuit_jitter=0)
    for i in range(100):
        reg.record_success(D, 0.01, now=T0 + 0.01 * i)
    verdicts = []
    for i in range(8):  # the whole host answers 503: the requests in flight fail together
        now = T0 + 1 + 0.001 * i
        verdicts.append(reg.judge(D, HTTP_503, now=now))
        reg.record_failure(D, HTTP_503, now=now)
    assert verdicts[:5] == ["page"] * 5 and verdicts[5:] == ["domain"] * 3
    state = reg.state(D, T0 + 1.01)
    assert state.circuit == "open" and state.health == pytest.approx(80.0, abs=0.01)
    # A retry that fails while nothing has succeeded since is the domain's trouble too.
    assert reg.judge(D, HTTP_503, failed_before=T0 + 1, now=T0 + 5) == "domain"


def test_retries_of_broken_pages_after_one_domain_signal_do_not_keep_its_circuit_opening() -> None:
    """The crawl's tail: only broken pages' retries are left when one real domain signal comes.

    Each retry that failed before the signal is judged the domain's (it gets the domain's
    retry schedule) but is no new evidence: it neither renews the trouble nor costs health,
    so the circuit stays closed and the next round of retries is the pages' again.
    """
    reg = registry(circuit_jitter=0)
    now, broken = T0, []
    for i in range(200):  # every 5th page broken for good, among successes
        now += 0.01
        if i % 5 == 4:
            reg.record_failure(D, HTTP_503, now=now)
            broken.append(now)
        else:
            reg.record_success(D, 0.01, now=now)
    reg.record_failure(D, TIMEOUT, now=now + 0.01)  # one real domain signal
    health = reg.state(D, now + 0.01).health
    now += 0.5
    for failed in broken:  # all forty retries fail (nothing else left to fetch)
        now += 0.001
        assert reg.judge(D, HTTP_503, failed_before=failed, now=now) == "domain"
        reg.record_failure(D, HTTP_503, now=now, failed_before=failed)
    state = reg.state(D, now)
    assert (state.circuit, state.consecutive_failures) == ("closed", 1)
    assert state.health >= health  # (recovering with time, not paying per retry)
    assert reg.judge(D, HTTP_503, failed_before=now, now=now + 1) == "page"  # their next retry


def test_429_retry_after_and_connection_failures_are_always_domain_signals() -> None:
    reg = registry()
    for i in range(50):
        reg.record_success(D, 0.01, now=T0 + 0.01 * i)
    assert reg.judge(D, HTTP_429, now=T0 + 1) == "domain"
    assert reg.judge(D, HTTP_503, retry_after=5.0, now=T0 + 1) == "domain"
    assert reg.judge(D, TIMEOUT, now=T0 + 1) == "domain"
    assert reg.judge(D, REFUSED, now=T0 + 1) == "domain"
    assert reg.judge(D, HTTP_404, now=T0 + 1) is None
    # ... except a URL that keeps timing out while the rest of its domain answers
    assert reg.judge(D, TIMEOUT, failed_before=T0 + 0.2, now=T0 + 1) == "page"


def test_a_host_that_never_answered_is_given_up_within_seconds() -> None:
    reg = registry(circuit_jitter=0)  # unreachable_give_up: 5 s by default
    for i in range(3):  # refused three times: the circuit opens
        reg.record_failure(D, REFUSED, now=T0 + 0.01 * i)
    assert reg.state(D, T0 + 0.1).circuit == "open"
    assert not reg.given_up(D, T0 + 4.9)
    assert reg.given_up(D, T0 + 5.1)
    answered = registry(circuit_jitter=0)  # one that answered before keeps the give_up_after clock
    answered.record_failure(D, HTTP_404, now=T0 - 1)
    for i in range(3):
        answered.record_failure(D, REFUSED, now=T0 + 0.01 * i)
    assert answered.state(D, T0 + 0.1).circuit == "open"
    assert not answered.given_up(D, T0 + 60)


def test_crawl_delay_spaces_requests_and_caps_the_burst() -> None:
    reg = registry()
    reg.set_crawl_delay(D, 2.0)  # (read from the robots.txt request just sent: no token left)
    state = reg.state(D)
    assert (state.rate, state.burst, state.crawl_delay) == (0.5, 1, 2.0) and state.tokens < 0.01
    now = time.time() + 10
    assert reg.try_acquire(D, now)
    assert not reg.try_acquire(D, now + 1.9)
    assert reg.ready_at(D, now + 1.9) == pytest.approx(now + 2.0, abs=1e-3)
    assert reg.try_acquire(D, now + 2.0 + 1e-3)


def test_a_page_that_waited_for_robots_txt_owes_the_queue_a_crawl_delay() -> None:
    """The page already past the queue (waiting for robots.txt) is spaced by its download slot;
    the queue's next token comes a delay after that page, two after robots.txt."""
    reg = registry()
    reg.set_crawl_delay(D, 2.0, owed=1)
    start = time.time()
    assert reg.ready_at(D, start + 1.0) == pytest.approx(start + 4.0, abs=0.05)
    assert not reg.try_acquire(D, start + 3.9)
    assert reg.try_acquire(D, start + 4.05)


def test_after_a_hold_the_domain_resumes_at_its_learned_limit() -> None:
    reg = registry()
    for i in range(300):  # the site delivers 60 req/s, then says 429 + Retry-After 10
        reg.record_success(D, 0.01, now=T0 + i / 60)
    reg.record_failure(D, HTTP_429, now=T0 + 5, retry_after=10)
    limit = reg.state(D, T0 + 5).limit
    assert 55 <= limit <= 61
    after = T0 + 15
    sent = sum(reg.try_acquire(D, after) for _ in range(20))
    assert sent <= limit * 0.25  # a quarter second's worth, not everything queued
    assert reg.state(D, after).rate == pytest.approx(0.9 * limit)


def test_time_held_or_open_is_counted() -> None:
    reg = registry(circuit_failures=1, circuit_cooldown=4, circuit_jitter=0)
    reg.record_failure(D, HTTP_429, now=T0, retry_after=5)  # held 5 s (a 429 opens no circuit)
    assert reg.state(D, T0 + 2).blocked_seconds == pytest.approx(2)
    assert reg.state(D, T0 + 30).blocked_seconds == pytest.approx(5)
    reg.record_failure(D, REFUSED, now=T0 + 30)  # the circuit opens for 4 s
    assert reg.state(D, T0 + 60).blocked_seconds == pytest.approx(5 + 4)
    reg.try_acquire(D, T0 + 60)
    reg.record_failure(D, REFUSED, now=T0 + 60)  # the half-open probe fails: open again, twice as long
    assert reg.state(D, T0 + 90).blocked_seconds == pytest.approx(5 + 4 + 8)


def test_circuit_time_and_retry_after_holds_are_counted_apart() -> None:
    """The politeness report says how long a domain was held for Retry-After and how long its
    circuit was open: the registry keeps the two apart (blocked_seconds is both)."""
    reg, t = HealthRegistry(), 1000.0
    reg.record_success(D, 0.01, now=t)
    reg.record_failure(D, HTTP_429, now=t + 1, retry_after=2.0)
    state = reg.state(D, t + 10)
    assert (state.retry_after_holds, state.circuit_seconds) == (1, 0.0)
    assert state.blocked_seconds == pytest.approx(2.0)
    now = t + 10
    for _ in range(20):  # refused connections until the circuit opens (bounded)
        now += 0.01
        reg.record_failure(D, REFUSED, now=now)
        if reg.state(D, now).circuit == "open":
            break
    opened, reopens = now, reg.blocked_until(D, now)
    assert reopens > opened
    state = reg.state(D, reopens + 5)
    assert state.circuit_seconds == pytest.approx(reopens - opened)
    assert state.blocked_seconds == pytest.approx(2.0 + reopens - opened)
    assert state.retry_after_holds == 1  # (a refused connection carries no Retry-After)
