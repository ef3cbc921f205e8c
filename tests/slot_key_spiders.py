"""A chaos-site spider that records the domain key each component used (``test_slot_key.py``).

Imported by crawl subprocesses as ``tests.slot_key_spiders``.
"""

from __future__ import annotations

import json
from typing import Any

from scrapy import Request, signals
from scrapy.resolver import dnscache

from scrapy_openclaw.errors import ItemValidationError
from scrapy_openclaw.health import HealthRegistry
from scrapy_openclaw.metrics.extension import MetricsExtension
from scrapy_openclaw.pqueues import DeadlinePriorityQueue
from scrapy_openclaw.retry.budget import RetryBudgets
from scrapy_openclaw.testing.spiders import ChaosSpider

QUEUE_KEYS: set[str] = set()


class RefuseRootPages:
    """An item pipeline refusing the item of every root page: a dead letter for an item."""

    def process_item(self, item: Any) -> Any:
        if item["url"].endswith("/"):
            raise ItemValidationError(f"root page {item['url']}")
        return item


class RecordingQueue(DeadlinePriorityQueue):
    """The add-on's queue, noting every domain key it files a request under."""

    def push(self, request: Request) -> None:
        super().push(request)
        QUEUE_KEYS.update(self.pending_domains())


class SlotKeySpider(ChaosSpider):
    """``-a slot=NAME`` puts every request in one download slot; ``-a dns=JSON`` fills Scrapy's
    DNS cache (as its caching resolver would) so ``CONCURRENT_REQUESTS_PER_IP`` keys by IP."""

    name = "slotkey"

    def __init__(self, *args: Any, slot: str = "", dns: str = "", records: str = "", **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.slot = slot
        self.records_path = records
        dnscache.update(json.loads(dns) if dns else {})

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> SlotKeySpider:
        spider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider._record, signal=signals.spider_closed)
        return spider

    def _meta(self) -> dict[str, Any]:
        return {"download_slot": self.slot} if self.slot else {}

    async def start(self) -> Any:
        for url in self.start_urls:
            yield Request(url, meta=self._meta())

    def parse(self, response: Any) -> Any:
        for out in super().parse(response):
            if isinstance(out, Request) and self.slot:
                out.meta.update(self._meta())
            yield out

    def _record(self, spider: Any) -> None:
        crawler = self.crawler
        metrics = next(e for e in crawler.extensions.middlewares if isinstance(e, MetricsExtension))
        labels = {
            s.labels["domain"] for family in metrics.registry.collect() for s in family.samples if "domain" in s.labels
        }
        records = {
            "health": sorted(HealthRegistry.for_crawler(crawler).domains()),
            "queue": sorted(QUEUE_KEYS),
            "budgets": sorted(RetryBudgets.for_crawler(crawler)._budgets),
            "metrics": sorted(labels),
        }
        with open(self.records_path, "w", encoding="utf-8") as f:
            json.dump(records, f)
