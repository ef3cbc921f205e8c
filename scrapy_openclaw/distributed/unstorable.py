"""A request that cannot be stored is refused where it is scheduled, loudly.

A queue that keeps requests as data (Redis) cannot hold every Python value; a
request it cannot store must not vanish after a quiet log line, nor be marked
seen (a later identical request would then be filtered too).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scrapy_openclaw.settings import crawl_id

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler

    from scrapy_openclaw.serialization import SerializationError

logger = logging.getLogger(__name__)

STATS = "openclaw/unstorable"


def refuse_unstorable(crawler: Crawler, request: Request, error: SerializationError, *, store: str) -> None:
    """ERROR (URL and key path), stat ``openclaw/unstorable/<store>`` and a dead letter.

    The caller's ``enqueue_request`` returns False, so the engine sends
    ``request_dropped`` (as for a duplicate). The dead letter holds no request
    (it could not be stored); it names the URL and the key.
    """
    from scrapy_openclaw import signals as openclaw_signals
    from scrapy_openclaw.deadletter import for_request

    spider = crawler.spider
    logger.error(
        "Refused %(request)s: it cannot be stored in the %(store)s queue, so it is not scheduled "
        "(and not marked as seen): %(error)s",
        {"request": request, "store": store, "error": error},
        extra={"spider": spider},
    )
    crawler.stats.inc_value(f"{STATS}/{store}")
    assert spider is not None  # (requests are only scheduled once the crawl has its spider)
    letter = for_request(
        request,
        spider=spider,
        crawl_id=crawl_id(crawler),
        error_class="unstorable",
        reason="unstorable",
        exception=error,
    )
    crawler.signals.send_catch_log(signal=openclaw_signals.dead_letter, dead_letter=letter, spider=spider)
