"""BanDetectionMiddleware: a ban or challenge page never reaches a callback as data.

It sits on the downloader's side of the health middleware (order 580), so it sees
each response first. An answer the error taxonomy classifies as ``blocked`` is a
domain signal: the domain is held, and the request retried after the hold (past
the HTTP cache) or, out of attempts, a dead letter (docs/health.md, "Ban detection").
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scrapy.exceptions import IgnoreRequest, NotConfigured

from scrapy_openclaw import signals as openclaw_signals
from scrapy_openclaw.errors import ErrorTaxonomy
from scrapy_openclaw.policy import PolicySet
from scrapy_openclaw.retry.middleware import (
    get_classified_retry_request,
    retry_enabled,
    send_dead_letter,
)
from scrapy_openclaw.retry_after import parse_retry_after
from scrapy_openclaw.runtime import peek
from scrapy_openclaw.scrapy_internals import slot_key
from scrapy_openclaw.settings import OpenClawSettings

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response

    from scrapy_openclaw.errors import Classification

logger = logging.getLogger(__name__)

STATS_PREFIX = "openclaw/ban"


class BanDetectionMiddleware:
    """Downloader middleware: recognise ban pages before the callback, hold the domain, retry later."""

    def __init__(self, crawler: Crawler):
        self.crawler = crawler
        self.stats = crawler.stats
        self.taxonomy = ErrorTaxonomy.for_crawler(crawler)
        self.policies = PolicySet.for_crawler(crawler)
        self.retry = retry_enabled(crawler)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> BanDetectionMiddleware:
        if not OpenClawSettings.for_crawler(crawler).ban_enabled:
            raise NotConfigured
        return cls(crawler)

    def _count(self, classification: Classification, domain: str, *, cached: bool) -> None:
        self.stats.inc_value(f"{STATS_PREFIX}/blocked")
        if cached:
            self.stats.inc_value(f"{STATS_PREFIX}/cached")
        self.stats.inc_value(f"{STATS_PREFIX}/reason/{classification.reason}")
        self.stats.inc_value(f"{STATS_PREFIX}/domain/{domain}")

    def _retry_or_dead_letter(
        self, request: Request, response: Response, classification: Classification, spider: Spider
    ) -> Request | None:
        """The retry (fetched anew: HttpCacheMiddleware stored the ban page, the retry must not be
        stored either), or None: given up, or ``dont_retry`` (then the dead letter is sent here)."""
        if not self.retry or request.meta.get("dont_retry", False):
            send_dead_letter(request, classification, spider=spider)
            return None
        retry = get_classified_retry_request(
            request, classification=classification, spider=spider, response=response, from_cache=False
        )
        if retry is not None:
            retry.meta["dont_cache"] = True
        return retry

    def process_response(self, request: Request, response: Response) -> Request | Response:
        domain = slot_key(self.crawler, request)
        policy = self.policies.for_domain(domain).health
        classification = self.taxonomy.classify_ban(
            response.status,
            response.headers,
            response.body,
            markers=policy.ban_markers,
            builtin=policy.ban_builtin_markers,
        )
        if classification is None:
            return response
        # A ban page from Scrapy's HTTP cache is an old answer: no news of the domain (no hold, no
        # penalty), and its retry must not be served from the cache again.
        cached = "cached" in response.flags
        retry_after = parse_retry_after(
            response.headers.get(b"Retry-After"), cap=policy.retry_after_cap, domain=domain, response=response
        )
        hold = 0.0 if cached else max(policy.blocked_hold, retry_after or 0.0)
        self._count(classification, domain, cached=cached)
        snapshots = peek(self.crawler, "error_snapshots")
        if snapshots is not None:
            snapshots.capture(classification, request, response=response)
        health = peek(self.crawler, "health_middleware")
        if health is not None and not cached:
            health.record_blocked(request, classification, hold)
        spider = self.crawler.spider
        assert spider is not None
        retry = self._retry_or_dead_letter(request, response, classification, spider)
        logger.warning(
            "Ban page from %(domain)s (%(reason)s, status %(status)d%(cached)s) for %(request)s: holding the "
            "domain %(hold).0fs; %(next)s",
            {
                "domain": domain,
                "reason": classification.reason,
                "status": response.status,
                "cached": ", from the HTTP cache" if cached else "",
                "request": request,
                "hold": hold,
                "next": "retrying later" if retry is not None else "giving up (dead letter)",
            },
            extra={"spider": spider},
        )
        self.crawler.signals.send_catch_log(
            signal=openclaw_signals.blocked,
            request=request,
            response=response,
            domain=domain,
            classification=classification,
            retry_request=retry,
            spider=spider,
        )
        if retry is not None:
            return retry
        self.stats.inc_value(f"{STATS_PREFIX}/gave_up")
        raise IgnoreRequest(f"ban page from {domain} ({classification.reason}): given up")
