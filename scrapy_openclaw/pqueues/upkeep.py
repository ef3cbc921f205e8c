"""Letting the health registry forget idle domains: every minute, all but those pending or downloading."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from scrapy_openclaw.runtime import shared

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from scrapy_openclaw.health.reader import HealthReader
    from scrapy_openclaw.pqueues.downloads import Downloads

#: Seconds between two sweeps for idle domains in the health registry (as Scrapy's downloader
#: collects idle slots every 60 s; a quarter of OPENCLAW_HEALTH_IDLE_TTL if that is shorter).
EVICT_EVERY = 60.0


class IdleSweep:
    """Sweeps the health registry for idle domains (see ``HealthRegistry.evict_idle``), and reports its size."""

    def __init__(self, crawler: Crawler, registry: HealthReader | None, downloads: Downloads):
        self.crawler = crawler
        self.stats = crawler.stats
        self.registry = registry
        self.downloads = downloads
        self._next = 0.0 if registry is not None and registry.idle_ttl else math.inf

    def due(self, now: float) -> bool:
        return now >= self._next

    def run(self, now: float) -> None:
        """Forget the registry's idle domains: all but those pending in any of the crawl's queues
        (ready or delayed) or downloading now."""
        registry = self.registry
        if registry is None or not registry.idle_ttl:
            self._next = math.inf
            return
        self._next = now + min(EVICT_EVERY, registry.idle_ttl / 4)
        keep = self.downloads.active_domains()
        queues: list[Any] = shared(self.crawler, "queues", list)
        for queue in queues:
            keep.update(queue.pending_domains())
        evicted = registry.evict_idle(now, keep)
        if evicted:
            self.stats.inc_value("openclaw/health/evicted", len(evicted))

    def report(self) -> None:
        """Known domains and estimated bytes per domain of the registry, as stats."""
        if self.registry is not None:
            self.stats.set_value("openclaw/health/domains", len(self.registry.domains()))
            self.stats.set_value("openclaw/health/bytes_per_domain", round(self.registry.bytes_per_domain(), 1))
