"""Backoff strategies and retry budgets: pure code, pinned random source, no time passing."""

from __future__ import annotations

import random

import pytest
from scrapy import Request
from scrapy.utils.test import get_crawler

from scrapy_openclaw import meta as M
from scrapy_openclaw.errors import Classification, ErrorClass
from scrapy_openclaw.policy import RetryClassPolicy
from scrapy_openclaw.retry import (
    DecorrelatedJitter,
    EqualJitter,
    FullJitter,
    NoJitter,
    RetryBudget,
    RetryBudgets,
    SlidingCount,
    exponential,
    for_policy,
    get_classified_retry_request,
    make_backoff,
)


def lowest(a: float, b: float) -> float:
    return a


def highest(a: float, b: float) -> float:
    return b


def test_exponential_grows_and_caps():
    assert [exponential(1, 60, n) for n in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert exponential(0.5, 10, 1000) == 10  # no overflow
    assert exponential(0, 10, 3) == 0
    with pytest.raises(ValueError):
        exponential(1, 10, -1)


def test_full_jitter_is_uniform_below_the_exponential():
    assert FullJitter(1, 60, highest)(3) == 8
    assert FullJitter(1, 60, lowest)(3) == 0
    rng = random.Random(7)
    delays = [FullJitter(1, 60, rng.uniform)(4) for _ in range(2000)]
    assert all(0 <= d <= 16 for d in delays)
    assert 6 < sum(delays) / len(delays) < 10  # mean of U(0, 16) is 8


def test_equal_jitter_keeps_half():
    assert EqualJitter(1, 60, lowest)(3) == 4
    assert EqualJitter(1, 60, highest)(3) == 8
    assert EqualJitter(1, 5, highest)(10) == 5


def test_decorrelated_grows_from_previous_delay():
    strategy = DecorrelatedJitter(1, 30, highest)
    assert strategy(0, None) == 3  # U(base, 3·base)
    assert strategy(5, 4.0) == 12
    assert strategy(5, 20.0) == 30  # capped
    assert DecorrelatedJitter(1, 30, lowest)(5, 20.0) == 1  # never below base


def test_no_jitter_is_deterministic():
    assert [NoJitter(2, 20)(n) for n in range(5)] == [2, 4, 8, 16, 20]


def test_make_backoff_by_name_and_policy():
    assert isinstance(make_backoff("full", 1, 2), FullJitter)
    assert isinstance(make_backoff("decorrelated", 1, 2), DecorrelatedJitter)
    assert make_backoff("none", 1, 60)(2) == 4
    assert for_policy(RetryClassPolicy(base_delay=0.5, max_delay=3, jitter="equal"), uniform=highest)(4) == 3
    with pytest.raises(ValueError, match="unknown jitter mode 'sideways'"):
        make_backoff("sideways", 1, 2)
    with pytest.raises(ValueError, match="base and cap"):
        FullJitter(-1, 2)


def test_sliding_count_forgets_old_events():
    count = SlidingCount(10.0)
    for t in range(10):
        count.add(1000.0 + t)
    assert count.count(1009.5) == 10
    assert count.count(1015.2) == 5  # a bucket (0.5 s) still partly inside the window counts
    assert count.count(1015.6) == 4  # events at 1006..1009 remain
    assert count.count(1100.0) == 0
    with pytest.raises(ValueError):
        SlidingCount(0)


def test_budget_floor_then_ratio():
    budget = RetryBudget(ratio=0.2, min_retries=3, window=60.0)
    now = 5000.0
    assert [budget.try_spend(now) for _ in range(4)] == [True, True, True, False]
    for _ in range(50):
        budget.record_request(now)
    assert budget.allowed(now) == 10
    spent = sum(budget.try_spend(now) for _ in range(20))
    assert spent == 7  # 10 allowed, 3 already used
    assert budget.try_spend(now + 61) is True  # the window moved on


def test_budget_zero_ratio_zero_floor_never_retries():
    budget = RetryBudget(ratio=0.0, min_retries=0, window=1.0)
    budget.record_request(1.0)
    assert not budget.try_spend(1.0)


def test_budgets_use_each_domains_policy():
    from scrapy_openclaw.policy import PolicySet

    crawler = get_crawler(
        settings_dict={
            "OPENCLAW_POLICY": {"domains": {"tight.example": {"retry": {"budget_min_retries": 1, "budget_ratio": 0.0}}}}
        }
    )
    policies = PolicySet.for_crawler(crawler)
    budgets = RetryBudgets(lambda d: policies.for_domain(d).retry, clock=lambda: 100.0)
    assert budgets.try_spend("tight.example") and not budgets.try_spend("tight.example")
    assert all(budgets.try_spend("loose.example") for _ in range(10))


def _spider_crawler(settings=None):
    from scrapy import Spider

    crawler = get_crawler(Spider, settings_dict=settings or {})
    crawler.spider = crawler._create_spider("unit")
    return crawler


def test_helper_builds_a_delayed_copy_without_waiting():
    crawler = _spider_crawler({"RETRY_PRIORITY_ADJUST": -3})
    request = Request("http://127.0.0.2:1/page/1", priority=5)
    c = Classification(ErrorClass.NETWORK, "timeout")
    retry = get_classified_retry_request(request, classification=c, spider=crawler.spider, now=1000.0, uniform=highest)
    assert retry is not request and retry.dont_filter and retry.priority == 2
    assert retry.meta["retry_times"] == 1
    assert retry.meta[M.NOT_BEFORE] == 1001.0  # base 1 s, attempt 0, full jitter at its top
    state = retry.meta[M.RETRY_STATE]
    assert state["attempts"] == {"network": 1} and state["last"] == 1000.0
    again = get_classified_retry_request(retry, classification=c, spider=crawler.spider, now=1002.0, uniform=highest)
    assert again.meta[M.NOT_BEFORE] == 1004.0 and again.meta[M.RETRY_STATE]["first"] == state["first"]
    assert M.NOT_BEFORE not in request.meta  # the original is untouched
    assert crawler.stats.get_value("openclaw/retry/network/count") == 2
    assert crawler.stats.get_value("openclaw/retry/delay_seconds_total") == 3.0
    assert crawler.stats.get_value("openclaw/retry/delay_le/1") == 1
    assert crawler.stats.get_value("openclaw/retry/delay_le/2") == 2
    assert crawler.stats.get_value("openclaw/retry/delay_le/inf") == 2


def test_helper_gives_up_with_one_dead_letter():
    from scrapy_openclaw import signals as openclaw_signals

    crawler = _spider_crawler()
    letters = []

    def collect(dead_letter, spider):
        letters.append(dead_letter)

    crawler.signals.connect(collect, signal=openclaw_signals.dead_letter)
    c = Classification(ErrorClass.PROTOCOL_RETRYABLE, "http_503", 503)
    request = Request("http://127.0.0.2:1/x", meta={"max_retry_times": 1})
    retry = get_classified_retry_request(request, classification=c, spider=crawler.spider, now=10.0)
    assert retry is not None
    assert get_classified_retry_request(retry, classification=c, spider=crawler.spider, now=20.0) is None
    assert len(letters) == 1
    letter = letters[0]
    assert (letter.error_class, letter.reason, letter.status, letter.attempts) == (
        "protocol_retryable",
        "http_503",
        503,
        2,
    )
    assert letter.last_attempt_at == 20.0 and letter.request["url"] == "http://127.0.0.2:1/x"
    assert crawler.stats.get_value("openclaw/retry/protocol_retryable/max_reached") == 1


def test_helper_budget_refusal_is_a_retry_budget_dead_letter():
    from scrapy_openclaw import signals as openclaw_signals

    crawler = _spider_crawler(
        {"OPENCLAW_POLICY": {"defaults": {"retry": {"budget_min_retries": 0, "budget_ratio": 0}}}}
    )
    letters = []

    def collect(dead_letter, spider):
        letters.append(dead_letter)

    crawler.signals.connect(collect, signal=openclaw_signals.dead_letter)
    c = Classification(ErrorClass.NETWORK, "refused")
    assert get_classified_retry_request(Request("http://a.test/"), classification=c, spider=crawler.spider) is None
    assert [(x.error_class, x.reason) for x in letters] == [("retry_budget", "refused")]
    assert crawler.stats.get_value("openclaw/retry/budget_exhausted") == 1


def test_permanent_errors_are_never_retried_by_the_helper():
    crawler = _spider_crawler()
    c = Classification(ErrorClass.PROTOCOL_PERMANENT, "http_404", 404)
    assert get_classified_retry_request(Request("http://a.test/"), classification=c, spider=crawler.spider) is None


def test_default_policy_rides_out_a_3s_in_10s_503_window():
    """Equal jitter on protocol_retryable: whatever the random draws, the 4th attempt comes
    >= 3.5 s after the 1st (out of a 3 s window) and the 6 attempts span > one period."""
    from scrapy.settings import Settings

    from scrapy_openclaw.policy import PolicySet

    policy = PolicySet.from_settings(Settings()).for_domain("example.com").retry.protocol_retryable
    for pick in (lowest, highest):
        backoff = for_policy(policy, uniform=pick)
        waits = [backoff(n) for n in range(policy.max_attempts - 1)]
        assert sum(waits[:3]) >= 3.5
        assert sum(waits) >= 15.0
        assert max(waits) <= policy.max_delay


def test_retry_waits_until_its_domain_reopens():
    import time

    from scrapy_openclaw.health import HealthRegistry

    crawler = _spider_crawler({"DOWNLOADER_MIDDLEWARES": {"scrapy_openclaw.health.DomainHealthMiddleware": 560}})
    registry = HealthRegistry.for_crawler(crawler)  # as the health middleware creates it
    c = Classification(ErrorClass.PROTOCOL_RETRYABLE, "http_503", 503)
    now = time.time()
    registry.record_failure("127.0.0.2", c, now=now, retry_after=30.0)
    reopens = registry.blocked_until("127.0.0.2")
    assert reopens > now + 20  # held (a Retry-After: 30)
    request = Request("http://127.0.0.2:1/page/1")
    retry = get_classified_retry_request(request, classification=c, spider=crawler.spider, now=now, uniform=lowest)
    assert retry.meta[M.NOT_BEFORE] == reopens  # not handed out only to be deferred again
    assert retry.meta[M.RETRY_STATE]["attempts"] == {"protocol_retryable": 1}  # one failure, one attempt
    other = get_classified_retry_request(
        Request("http://127.0.0.3:1/"), classification=c, spider=crawler.spider, now=now, uniform=lowest
    )
    assert other.meta[M.NOT_BEFORE] == now + 0.5  # another domain: its own backoff only
