"""JOBDIR persistence: pending requests written as JSON at close and read back on resume.

The disk queue accepts only requests that can be stored as data (``push``
raises ``ValueError`` otherwise, so Scrapy's scheduler keeps them in memory),
and refuses, with a clear message, a JOBDIR written by Scrapy's pickle queues.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy_openclaw.pqueues import queuefile
from scrapy_openclaw.serialization import SerializationError, request_from_data, request_to_data

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from scrapy import Request
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)


def check_storable(request: Request, crawler: Crawler) -> None:
    """Raise :class:`SerializationError` (a ValueError) for a request the JOBDIR file cannot hold.

    Scrapy's scheduler then keeps it in its memory queue, as for a request
    its own disk queues cannot pickle: crawled in this run, but lost if the
    crawl is paused. Scrapy says so only with ``SCHEDULER_DEBUG``; we say it
    always, with the URL and the key.
    """
    try:
        request_to_data(request, spider=crawler.spider, compact=True)
    except SerializationError as exc:
        logger.error(
            "%(request)s cannot be stored in the JOBDIR queue; Scrapy keeps it in memory, so it is "
            "lost if this crawl is paused: %(error)s",
            {"request": request, "error": exc},
            extra={"spider": crawler.spider},
        )
        crawler.stats.inc_value("openclaw/unstorable/jobdir")
        raise


def persist(key: str, pending: Iterable[Request], crawler: Crawler) -> dict[str, Any]:
    """Write *pending* as JSON under *key*; the state Scrapy's scheduler keeps in ``active.json``."""
    spider, stats = crawler.spider, crawler.stats
    records, lost = [], 0
    for request in pending:
        try:
            records.append(request_to_data(request, spider=spider, compact=True))
        except SerializationError as exc:
            lost += 1
            logger.error(
                "Cannot persist %(request)s: %(error)s",
                {"request": request, "error": exc},
                extra={"spider": spider},
            )
    state = queuefile.write(key, records)
    stats.set_value("openclaw/queue/persisted", len(records))
    if lost:
        stats.set_value("openclaw/queue/persist_failed", lost)
    return state


def restore(key: str, state: Any, crawler: Crawler, *, push: Callable[[Request], None], reader: str) -> None:
    """Hand every request stored under *key* to *push*; *reader* names the queue class, for the
    message that refuses a JOBDIR written by another one."""
    if not queuefile.is_state(state):
        raise ValueError(
            f"JOBDIR queue {key} was written by {_writer_of(state)}, which {reader} "
            "cannot resume (Scrapy's disk queues are pickle, which this add-on never loads). "
            f"Resume it with SCHEDULER_PRIORITY_QUEUE = {_writer_of(state)!r}, or start a new "
            f"JOBDIR to use {reader}. (State: {state!r:.120})"
        )
    stats = crawler.stats
    try:
        records = queuefile.read(key, state)
    except (OSError, ValueError) as exc:
        logger.error(
            "Cannot resume the %(count)s queued requests: %(error)s",
            {"count": state.get("count"), "error": exc},
        )
        stats.inc_value("openclaw/queue/restore_failed")
        return
    restored = 0
    for n, record in enumerate(records):
        try:
            request = request_from_data(record, spider=crawler.spider)
        except (SerializationError, AttributeError, TypeError) as exc:
            logger.error("Queued request #%(n)d skipped on resume: %(error)s", {"n": n, "error": exc})
            stats.inc_value("openclaw/queue/restore_failed")
            continue
        push(request)
        restored += 1
    stats.set_value("openclaw/queue/restored", restored)


def _writer_of(state: Any) -> str:
    """The Scrapy priority queue class whose ``close()`` returns a state shaped like *state*."""
    if isinstance(state, list):
        return "scrapy.pqueues.ScrapyPriorityQueue"
    if isinstance(state, dict) and all(isinstance(v, list) for v in state.values()):
        return "scrapy.pqueues.DownloaderAwarePriorityQueue"
    return "another SCHEDULER_PRIORITY_QUEUE"
