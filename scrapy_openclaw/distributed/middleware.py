"""Acknowledging leases when a request is really finished.

A leased request is acknowledged at :class:`~scrapy_openclaw.lifecycle.RequestLifecycle`'s
``on_finished``, which the engine reports only after every request the callback or
errback yielded was pushed and every item left the pipelines: the end of the
callback's generator is too early, and a worker killed there would lose those links.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError
from scrapy import signals

from scrapy_openclaw.distributed.queue import active_queue
from scrapy_openclaw.lifecycle import RequestLifecycle
from scrapy_openclaw.meta import LEASE

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response


class LeaseAckDownloaderMiddleware:
    """Acknowledges (or hands back) each leased request once the engine has finished it.

    A downloader middleware (closest to the engine) because it must see where
    the download ends: before that, a request carrying the lease is a retry
    or redirect copy; after it, the callback or errback is producing new work.

    A retry or redirect copy carries the lease in meta, and the queue's push script
    acknowledges the original atomically with the copy's push. A request the callback
    or errback yields with the page's meta but another URL is new work: its copy of the
    lease is removed when it is scheduled, so it cannot acknowledge the page early. An
    item that failed in a pipeline, or a download that failed because our own Redis did,
    hands the lease back instead (fetched again, at most
    ``OPENCLAW_DISTRIBUTED_MAX_RELEASES`` times). Anything not acknowledged (the worker
    died) is re-queued when its lease expires.
    """

    def __init__(self, crawler: Crawler):
        self.crawler = crawler
        self._leases: dict[Request, str] = {}  # leased requests in flight -> lease id
        self._owners: dict[str, Request] = {}  # lease id -> the leased request
        self._scraping: set[str] = set()  # downloaded: the callback or errback runs
        self._give_back: set[str] = set()  # leases to release, not acknowledge
        RequestLifecycle.for_crawler(crawler).listen(
            "OPENCLAW_DISTRIBUTED", on_started=self._started, on_finished=self._finished
        )
        crawler.signals.connect(self._scheduled, signal=signals.request_scheduled)
        crawler.signals.connect(self._item_error, signal=signals.item_error)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> LeaseAckDownloaderMiddleware:
        return cls(crawler)

    # --- lifecycle ------------------------------------------------------------

    def _started(self, request: Request) -> None:
        lease = request.meta.get(LEASE)
        # a copy fetched with engine.download_async() while the page is in flight is not the lease holder
        if lease is not None and lease not in self._owners:
            self._leases[request] = lease
            self._owners[lease] = request

    def _finished(self, request: Request) -> None:
        lease = self._leases.pop(request, None)
        if lease is None:
            return
        del self._owners[lease]
        self._scraping.discard(lease)
        queue = active_queue(self.crawler)
        if lease in self._give_back:
            self._give_back.discard(lease)
            if queue is not None:
                queue.release(lease)  # fetched again rather than an item lost
        elif queue is not None:
            queue.ack(lease)  # a no-op if a retry copy's push acknowledged it already

    # --- where the download ends ------------------------------------------------

    def process_response(self, request: Request, response: Response) -> Response:
        self._downloaded(request)
        return response

    def process_exception(self, request: Request, exception: Exception) -> None:
        # nothing turned the failure into a retry: the errback (or the log) gets it
        lease = self._downloaded(request)
        if lease is not None and isinstance(exception, RedisError):  # our own Redis failed, not the site
            self._give_back.add(lease)

    def _downloaded(self, request: Request) -> str | None:
        lease = request.meta.get(LEASE)
        if lease is None or lease not in self._owners:
            return None
        self._scraping.add(lease)
        return lease

    # --- signals ------------------------------------------------------------------

    def _scheduled(self, request: Request, **kwargs: Any) -> None:
        lease = request.meta.get(LEASE)
        if lease is None or lease not in self._scraping:
            return
        if request.url != self._owners[lease].url:
            request.meta.pop(LEASE, None)  # a child carrying the page's meta is new work

    def _item_error(self, response: Any = None, **kwargs: Any) -> None:
        # response: the Response of a callback's item, the Failure of an errback's
        request = getattr(response, "request", None)
        lease = self._leases.get(request) if request is not None else None
        if lease is None and request is not None:
            lease = request.meta.get(LEASE)
        if lease is not None and lease in self._owners:
            self._give_back.add(lease)
