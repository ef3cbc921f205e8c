"""ParseRetryMiddleware: refetch a page whose callback failed to parse it.

A callback that raises one of ``OPENCLAW_PARSE_EXCEPTIONS`` often met a truncated,
soft-blocked or half-rendered page; fetching it again later usually works. This
spider middleware re-schedules the request within the domain's parse policy and
retry budget, and holds the callback's outputs so that a retry never doubles them.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy.exceptions import NotConfigured

from scrapy_openclaw.delay import DelayedRequests
from scrapy_openclaw.errors import Classification, ErrorClass
from scrapy_openclaw.policy import PolicySet
from scrapy_openclaw.retry.budget import RetryBudgets
from scrapy_openclaw.retry.middleware import (
    STATS_PREFIX,
    get_classified_retry_request,
    retries_left,
    retry_cap,
    retry_enabled,
    taxonomy_for,
)
from scrapy_openclaw.scrapy_internals import slot_key

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterable, Iterator

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response

logger = logging.getLogger(__name__)

_PARSE = Classification(ErrorClass.PARSE, "parse")
_SEEN = "_openclaw_parse_retry_seen"


class _Attempt:
    __slots__ = ("retried",)

    def __init__(self) -> None:
        self.retried = False


class ParseRetryMiddleware:
    """Spider middleware: classified retry of callbacks that raise parse errors.

    While a failure would still be retried, the callback's outputs are held until it
    ends: passed on in order on success, discarded on a retried failure (the retry
    yields them again). Holding is preferred over remembering which outputs were already
    passed: that needs items that compare equal across fetches, and a refetched page
    often differs (timestamps, ads, ordering).
    """

    def __init__(self, crawler: Crawler):
        self.crawler = crawler
        self.taxonomy = taxonomy_for(crawler)
        self.policies = PolicySet.for_crawler(crawler)
        RetryBudgets.for_crawler(crawler)
        DelayedRequests.for_crawler(crawler)
        # Responses whose outputs are being held, by id(): the callback is running.
        self._held: dict[int, _Attempt] = {}

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> ParseRetryMiddleware:
        if not retry_enabled(crawler):
            raise NotConfigured
        return cls(crawler)

    def _may_retry(self, request: Request | None) -> bool:
        if request is None or request.meta.get("dont_retry", False):
            return False
        policy = self.policies.for_domain(slot_key(self.crawler, request)).retry.parse
        return retries_left(request, _PARSE, policy, retry_cap(self.crawler, request, _PARSE))

    # Universal (a sync and an async hook, as Scrapy's own spider middlewares): a plain callback's
    # outputs stay a plain iterable, which Scrapy would otherwise convert to async for this hook.
    def process_spider_output(
        self, response: Response, result: Iterable[Any], spider: Spider | None = None
    ) -> Iterable[Any]:
        if not self._may_retry(response.request):
            return result
        return self._hold(response, result)

    async def process_spider_output_async(
        self, response: Response, result: AsyncIterator[Any], spider: Spider | None = None
    ) -> AsyncIterator[Any]:
        if not self._may_retry(response.request):
            async for output in result:
                yield output
            return
        attempt, held = self._start_holding(response), []
        try:
            async for output in result:
                held.append(output)
        except Exception:
            for output in self._release(response, attempt, held, failed=True):
                yield output
            raise
        for output in self._release(response, attempt, held):
            yield output

    def _hold(self, response: Response, result: Iterable[Any]) -> Iterator[Any]:
        attempt, held = self._start_holding(response), []
        try:
            for output in result:
                held.append(output)
        except Exception:
            yield from self._release(response, attempt, held, failed=True)
            raise
        yield from self._release(response, attempt, held)

    def _start_holding(self, response: Response) -> _Attempt:
        attempt = self._held[id(response)] = _Attempt()
        return attempt

    def _release(self, response: Response, attempt: _Attempt, held: list[Any], *, failed: bool = False) -> list[Any]:
        """What to pass on once the callback has ended: everything, unless it failed and was retried
        (the retry yields it all again). A failure not handled by anyone (a bug, or a retry refused)
        passes on what the callback produced, then the error goes on as usual."""
        self._held.pop(id(response), None)
        if attempt.retried and not failed:
            if held:
                self.crawler.stats.inc_value(f"{STATS_PREFIX}/parse/discarded_outputs", len(held))
            return []
        return held

    def process_spider_exception(
        self, response: Response, exception: Exception, spider: Spider | None = None
    ) -> Iterable[Any] | None:
        request = response.request
        if request is None or request.meta.get("dont_retry", False):
            return None
        # Older Scrapy (2.14) may pass one exception through this hook more
        # than once on its way down the chain; decide (and dead-letter) once.
        if getattr(exception, _SEEN, False):
            return None
        setattr(exception, _SEEN, True)
        classification = self.taxonomy.classify_callback_error(exception)
        if classification is None:
            return None
        spider = self.crawler.spider
        assert spider is not None
        retry = get_classified_retry_request(
            request,
            classification=classification,
            spider=spider,
            exception=exception,
            from_cache="cached" in response.flags,  # (the cache answers the retry with the same page)
        )
        if retry is None:
            return None
        attempt = self._held.get(id(response))
        if attempt is not None:
            attempt.retried = True
        return [retry]
