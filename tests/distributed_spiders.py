"""Spiders for the distributed tests (imported by worker subprocesses as ``tests.distributed_spiders``)."""

from __future__ import annotations

import os
import time
from typing import Any

from scrapy import signals
from scrapy.exceptions import DontCloseSpider
from scrapy_redis.spiders import RedisSpider

from scrapy_openclaw.testing.spiders import ChaosSpider


class WorkerChaosSpider(ChaosSpider):
    """ChaosSpider that stays open ``grace`` seconds, so workers started before
    the first request reaches Redis do not close at once."""

    grace = 6.0  # > the engine heartbeat (5 s), so stock scrapy-redis workers get to poll too

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> WorkerChaosSpider:
        spider = super().from_crawler(crawler, *args, **kwargs)
        spider._opened = time.time()
        crawler.signals.connect(spider._idle, signal=signals.spider_idle)
        return spider

    def parse(self, response: Any) -> Any:
        """ChaosSpider's output, each item tagged with this worker's pid (who scraped what)."""
        for obj in super().parse(response):
            if isinstance(obj, dict):
                obj["worker"] = os.getpid()
            yield obj

    def _idle(self) -> None:
        if time.time() - self._opened < self.grace:
            raise DontCloseSpider


class RedisChaosSpider(RedisSpider):
    """A stock scrapy-redis ``RedisSpider``: start URLs come from its ``redis_key`` list.

    Named "chaos" like the other workers, so queue and item keys are the same.
    Closes after ``MAX_IDLE_TIME_BEFORE_CLOSE`` seconds with nothing to do.
    """

    name = "chaos"
    redis_key = "chaos:start_urls"
    parse = ChaosSpider.parse
