"""One shared view of "is Redis reachable" for every distributed component of a crawl.

Every Redis call in a worker is synchronous on the reactor thread, and
redis-py's own retry sleeps between attempts. If each component discovered an
outage by itself, every call during it would pay that wait: the health
registry alone (several calls per response) could then keep the reactor busy
for the whole outage, so the queue never ran (no heartbeat, no pop) and
nothing noticed that Redis had gone. Here the first failure opens a backoff
window (0.1 s doubling to 5 s) during which *no* component calls Redis; they
serve from memory (buffered writes, the cached health state) instead, and the
first successful call after it closes the outage once for everyone.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from scrapy_openclaw.runtime import shared
from scrapy_openclaw.settings import DEFAULTS

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

STATS = "openclaw/distributed"
_MIN_BACKOFF = 0.1
_MAX_BACKOFF = 5.0


class RedisLink:
    """Outage state shared by the queue and the health registry of one crawler."""

    def __init__(self, crawler: Crawler):
        self.crawler = crawler
        self.stats = crawler.stats
        self.max_outage = crawler.settings.getfloat(
            "OPENCLAW_DISTRIBUTED_MAX_OUTAGE", DEFAULTS["OPENCLAW_DISTRIBUTED_MAX_OUTAGE"]
        )
        self.down_since: float | None = None
        self._retry_at = 0.0
        self._backoff = 0.0

    @classmethod
    def for_crawler(cls, crawler: Crawler) -> RedisLink:
        return shared(crawler, "distributed_link", lambda: cls(crawler))

    def ok(self) -> bool:
        """Whether a Redis call may be tried now (not inside a backoff window)."""
        return time.time() >= self._retry_at

    def within_outage(self) -> bool:
        """Redis is up, or has been down for less than ``OPENCLAW_DISTRIBUTED_MAX_OUTAGE``."""
        return self.down_since is None or time.time() - self.down_since < self.max_outage

    def failed(self, exc: Exception) -> None:
        now = time.time()
        if self.down_since is None:
            self.down_since = now
            logger.warning("Redis unreachable (%(error)s); buffering writes and retrying",
                           {"error": exc}, extra={"spider": self.crawler.spider})
        self.stats.inc_value(f"{STATS}/redis_errors")
        self._backoff = min(_MAX_BACKOFF, max(_MIN_BACKOFF, self._backoff * 2))
        self._retry_at = now + self._backoff

    def recovered(self) -> None:
        if self.down_since is not None:
            logger.info("Redis is back after %(s).1fs", {"s": time.time() - self.down_since},
                        extra={"spider": self.crawler.spider})
            self.stats.inc_value(f"{STATS}/reconnects")
        self.down_since, self._backoff, self._retry_at = None, 0.0, 0.0

    def reset_backoff(self) -> None:
        """Allow one more attempt at once (a clean close flushing what it buffered)."""
        self._retry_at = 0.0

    def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` with the outage bookkeeping; RedisError propagates."""
        from redis.exceptions import RedisError

        try:
            result = fn(*args, **kwargs)
        except RedisError as exc:
            self.failed(exc)
            raise
        self.recovered()
        return result
