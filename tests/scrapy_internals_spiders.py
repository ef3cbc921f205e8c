"""A spider that exercises :mod:`scrapy_openclaw.scrapy_internals` inside a real crawl.

Imported by crawl subprocesses as ``tests.scrapy_internals_spiders``. Each
``probe`` (a spider argument) yields items recording what happened, with
times from ``time.time()``; the tests in ``test_scrapy_internals.py`` judge them.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import scrapy
from scrapy import signals
from scrapy.core.engine import ExecutionEngine
from scrapy.exceptions import DontCloseSpider, IgnoreRequest
from scrapy.utils.asyncio import call_later

from scrapy_openclaw import scrapy_internals as si

#: Longer than any probe: only a wake-up, never the heartbeat, makes the engine pull.
ExecutionEngine._SLOT_HEARTBEAT_INTERVAL = 60.0


class ProbeSpider(scrapy.Spider):
    name = "probe"

    def __init__(self, base: str = "", probe: str = "", records: str = "", **kwargs: Any):
        super().__init__(**kwargs)
        self.base = base.rstrip("/")
        self.probe = probe
        self.records_path = records
        self.records: list[dict[str, Any]] = []
        self.keep_open = probe == "wake"  # until the request put in the scheduler was fetched

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> ProbeSpider:
        spider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider._opened, signal=signals.spider_opened)
        crawler.signals.connect(spider._idle, signal=signals.spider_idle)
        return spider

    def _idle(self, spider: Any) -> None:
        if self.keep_open:
            raise DontCloseSpider

    def url(self, page: int) -> str:
        return f"{self.base}/page/{page}"

    def _opened(self, spider: Any) -> None:
        if self.probe == "lifecycle":
            si.track_engine_requests(
                si.engine_of(self.crawler),
                lambda r: self.records.append({"event": "added", "url": r.url, "t": time.time()}),
                lambda r: self.records.append({"event": "removed", "url": r.url, "t": time.time()}),
            )

    async def start(self) -> Any:
        yield scrapy.Request(self.url(0), dont_filter=True)

    def slot(self, response: Any) -> Any:
        key = si.engine_of(self.crawler).downloader.get_slot_key(response.request)
        return si.download_slot(self.crawler, key)

    # --- probes ---------------------------------------------------------------------

    def parse(self, response: Any) -> Any:
        if response.meta.get("child"):
            self.keep_open = False
            yield {"event": "fetched", "url": response.url, "t": time.time()}
            return
        yield from getattr(self, f"probe_{self.probe}")(response)

    def probe_pause(self, response: Any) -> Any:
        slot = self.slot(response)
        clock_gap = abs(si.slot_clock() - slot.lastseen)
        until = time.time() + 1.5
        si.pause_slot(slot, until)
        yield {"event": "paused", "until": until, "clock_gap": clock_gap}
        for page in (1, 2):
            yield scrapy.Request(self.url(page), meta={"child": True})

    def probe_resume(self, response: Any) -> Any:
        slot = self.slot(response)
        si.pause_slot(slot, time.time() + 60)
        downloader = si.engine_of(self.crawler).downloader

        def resume() -> None:
            self.records.append({"event": "resumed", "t": time.time()})
            si.resume_slot(slot, downloader)

        call_later(0.5, resume)
        yield scrapy.Request(self.url(1), meta={"child": True})

    def probe_drain(self, response: Any) -> Any:
        slot = self.slot(response)
        si.pause_slot(slot, time.time() + 60)

        def drain() -> None:
            drained = 0
            for _request, waiting in si.drain_slot_queue(slot):
                waiting.errback(IgnoreRequest("drained"))
                drained += 1
            self.records.append({"event": "drained", "n": drained, "t": time.time()})

        call_later(0.5, drain)
        for page in (1, 2, 3):
            yield scrapy.Request(self.url(page), meta={"child": True}, errback=self.failed)

    def failed(self, failure: Any) -> Any:
        yield {"event": "failed", "url": failure.request.url, "error": type(failure.value).__name__}

    def probe_wake(self, response: Any) -> Any:
        engine = si.engine_of(self.crawler)
        activity = si.downloader_activity(engine)
        yield {"event": "activity", "in_flight": activity[0], "slots": activity[1]}

        def enqueue() -> None:
            scheduler = si.scheduler_of(engine)
            scheduler.enqueue_request(scrapy.Request(self.url(1), meta={"child": True}, dont_filter=True))
            self.records.append({"event": "enqueued", "t": time.time(), "pending": len(scheduler)})

        def wake() -> None:
            self.records.append({"event": "woken", "t": time.time()})
            si.wake_engine(self.crawler)

        call_later(0.5, enqueue)  # after the engine has pulled for this response's callback
        call_later(2.5, wake)

    def probe_lifecycle(self, response: Any) -> Any:
        yield {"event": "item", "url": response.url}
        yield scrapy.Request(self.url(1), meta={"child": True})

    def closed(self, reason: str) -> None:
        """What happened outside callbacks (timers, hooks, pipelines), in order."""
        if self.records_path:
            with open(self.records_path, "w", encoding="utf-8") as f:
                json.dump(self.records, f)


class SlowPipeline:
    """Keeps each item 0.5 s and records when it let it go."""

    def __init__(self, crawler: Any):
        self.crawler = crawler

    @classmethod
    def from_crawler(cls, crawler: Any) -> SlowPipeline:
        return cls(crawler)

    async def process_item(self, item: Any, spider: Any = None) -> Any:
        if item.get("event") == "item":
            await asyncio.sleep(0.5)
            self.crawler.spider.records.append({"event": "pipeline_done", "url": item["url"], "t": time.time()})
        return item
