"""ClassifiedRetryMiddleware: retry by error class, later, never by waiting.

Scrapy's RetryMiddleware retries at once, the same way for every failure, and
ignores Retry-After. This one returns a copy of the request with a not-before time
from the domain's policy for the failure's class, which waits in the scheduler. The
work is :func:`get_classified_retry_request`'s (re-exported from :mod:`.attempts`).
Scrapy's own requests (robots.txt, ``engine.download``) never pass the scheduler: their
retry waits here (:meth:`ClassifiedRetryMiddleware._internal_retry`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, TypeVar

from scrapy.exceptions import NotConfigured

from scrapy_openclaw.deadletter import is_internal
from scrapy_openclaw.delay import DelayedRequests, not_before, sleep
from scrapy_openclaw.errors import ErrorClass
from scrapy_openclaw.policy import PolicySet
from scrapy_openclaw.retry.attempts import (
    DELAY_BUCKETS,
    PAGE,
    PAGE_SCOPED,
    STATS_PREFIX,
    get_classified_retry_request,
    on_page_schedule,
    retries_left,
    retry_cap,
    retry_enabled,
    schedule_name,
    send_dead_letter,
    taxonomy_for,
)
from scrapy_openclaw.retry.budget import RetryBudgets
from scrapy_openclaw.retry.compat import ScrapyRetrySettings
from scrapy_openclaw.scrapy_internals import is_robots_request
from scrapy_openclaw.settings import OpenClawSettings

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response

    from scrapy_openclaw.errors import Classification

_Answer = TypeVar("_Answer")
#: seconds between two looks at whether the crawl is stopping, while a retry of Scrapy's own request waits
_STOP_CHECK = 0.5

__all__ = [
    "DELAY_BUCKETS",
    "PAGE",
    "PAGE_SCOPED",
    "STATS_PREFIX",
    "ClassifiedRetryMiddleware",
    "get_classified_retry_request",
    "on_page_schedule",
    "retries_left",
    "retry_cap",
    "retry_enabled",
    "schedule_name",
    "send_dead_letter",
    "taxonomy_for",
]


def spider_handles_status(request: Request, response: Response, spider: Spider) -> bool:
    """Whether the spider asked for this status (then a 4xx is not a failure to record).

    Asked as HttpErrorMiddleware asks, with ``in`` only: ``scrapy fetch``, ``shell`` and
    the media pipelines put a ``SequenceExclude`` in ``meta["handle_httpstatus_list"]``.
    """
    meta = request.meta
    if meta.get("handle_httpstatus_all"):
        return True
    if "handle_httpstatus_list" in meta:
        return response.status in (meta["handle_httpstatus_list"] or ())
    settings = spider.crawler.settings
    if settings.getbool("HTTPERROR_ALLOW_ALL"):
        return True
    allowed = getattr(spider, "handle_httpstatus_list", None)
    if allowed is not None:
        return response.status in allowed
    return str(response.status) in {str(code) for code in settings.getlist("HTTPERROR_ALLOWED_CODES")}


class ClassifiedRetryMiddleware:
    """Downloader middleware: classified, delayed, budgeted retries (replaces RetryMiddleware)."""

    def __init__(self, crawler: Crawler):
        self.crawler = crawler
        self.taxonomy = taxonomy_for(crawler)
        self.dlq_permanent = OpenClawSettings.for_crawler(crawler).dlq_permanent
        PolicySet.for_crawler(crawler)  # validate policies at start, not at the first failure
        ScrapyRetrySettings.for_crawler(crawler)  # and RETRY_GIVE_UP_LOG_LEVEL
        RetryBudgets.for_crawler(crawler)  # starts counting requests
        # Without the deadline queue, this keeps delayed retries out of the scheduler until due.
        self.delayed = DelayedRequests.for_crawler(crawler)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> ClassifiedRetryMiddleware:
        if not retry_enabled(crawler):
            raise NotConfigured
        return cls(crawler)

    def process_response(
        self, request: Request, response: Response, spider: Spider | None = None
    ) -> Request | Response | Awaitable[Request | Response]:
        if request.meta.get("dont_retry", False):
            return response
        classification = self.taxonomy.classify_status(response.status)
        if classification is None:
            return response
        spider = self.crawler.spider
        assert spider is not None
        if classification.error_class is ErrorClass.PROTOCOL_PERMANENT:
            if self.dlq_permanent and not spider_handles_status(request, response, spider):
                if not is_internal(request):  # (robots.txt's 404 is no dead letter: never stored)
                    self.crawler.stats.inc_value(f"{STATS_PREFIX}/permanent_dead_letters")
                send_dead_letter(request, classification, spider=spider)
            return response
        if not is_internal(request):
            retry = get_classified_retry_request(
                request, classification=classification, spider=spider, response=response
            )
            return retry if retry is not None else response
        return self._internal_retry(request, classification, response, response=response)

    def process_exception(
        self, request: Request, exception: Exception, spider: Spider | None = None
    ) -> Request | Awaitable[Request | None] | None:
        if request.meta.get("dont_retry", False):
            return None
        classification = self.taxonomy.classify_download_error(exception)
        if classification is None:
            return None
        spider = self.crawler.spider
        assert spider is not None
        if not is_internal(request):
            return get_classified_retry_request(
                request, classification=classification, spider=spider, exception=exception
            )
        return self._internal_retry(request, classification, None, exception=exception)

    def _internal_retry(
        self,
        request: Request,
        classification: Classification,
        given_up: _Answer,
        *,
        response: Response | None = None,
        exception: Exception | None = None,
    ) -> Awaitable[Request | _Answer] | _Answer:
        """Scrapy's own requests (robots.txt, media and other ``engine.download`` fetches) never pass
        the scheduler, and the engine sends a retry copy at once: so its wait is waited here (it holds
        no slot the spider's pages could use: a domain's pages wait for its robots.txt anyway).
        robots.txt gets Scrapy's ``RETRY_TIMES`` (2 by default), not a page's retries. Once the
        crawl is stopping such a request is not asked again, and a wait under way ends: a Ctrl-C
        is not kept waiting by a robots.txt under a long Retry-After. *given_up*: what to return
        then (the response, or None for an exception)."""
        if not self.crawler.crawling:
            return given_up
        spider = self.crawler.spider
        assert spider is not None
        cap = ScrapyRetrySettings.for_crawler(self.crawler).robots_retry_times if is_robots_request(request) else None
        retry = get_classified_retry_request(
            request,
            classification=classification,
            spider=spider,
            response=response,
            exception=exception,
            max_retry_times=cap,
        )
        if retry is None:
            return given_up
        return self._when_due(retry, given_up)

    async def _when_due(self, retry: Request, given_up: _Answer) -> Request | _Answer:
        """*retry* once its not-before time has come (*given_up* if the crawl stops first)."""
        due = not_before(retry, self.crawler.stats)
        while self.crawler.crawling:
            left = due - time.time()
            if left <= 0:
                return retry
            await sleep(min(left, _STOP_CHECK))
        return given_up
