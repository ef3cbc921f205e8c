"""Per-domain retry budgets, so a dying site does not get a retry storm.

Per-request attempt limits do not stop amplification: if every request to a site
fails, each is still retried. A retry budget (Finagle's ``RetryBudget``, Envoy's
``retry_budget``, gRPC retry throttling) caps retries at a share of the domain's
recent requests: ``retries < max(min_retries, ratio × requests)`` over ``window``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from scrapy import signals

from scrapy_openclaw.runtime import shared
from scrapy_openclaw.scrapy_internals import slot_key

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler

    from scrapy_openclaw.policy import RetryPolicy

_BUCKETS = 20


class SlidingCount:
    """Events in the last ``window`` seconds, in ``_BUCKETS`` time buckets.

    Buckets of 1/20 of the window keep the memory bounded however busy the domain is;
    time is passed in, so tests need no clock.
    """

    def __init__(self, window: float):
        if window <= 0:
            raise ValueError(f"window must be > 0, got {window}")
        self.window = window
        self._width = window / _BUCKETS
        self._buckets: deque[list[float]] = deque()  # [bucket start, count]
        self._total = 0.0

    def add(self, now: float, n: float = 1.0) -> None:
        self._expire(now)
        start = now - (now % self._width)
        if self._buckets and self._buckets[-1][0] >= start:
            self._buckets[-1][1] += n
        else:
            self._buckets.append([start, n])
        self._total += n

    def count(self, now: float) -> float:
        self._expire(now)
        return self._total

    def _expire(self, now: float) -> None:
        horizon = now - self.window
        while self._buckets and self._buckets[0][0] + self._width <= horizon:
            self._total -= self._buckets.popleft()[1]
        if not self._buckets:
            self._total = 0.0  # no float drift across long runs


class RetryBudget:
    """One domain's budget."""

    def __init__(self, ratio: float, min_retries: int, window: float):
        if not 0.0 <= ratio <= 1.0:
            raise ValueError(f"budget ratio must be within [0, 1], got {ratio}")
        if min_retries < 0:
            raise ValueError(f"budget min_retries must be >= 0, got {min_retries}")
        self.ratio = ratio
        self.min_retries = min_retries
        self.requests = SlidingCount(window)
        self.retries = SlidingCount(window)

    def record_request(self, now: float) -> None:
        self.requests.add(now)

    def allowed(self, now: float) -> float:
        """How many retries the current window allows."""
        return max(float(self.min_retries), self.ratio * self.requests.count(now))

    def can_retry(self, now: float) -> bool:
        return self.retries.count(now) < self.allowed(now)

    def try_spend(self, now: float) -> bool:
        """Take one retry from the budget; False (nothing taken) when spent."""
        if not self.can_retry(now):
            return False
        self.retries.add(now)
        return True


class RetryBudgets:
    """The per-domain budgets of one crawl, built from each domain's retry policy."""

    def __init__(self, policy_for: Callable[[str], RetryPolicy], clock: Callable[[], float] = time.time):
        self._policy_for = policy_for
        self._clock = clock
        self._budgets: dict[str, RetryBudget] = {}
        self._crawler: Crawler | None = None  # for the slot key of requests seen by the signal

    @classmethod
    def for_crawler(cls, crawler: Crawler) -> RetryBudgets:
        """The crawl's one instance; counts every request that reaches the downloader."""

        def build() -> RetryBudgets:
            from scrapy_openclaw.policy import PolicySet

            policies = PolicySet.for_crawler(crawler)
            budgets = cls(lambda domain: policies.for_domain(domain).retry)
            budgets._crawler = crawler
            crawler.signals.connect(budgets._request_reached, signal=signals.request_reached_downloader)
            return budgets

        return shared(crawler, "retry_budgets", build)

    def budget(self, domain: str) -> RetryBudget:
        budget = self._budgets.get(domain)
        if budget is None:
            policy = self._policy_for(domain)
            budget = RetryBudget(policy.budget_ratio, policy.budget_min_retries, policy.budget_window)
            self._budgets[domain] = budget
        return budget

    def record_request(self, domain: str, now: float | None = None) -> None:
        self.budget(domain).record_request(self._clock() if now is None else now)

    def try_spend(self, domain: str, now: float | None = None) -> bool:
        return self.budget(domain).try_spend(self._clock() if now is None else now)

    def _request_reached(self, request: Request, spider: object = None) -> None:
        self.record_request(slot_key(self._crawler, request))
