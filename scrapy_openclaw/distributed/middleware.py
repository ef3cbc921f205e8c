"""Acknowledging leases when a request is really finished.

A leased request is finished when its callback's output has been consumed
(child requests pushed to Redis) and the items it yielded have left the item
pipelines; when it became a dead letter; or when a retry / redirect copy of it
was pushed (the queue acknowledges that atomically with the push). Download
failures that nothing retries are acknowledged as they reach the engine.
Anything not acknowledged (the worker died) is re-queued when its lease
expires, so the only cost of a crash is fetching those requests again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError
from scrapy import Request, signals

from scrapy_openclaw import signals as openclaw_signals
from scrapy_openclaw.distributed.queue import active_queue
from scrapy_openclaw.meta import LEASE

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterable

    from scrapy.crawler import Crawler
    from scrapy.http import Response


class _Pending:
    __slots__ = ("exhausted", "failed", "items", "lease")

    def __init__(self, lease: str):
        self.lease = lease
        self.items = 0
        self.exhausted = False
        self.failed = False  # an item failed in a pipeline (e.g. its store was down)


class LeaseAckSpiderMiddleware:
    """Spider middleware (closest to the engine): ack after output and items are done."""

    def __init__(self, crawler: Crawler):
        self.crawler = crawler
        self._pending: dict[int, _Pending] = {}
        for sig in (signals.item_scraped, signals.item_dropped):
            crawler.signals.connect(self._item_done, signal=sig)
        crawler.signals.connect(self._item_error, signal=signals.item_error)
        crawler.signals.connect(self._dead_letter, signal=openclaw_signals.dead_letter)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> LeaseAckSpiderMiddleware:
        return cls(crawler)

    def _ack(self, lease: str | None) -> None:
        queue = active_queue(self.crawler)
        if queue is not None and lease is not None:
            queue.ack(lease)

    def _start(self, response: Response) -> _Pending | None:
        lease = (response.request.meta if response.request is not None else response.meta).get(LEASE)
        if lease is None:
            return None
        return self._pending.setdefault(id(response), _Pending(lease))

    def _filter(self, response: Response, pending: _Pending | None, obj: Any) -> Any:
        if pending is None:
            return obj
        if isinstance(obj, Request):
            # a child carrying the parent's meta is new work, not the parent again
            if obj.meta.get(LEASE) == pending.lease and obj.url != response.url:
                obj.meta.pop(LEASE, None)
        else:
            pending.items += 1
        return obj

    def _finish(self, response: Response, pending: _Pending | None) -> None:
        if pending is None:
            return
        pending.exhausted = True
        self._maybe_ack(response)

    def _maybe_ack(self, response: Any) -> None:
        pending = self._pending.get(id(response))
        if pending is not None and pending.exhausted and pending.items <= 0:
            del self._pending[id(response)]
            queue = active_queue(self.crawler)
            if queue is not None and pending.failed:
                queue.release(pending.lease)  # fetched again rather than an item lost
            else:
                self._ack(pending.lease)

    def process_spider_output(self, response: Response, result: Iterable[Any]) -> Iterable[Any]:
        pending = self._start(response)
        try:
            for obj in result:
                yield self._filter(response, pending, obj)
        finally:
            self._finish(response, pending)

    async def process_spider_output_async(
        self, response: Response, result: AsyncIterator[Any]
    ) -> AsyncIterator[Any]:
        pending = self._start(response)
        try:
            async for obj in result:
                yield self._filter(response, pending, obj)
        finally:
            self._finish(response, pending)

    def process_spider_exception(self, response: Response, exception: Exception) -> None:
        # nothing closer to the spider handled it: the request is finished (with an error)
        pending = self._pending.pop(id(response), None)
        lease = pending.lease if pending else response.meta.get(LEASE)
        self._ack(lease)

    def _item_done(self, response: Any = None, **kwargs: Any) -> None:
        pending = self._pending.get(id(response)) if response is not None else None
        if pending is not None:
            pending.items -= 1
            self._maybe_ack(response)

    def _item_error(self, response: Any = None, **kwargs: Any) -> None:
        pending = self._pending.get(id(response)) if response is not None else None
        if pending is not None:
            pending.failed = True
        self._item_done(response=response)

    def _dead_letter(self, dead_letter: Any, **kwargs: Any) -> None:
        data = getattr(dead_letter, "request", None) or {}
        lease = (data.get("meta") or {}).get(LEASE)
        self._ack(lease if isinstance(lease, str) else None)


class LeaseAckDownloaderMiddleware:
    """Downloader middleware (closest to the engine): ack failures nothing turned into a retry.

    A failure that reaches this point goes to the request's errback or is
    only logged; an errback's own output is not covered by the lease.
    """

    def __init__(self, crawler: Crawler):
        self.crawler = crawler

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> LeaseAckDownloaderMiddleware:
        return cls(crawler)

    def process_exception(self, request: Request, exception: Exception) -> None:
        queue = active_queue(self.crawler)
        if queue is None:
            return
        if isinstance(exception, RedisError):  # our own Redis failed, not the site
            queue.release(request.meta.get(LEASE))
        else:
            queue.ack(request.meta.get(LEASE))
