"""Replaying dead letters: a crawl of the spider that starts from them.

``scrapy openclaw-dlq replay SPIDER`` registers a :class:`ReplayPlan` for the
crawler (through :mod:`scrapy_openclaw.runtime`) and enables
:class:`ReplayStartMiddleware`, which replaces the spider's own start
requests with the dead letters' requests. Links the callbacks follow are
crawled as usual, so a recovered page's subtree is scraped too. A record
whose request cannot be rebuilt, or is refused as stored data (scheme,
callback, meta: see :func:`~scrapy_openclaw.serialization.request_from_data`),
is skipped, logged and counted (``openclaw/dlq/replay_skipped``); the others
are still replayed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scrapy.exceptions import NotConfigured

from scrapy_openclaw import meta as M
from scrapy_openclaw.runtime import peek
from scrapy_openclaw.serialization import SerializationError, request_from_data

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler

    from scrapy_openclaw.deadletter import DeadLetter
    from scrapy_openclaw.dlq.stores import DeadLetterStore

logger = logging.getLogger(__name__)

PLAN_KEY = "openclaw_dlq_replay"

#: Meta keys of the failed attempt that must not carry over: a replay starts
#: with a fresh retry budget and no expired deadline or backoff time.
_RESET_META = (M.RETRY_STATE, M.NOT_BEFORE, M.DEADLINE, "retry_times", "download_timeout")


def replay_request(record: DeadLetter, spider: Spider | None = None) -> Request:
    """The request to send again for *record*; ``SerializationError`` if it has none."""
    if not record.request:
        raise SerializationError(f"dead letter {record.id} ({record.error_class}) holds no request")
    request = request_from_data(record.request, spider=spider)
    meta = {k: v for k, v in request.meta.items() if k not in _RESET_META}
    meta[M.REPLAY_OF] = record.id
    return request.replace(meta=meta, dont_filter=True)


@dataclass
class ReplayPlan:
    """What to replay and where to mark it; ``injected`` is filled by the middleware."""

    store: DeadLetterStore
    records: list[DeadLetter]
    injected: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # id -> why


class ReplayStartMiddleware:
    """Spider middleware: the crawl starts from the plan's dead letters only."""

    def __init__(self, crawler: Crawler, plan: ReplayPlan):
        self.crawler = crawler
        self.plan = plan

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> ReplayStartMiddleware:
        plan = peek(crawler, PLAN_KEY)
        if plan is None:
            raise NotConfigured
        return cls(crawler, plan)

    async def process_start(self, start: AsyncIterator[Any]) -> AsyncIterator[Any]:
        # The spider's own start is deliberately not iterated.
        spider = self.crawler.spider
        requests = []
        for record in self.plan.records:
            try:
                requests.append(replay_request(record, spider))
            except SerializationError as exc:
                self.plan.skipped[record.id] = str(exc)
                self.crawler.stats.inc_value("openclaw/dlq/replay_skipped")
                logger.warning(
                    "Not replaying dead letter %(id)s: %(error)s",
                    {"id": record.id, "error": exc},
                    extra={"spider": spider},
                )
                continue
            self.plan.injected.append(record.id)
        # Marked once the crawl is under way, before anything is sent, so that
        # two replays never send the same dead letter twice.
        self.plan.store.mark_replayed(self.plan.injected)
        self.crawler.stats.set_value("openclaw/dlq/replayed", len(self.plan.injected))
        logger.info(
            "Replaying %(n)d dead letter(s) from %(uri)s (%(skipped)d skipped)",
            {"n": len(requests), "uri": self.plan.store.uri, "skipped": len(self.plan.skipped)},
            extra={"spider": spider},
        )
        for request in requests:
            yield request
