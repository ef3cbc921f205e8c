"""Spiders (and a dying queue) for the distributed tests (imported by worker subprocesses as ``tests.distributed_spiders``)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from scrapy import signals
from scrapy.exceptions import DontCloseSpider
from scrapy_redis.spiders import RedisSpider

from scrapy_openclaw.distributed.queue import LEASE, LeasedDeadlineQueue
from scrapy_openclaw.testing.spiders import ChaosSpider


class PidChaosSpider(ChaosSpider):
    """A plain ``scrapy.Spider`` (``start_urls``, no hooks, no keep-alive): ChaosSpider's output,
    each item tagged with this worker's pid (who scraped what). Our workers run this one."""

    def parse(self, response: Any) -> Any:
        for obj in super().parse(response):
            if isinstance(obj, dict):
                obj["worker"] = os.getpid()
            yield obj


class WorkerChaosSpider(PidChaosSpider):
    """PidChaosSpider kept open ``grace`` seconds, for stock scrapy-redis workers only: its
    scheduler sees nothing pending while the first request is not in Redis yet, so workers
    started before it would close at once (ours count the crawl's work, see ``pending.py``)."""

    grace = 6.0  # > the engine heartbeat (5 s), so stock scrapy-redis workers get to poll too

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> WorkerChaosSpider:
        spider = super().from_crawler(crawler, *args, **kwargs)
        spider._opened = time.time()
        crawler.signals.connect(spider._idle, signal=signals.spider_idle)
        return spider

    def _idle(self) -> None:
        if time.time() - self._opened < self.grace:
            raise DontCloseSpider


class LinksOnlyStartSpider(PidChaosSpider):
    """Start pages yield only their links (no item), so nothing in a pipeline delays their
    acknowledgement: it is due as soon as the links are scheduled. (A plain spider too.)"""

    def parse(self, response: Any) -> Any:
        for obj in super().parse(response):
            if isinstance(obj, dict) and response.meta.get("is_start_request"):
                continue
            yield obj


class RedisChaosSpider(RedisSpider):
    """A stock scrapy-redis ``RedisSpider``: start URLs come from its ``redis_key`` list.

    Named "chaos" like the other workers, so queue and item keys are the same.
    Closes after ``MAX_IDLE_TIME_BEFORE_CLOSE`` seconds with nothing to do.
    """

    name = "chaos"
    redis_key = "chaos:start_urls"
    parse = ChaosSpider.parse


class DieBeforePushQueue(LeasedDeadlineQueue):
    """The leased queue of a worker that is killed (SIGKILL, by itself) just before a new
    child request reaches Redis: the moment a dupefilter mark made in a separate round trip
    would already be in Redis while the request is not (the 1-page loss of issue 9).

    The first worker to make ``DIE_AFTER_PUSHES`` pushes of new child requests claims
    ``DIE_MARKER`` (the URL it died on) and dies; the others run normally.
    """

    _fresh = 0

    def push(self, request: Any, dupe: Any = None, on_dupe: Any = None) -> bool:
        settings = self.crawler.settings
        marker = settings.get("DIE_MARKER")
        if marker and LEASE not in request.meta and not request.dont_filter:
            self._fresh += 1
            if self._fresh >= settings.getint("DIE_AFTER_PUSHES", 10) and _claim(marker, request.url):
                os.kill(os.getpid(), signal.SIGKILL)
        return super().push(request, dupe, on_dupe)


def _claim(path: str, text: str) -> bool:
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return True


class DieAfterAckQueue(LeasedDeadlineQueue):
    """The leased queue of a worker that kills itself (SIGKILL) right after the first
    acknowledgement of a start page reached Redis, writing the acknowledged URL to ``DIE_MARKER``."""

    def pop(self, timeout: float = 0) -> Any:
        request = super().pop(timeout)
        if request is not None and not request.meta.get("depth"):  # a start page
            # (only those: under load a child can be fetched and acknowledged before its
            # parent's acknowledgement is confirmed, which is not the moment this queue is for)
            self._urls = getattr(self, "_urls", {})
            self._urls[request.meta[LEASE]] = request.url
        return request

    def _apply(self, job: Any, res: Any) -> None:
        super()._apply(job, res)
        if not res.acked:
            return
        for shard, entries in job.acks.items():
            for entry in entries:
                lease = f"{shard}/{entry.partition(chr(1))[0]}"  # (an ack is "<id>\x01<place>")
                url = getattr(self, "_urls", {}).get(lease)
                marker = self.crawler.settings.get("DIE_MARKER")
                if url and marker and _claim(marker, url):
                    os.kill(os.getpid(), signal.SIGKILL)


class StallMeter:
    """Extension measuring how late a 10 ms reactor timer fires (the reactor's stalls).

    Writes ``STALL_FILE``: ``{"max": seconds, "stalls": [[time, seconds], ...]}`` (stalls over
    20 ms, with the wall-clock time they ended), at spider close.
    """

    PERIOD = 0.01

    def __init__(self, crawler: Any):
        self.path = crawler.settings.get("STALL_FILE")
        self.stalls: list[list[float]] = []
        self.max = 0.0
        self._last = 0.0
        self._loop: Any = None
        crawler.signals.connect(self._opened, signal=signals.spider_opened)
        crawler.signals.connect(self._closed, signal=signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler: Any) -> StallMeter:
        return cls(crawler)

    def _opened(self, spider: Any) -> None:
        from scrapy.utils.asyncio import create_looping_call

        self._last = time.monotonic()
        self._loop = create_looping_call(self._beat)
        self._loop.start(self.PERIOD, now=False)

    def _beat(self) -> None:
        now = time.monotonic()
        late = now - self._last - self.PERIOD
        self._last = now
        self.max = max(self.max, late)
        if late > 0.02:
            self.stalls.append([time.time(), late])

    def _closed(self, spider: Any) -> None:
        import json

        if self._loop is not None and self._loop.running:
            self._loop.stop()
        if self.path:
            with open(self.path, "w", encoding="utf-8") as f:
                json.dump({"max": self.max, "stalls": self.stalls}, f)
