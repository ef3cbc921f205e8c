"""scrapy-redis's Scheduler with a clear start-up error and no loss during Redis outages.

The stock scheduler fails deep inside ``from_settings`` when Redis is unreachable,
loses a request when the dupefilter's SADD fails, and marks a fingerprint "seen"
and pushes its request in two round trips, so a worker killed in between loses the
page for good. Here the error names the URL, and the mark and the push are one step.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError
from scrapy.utils.misc import load_object
from scrapy_redis.dupefilter import RFPDupeFilter  # type: ignore[import-untyped]
from scrapy_redis.scheduler import Scheduler  # type: ignore[import-untyped]

from scrapy_openclaw.distributed.connection import client_for_crawler
from scrapy_openclaw.distributed.connection import redis_location as redis_location  # (re-exported)
from scrapy_openclaw.distributed.queue import LeasedDeadlineQueue
from scrapy_openclaw.distributed.unstorable import refuse_unstorable
from scrapy_openclaw.exceptions import LegacyQueueError as LegacyQueueError  # (re-exported)
from scrapy_openclaw.exceptions import RedisUnavailableError as RedisUnavailableError
from scrapy_openclaw.serialization import SerializationError
from scrapy_openclaw.settings import OpenClawSettings

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)


def _where(client: Any) -> tuple[Any, ...]:
    """Which Redis server and database a client talks to."""
    kw = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {}) or {}
    return kw.get("host"), kw.get("port"), kw.get("path"), kw.get("db", 0)


class OpenClawRedisScheduler(Scheduler):
    """``SCHEDULER`` in distributed mode; behaves as scrapy-redis's otherwise.

    With scrapy-redis's own ``RFPDupeFilter`` and our queue, the fingerprint's mark and
    the push are one Lua step (and wait in memory together while Redis is down). Any
    other dupefilter is asked first, as before, and a request is queued unchecked while
    it is unreachable: at worst a duplicate fetch, never a lost request. (A parent's
    lease is re-queued after a crash, but its re-fetch would find a lost child "seen".)
    """

    df: Any  # (scrapy-redis's, set in its __init__ or in open())

    @classmethod
    def from_settings(
        cls, settings: Any, config: OpenClawSettings | None = None, server: Any = None
    ) -> OpenClawRedisScheduler:
        """scrapy-redis's, with our client (*server*, or one made from *settings*): one Redis, a
        Redis Cluster or a Sentinel master."""
        from scrapy_openclaw.distributed.connection import client_from_settings

        kwargs: dict[str, Any] = {
            "persist": settings.getbool("SCHEDULER_PERSIST"),
            "flush_on_start": settings.getbool("SCHEDULER_FLUSH_ON_START"),
            "idle_before_close": settings.getint("SCHEDULER_IDLE_BEFORE_CLOSE"),
        }
        optional = {
            "queue_key": "SCHEDULER_QUEUE_KEY",
            "queue_cls": "SCHEDULER_QUEUE_CLASS",
            "dupefilter_key": "SCHEDULER_DUPEFILTER_KEY",
            "dupefilter_cls": "DUPEFILTER_CLASS",
            "serializer": "SCHEDULER_SERIALIZER",
        }
        for name, setting in optional.items():
            if settings.get(setting):
                kwargs[name] = settings.get(setting)
        dupefilter_cls = load_object(kwargs["dupefilter_cls"])
        if not hasattr(dupefilter_cls, "from_spider"):
            kwargs["dupefilter"] = dupefilter_cls.from_settings(settings)
        if isinstance(kwargs.get("serializer"), str):
            kwargs["serializer"] = importlib.import_module(kwargs["serializer"])
        if server is None:
            server = client_from_settings(settings, config)
        server.ping()
        return cls(server=server, **kwargs)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> OpenClawRedisScheduler:
        try:
            instance = cls.from_settings(
                crawler.settings, OpenClawSettings.for_crawler(crawler), client_for_crawler(crawler)
            )
        except RedisError as exc:
            message = f"scrapy-openclaw distributed mode: cannot reach Redis at {redis_location(crawler)}: {exc}"
            if OpenClawSettings.for_crawler(crawler).redis_sentinels:
                message += " (during a failover: start the worker again once a replica is promoted)"
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
            if not self.queue.push(request, dupe=dupe, on_dupe=lambda: self._seen_after_all(request)):
                self.df.log(request, self.spider)
                return False
            if self.stats:
                self.stats.inc_value("scheduler/enqueued/redis")
            return True
        if not request.dont_filter:
            try:
                seen = self.df.request_seen(request)
            except RedisError as exc:
                logger.warning(
                    "Dupefilter unreachable (%(error)s); queueing %(request)s unchecked",
                    {"error": exc, "request": request},
                    extra={"spider": self.spider},
                )
                seen = False  # at worst a duplicate fetch, never a lost request
            if seen:
                self.df.log(request, self.spider)
                return False
        if self.stats:
            self.stats.inc_value("scheduler/enqueued/redis")
        self.queue.push(request)
        return True

    def _seen_after_all(self, request: Request) -> None:
        """A push sent in the background found its fingerprint already seen."""
        self.df.log(request, self.spider)
        if self.stats:
            self.stats.inc_value("scheduler/enqueued/redis", -1)

    def open(self, spider: Spider) -> None:
        """scrapy-redis's, but "Resuming crawl" goes through a logger (``Spider.log`` is deprecated)."""
        self.spider = spider
        try:
            self.queue = load_object(self.queue_cls)(
                server=self.server,
                spider=spider,
                key=self.queue_key % {"spider": spider.name},
                serializer=self.serializer,
            )
        except TypeError as e:
            raise ValueError(f"Failed to instantiate queue class '{self.queue_cls}': {e}") from e
        if not self.df:
            self.df = load_object(self.dupefilter_cls).from_spider(spider)
        if isinstance(self.df, RFPDupeFilter) and isinstance(self.queue, LeasedDeadlineQueue):
            self.df.server = self.server  # the same (possibly cluster) client as the queue
        if self.flush_on_start:
            self.flush()
        if isinstance(self.queue, LeasedDeadlineQueue):
            self._refuse_legacy_layout()
        pending = len(self.queue)
        if isinstance(self.queue, LeasedDeadlineQueue):
            self.queue.check_format(pending)  # (a QueueFormatError before any background I/O)
        if pending:
            logger.info("Resuming crawl (%(n)d requests scheduled)", {"n": pending}, extra={"spider": spider})
        if isinstance(self.queue, LeasedDeadlineQueue):
            self.queue.join()
            self.queue.link.start_background()  # from here on, Redis I/O leaves the reactor thread

    def _refuse_legacy_layout(self) -> None:
        legacy = self.queue.legacy_keys()
        if not legacy:
            return
        message = (
            f"scrapy-openclaw distributed mode: Redis at {redis_location(self.queue.crawler)} holds "
            f"a queue in the single-node layout of earlier versions ({', '.join(legacy)}); this version "
            f"shards the queue (OPENCLAW_DISTRIBUTED_SHARDS) and does not read it. Finish that crawl with "
            f"the version that started it, or start over with SCHEDULER_FLUSH_ON_START=True "
            f"(deletes it); see the docs, distributed.md, 'Migrating a queue'"
        )
        logger.critical(message)
        raise LegacyQueueError(message)

    def flush(self) -> None:
        super().flush()
        if isinstance(self.queue, LeasedDeadlineQueue) and isinstance(self.df, RFPDupeFilter):
            self.queue.clear_dupefilter(self.df.key)

    def next_request(self) -> Request | None:
        """scrapy-redis's, without the ``spider=`` stats argument Scrapy 2.19 deprecates."""
        request = self.queue.pop(self.idle_before_close)
        if request and self.stats:
            self.stats.inc_value("scheduler/dequeued/redis")
        return request

    def has_pending_requests(self) -> bool:
        """Whether the whole crawl has work left (with our queue: see ``pending.py``), so an
        ordinary ``scrapy.Spider`` stays open while requests wait in Redis."""
        return len(self.queue) > 0

    def close(self, reason: str) -> Any:
        """A Deferred during a crawl: fired once the buffered writes reached Redis (bounded)."""
        finished = None
        if isinstance(self.queue, LeasedDeadlineQueue):
            finished = self.queue.close(reason)
        super().close(reason)
        return finished
