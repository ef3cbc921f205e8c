"""scrapy-redis's Scheduler with a clear start-up error and no loss during Redis outages.

Two gaps of the stock scheduler: an unreachable Redis fails deep inside
``from_settings`` with a bare connection error, and a Redis error in
``enqueue_request`` (the dupefilter's SADD) loses the request. Here the first
names the URL, and the second keeps the request in memory until Redis is back.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError
from scrapy_redis.scheduler import Scheduler

from scrapy_openclaw.distributed.queue import LeasedDeadlineQueue

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)


class RedisUnavailableError(ConnectionError):
    """Redis did not answer at crawl start."""


def redis_location(settings: Any) -> str:
    """REDIS_URL (or host:port) with any password masked, for messages."""
    url = settings.get("REDIS_URL")
    if url:
        return re.sub(r"//([^:@/]*):[^@/]*@", r"//\1:***@", str(url))
    return f"redis://{settings.get('REDIS_HOST') or 'localhost'}:{settings.get('REDIS_PORT') or 6379}"


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

    def enqueue_request(self, request: Request) -> bool:
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
            self.stats.inc_value("scheduler/enqueued/redis", spider=self.spider)
        self.queue.push(request)
        return True

    def has_pending_requests(self) -> bool:
        return len(self.queue) > 0

    def close(self, reason: str) -> None:
        if isinstance(self.queue, LeasedDeadlineQueue):
            self.queue.close(reason)
        super().close(reason)
