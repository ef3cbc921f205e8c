"""Classified, delayed, budgeted retries.

``ClassifiedRetryMiddleware`` (downloader) replaces Scrapy's RetryMiddleware;
``ParseRetryMiddleware`` (spider) retries pages whose callback failed to
parse. Both wait in the scheduler (``meta["openclaw_not_before"]``), never in
a middleware, and give up into exactly one dead letter.
"""

from scrapy_openclaw.retry.backoff import (
    Backoff,
    DecorrelatedJitter,
    EqualJitter,
    FullJitter,
    NoJitter,
    exponential,
    for_policy,
    make_backoff,
)
from scrapy_openclaw.retry.budget import RetryBudget, RetryBudgets, SlidingCount
from scrapy_openclaw.retry.middleware import (
    ClassifiedRetryMiddleware,
    get_classified_retry_request,
    send_dead_letter,
)
from scrapy_openclaw.retry.parse import ParseRetryMiddleware

__all__ = [
    "Backoff",
    "ClassifiedRetryMiddleware",
    "DecorrelatedJitter",
    "EqualJitter",
    "FullJitter",
    "NoJitter",
    "ParseRetryMiddleware",
    "RetryBudget",
    "RetryBudgets",
    "SlidingCount",
    "exponential",
    "for_policy",
    "get_classified_retry_request",
    "make_backoff",
    "send_dead_letter",
]
