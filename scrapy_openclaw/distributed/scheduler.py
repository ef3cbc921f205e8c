"""scrapy-redis's Scheduler with a clear start-up error and no loss during Redis outages.

Three gaps of the stock scheduler: an unreachable Redis fails deep inside
``from_settings`` with a bare connection error; a Redis error in
``enqueue_request`` (the dupefilter's SADD) loses the request; and the SADD and
the push are two round trips, so a worker killed between them leaves a
fingerprint marked "seen" whose request was never queued -- the page is lost
for good (the parent's lease is re-queued, but its re-fetch finds the child
"seen"). Here the first names the URL; with scrapy-redis's own
``RFPDupeFilter`` and our queue the mark and the push are one Lua step (and
wait in memory together while Redis is down); any other dupefilter is asked
first, as before, and queues unchecked when Redis is down.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError
from scrapy.utils.misc import load_object
from scrapy_redis.dupefilter import RFPDupeFilter
from scrapy_redis.scheduler import Scheduler

from scrapy_openclaw.distributed.queue import LeasedDeadlineQueue
from scrapy_openclaw.redact import mask_uri
from scrapy_openclaw.serialization import SerializationError
from scrapy_openclaw.unstorable import refuse_unstorable

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)


class RedisUnavailableError(ConnectionError):
    """Redis did not answer at crawl start."""


def redis_location(settings: Any) -> str:
    """REDIS_URL (or host:port) with any password masked, for messages."""
    url = settings.get("REDIS_URL")
    if url:
        return mask_uri(url)
    return f"redis://{settings.get('REDIS_HOST') or 'localhost'}:{settings.get('REDIS_PORT') or 6379}"


def _where(client: Any) -> tuple[Any, ...]:
    """Which Redis server and database a client talks to."""
    kw = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {}) or {}
    return kw.get("host"), kw.get("port"), kw.get("path"), kw.get("db", 0)


class OpenClawRedisScheduler(Scheduler):
    """``SCHEDULER`` in distributed mode; behaves as scrapy-redis's otherwise."""

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> OpenClawRedisScheduler:
        try:
            instance = cls.from_settings(crawler.settings)
        except RedisError as exc:
            message = (
                f"scrapy-openclaw distributed mode: cannot reach Redis at "
                f"{redis_location(crawler.settings)} (REDIS_URL): {exc}"
            )
            # logged too: Scrapy's failing engine close can mask the exception itself
            logger.critical(message)
            raise RedisUnavailableError(message) from None
        instance.stats = crawler.stats
        return instance

    def _atomic_dupe(self, request: Request) -> tuple[str, str] | None:
        """(dupefilter key, fingerprint) when the queue can mark and push in one step."""
        df = self.df
        if request.dont_filter or not isinstance(self.queue, LeasedDeadlineQueue):
            return None
        # only the stock filter: a subclass overriding request_seen keeps its own logic
        if not isinstance(df, RFPDupeFilter) or type(df).request_seen is not RFPDupeFilter.request_seen:
            return None
        if _where(df.server) != _where(self.queue.server):
            return None
        return df.key, df.request_fingerprint(request)

    def enqueue_request(self, request: Request) -> bool:
        if isinstance(self.queue, LeasedDeadlineQueue):
            try:  # before the duplicate filter: a refused request is never marked as seen
                self.queue.encode(request)  # (push reuses the result)
            except SerializationError as exc:
                self.queue.drop_lease(request)
                refuse_unstorable(self.queue.crawler, request, exc, store="redis")
                return False  # the engine sends request_dropped
        dupe = self._atomic_dupe(request)
        if dupe is not None:
            if not self.queue.push(request, dupe=dupe):
                self.df.log(request, self.spider)
                return False
            if self.stats:
                self.stats.inc_value("scheduler/enqueued/redis")
            return True
        if not request.dont_filter:
            try:
                seen = self.df.request_seen(request)
            except RedisError as exc:
                logger.warning("Dupefilter unreachable (%(error)s); queueing %(request)s unchecked",
                               {"error": exc, "request": request}, extra={"spider": self.spider})
                seen = False  # at worst a duplicate fetch, never a lost request
            if seen:
                self.df.log(request, self.spider)
                return False
        if self.stats:
            self.stats.inc_value("scheduler/enqueued/redis")
        self.queue.push(request)
        return True

    def open(self, spider: Spider) -> None:
        """scrapy-redis's, but "Resuming crawl" goes through a logger (``Spider.log`` is deprecated)."""
        self.spider = spider
        try:
            self.queue = load_object(self.queue_cls)(
                server=self.server, spider=spider, key=self.queue_key % {"spider": spider.name},
                serializer=self.serializer,
            )
        except TypeError as e:
            raise ValueError(f"Failed to instantiate queue class '{self.queue_cls}': {e}") from e
        if not self.df:
            self.df = load_object(self.dupefilter_cls).from_spider(spider)
        if self.flush_on_start:
            self.flush()
        pending = len(self.queue)
        if pending:
            logger.info("Resuming crawl (%(n)d requests scheduled)", {"n": pending}, extra={"spider": spider})

    def next_request(self) -> Request | None:
        """scrapy-redis's, without the ``spider=`` stats argument Scrapy 2.19 deprecates."""
        request = self.queue.pop(self.idle_before_close)
        if request and self.stats:
            self.stats.inc_value("scheduler/dequeued/redis")
        return request

    def has_pending_requests(self) -> bool:
        return len(self.queue) > 0

    def close(self, reason: str) -> None:
        if isinstance(self.queue, LeasedDeadlineQueue):
            self.queue.close(reason)
        super().close(reason)
