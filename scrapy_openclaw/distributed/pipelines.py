"""scrapy-redis's ``RedisPipeline``, each item written once, with its page's acknowledgement.

scrapy-redis's pipeline pushes each item as it passes (one round trip per item, on the
reactor's thread pool); a worker killed after the push and before its page's acknowledgement
has the page fetched again, and its items written twice. Here the items ride the queue's
rounds (``items.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy_redis.pipelines import RedisPipeline
from twisted.internet.threads import deferToThread

from scrapy_openclaw.distributed.items import marks_key
from scrapy_openclaw.distributed.queue import active_queue
from scrapy_openclaw.meta import LEASE

if TYPE_CHECKING:
    from scrapy.crawler import Crawler


class RedisItemPipeline(RedisPipeline):
    """scrapy-redis's ``RedisPipeline``, each item written once, with its page's acknowledgement.

    In distributed mode the add-on puts it in place of ``scrapy_redis.pipelines.RedisPipeline``
    (``ITEM_PIPELINES``: list this class with ``None`` to keep theirs). ``REDIS_ITEMS_KEY``,
    ``REDIS_ITEMS_SERIALIZER`` and an ``item_key`` override keep their meaning. An item is
    serialized where the pipeline stands in ``ITEM_PIPELINES`` and written once every pipeline
    took it (``item_scraped``): one a later pipeline drops is not written. Outside a distributed
    crawl it writes as ``RedisPipeline`` does.
    """

    crawler: Crawler

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> RedisItemPipeline:
        pipeline = cls.from_settings(crawler.settings)
        pipeline.crawler = crawler
        marks_key(pipeline.key % {"spider": getattr(crawler.spidercls, "name", None) or "spider"})  # (at start)
        pipeline._waiting = {}
        crawler.signals.connect(pipeline._scraped, signal=signals.item_scraped)
        crawler.signals.connect(pipeline._not_scraped, signal=signals.item_dropped)
        crawler.signals.connect(pipeline._not_scraped, signal=signals.item_error)
        return pipeline

    #: id(item) -> (item, key, payload) of each time it passed, until item_scraped (or dropped)
    _waiting: dict[int, list[tuple[Any, str, str]]]

    def process_item(self, item: Any, spider: Any = None) -> Any:
        spider = self.crawler.spider
        if _queue(self.crawler) is None:
            return super().process_item(item, spider)
        self._waiting.setdefault(id(item), []).append((item, self.item_key(item, spider), self.serialize(item)))
        return item

    def _scraped(self, item: Any, response: Any = None, **kwargs: Any) -> None:
        waiting = self._take(item)
        if waiting is None or waiting[0] is not item:
            return
        queue = _queue(self.crawler)
        if queue is None:  # (the queue closed meanwhile: written as RedisPipeline writes it)
            deferToThread(self.server.rpush, waiting[1], waiting[2])
            return
        # response: the Response of a callback's item, the Failure of an errback's
        request = getattr(response, "request", None)
        lease = request.meta.get(LEASE) if request is not None else None
        queue.add_item(lease, waiting[1], waiting[2])

    def _not_scraped(self, item: Any, **kwargs: Any) -> None:
        self._take(item)

    def _take(self, item: Any) -> tuple[Any, str, str] | None:
        """What *item* left when it passed (the oldest, should the same object pass twice)."""
        passed = self._waiting.get(id(item))
        if not passed:
            return None
        taken = passed.pop(0)
        if not passed:
            del self._waiting[id(item)]
        return taken


def _queue(crawler: Crawler) -> Any:
    queue = active_queue(crawler)
    return queue if queue is not None and queue.link.background else None
