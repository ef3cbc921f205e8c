"""SiteMemoryExtension: a crawl starts each known domain at the pace an earlier crawl learned.

At open it hands the health registry each remembered domain's limit, burst and
Crawl-delay (:meth:`~scrapy_openclaw.health.registry.HealthRegistry.remember`); at
close, and every ``OPENCLAW_SITES_SAVE_INTERVAL`` seconds, it saves what the crawl
learned for the next one. A store it cannot read costs one warning, never the crawl.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import NotConfigured
from scrapy.utils.asyncio import create_looping_call
from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet.threads import deferToThread

from scrapy_openclaw.health.reader import health_registry
from scrapy_openclaw.health.registry import HealthRegistry
from scrapy_openclaw.metrics.figures import OTHER, CrawlFigures
from scrapy_openclaw.settings import OpenClawSettings
from scrapy_openclaw.sites.entry import SiteEntry, learned
from scrapy_openclaw.sites.store import open_store

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

STATS_PREFIX = "openclaw/sites"


class SiteMemoryExtension:
    """Seeds the health registry from the site memory at open; saves it periodically and at close."""

    def __init__(self, crawler: Crawler):
        config = OpenClawSettings.for_crawler(crawler)
        self.crawler = crawler
        self.interval = config.sites_save_interval
        self.figures = CrawlFigures.for_crawler(crawler)
        self.store: Any = None
        #: what the store held at open: this crawl's entries build on it (saves do not add up twice)
        self.known: dict[str, SiteEntry] = {}
        #: what this crawl last wrote per domain (at first what it read): a save adds the counts since
        self.saved: dict[str, SiteEntry] = {}
        self._loop: Any = None
        self._saving = False
        crawler.signals.connect(self.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(self.spider_closed, signal=signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> SiteMemoryExtension:
        if not OpenClawSettings.for_crawler(crawler).sites_enabled:
            raise NotConfigured
        return cls(crawler)

    async def spider_opened(self, spider: Spider) -> None:
        try:
            self.store = open_store(OpenClawSettings.for_crawler(self.crawler), self.crawler.settings, spider.name)
            self.known = await maybe_deferred_to_future(deferToThread(self.store.load))
            self.saved = dict(self.known)
        except Exception as exc:  # a damaged or hostile store, Redis down: the crawl goes on without it
            self._damaged(spider, exc)
        registry = health_registry(self.crawler)
        seeded = 0
        if isinstance(registry, HealthRegistry):
            for domain, entry in self.known.items():
                if entry.limit is not None or entry.crawl_delay > 0:
                    registry.remembered.remember(
                        domain, limit=entry.limit, burst=entry.burst, crawl_delay=entry.crawl_delay
                    )
                    seeded += 1
        self.crawler.stats.set_value(f"{STATS_PREFIX}/known", len(self.known))
        if self.known:
            logger.info(
                "Site memory (%(store)s): %(n)d domain(s) known, %(seeded)d start at their remembered pace",
                {"store": self.store, "n": len(self.known), "seeded": seeded},
                extra={"spider": spider},
            )
        if self.interval > 0 and self.store is not None:
            self._loop = create_looping_call(self._save_in_background)
            self._loop.start(self.interval, now=False)

    def _damaged(self, spider: Spider, exc: Exception) -> None:
        self.known = {}
        self.crawler.stats.set_value(f"{STATS_PREFIX}/load_error", str(exc))
        logger.warning(
            "Ignoring the site memory: %(error)s; every site starts at slow start "
            "(scrapy openclaw-sites forget --all clears it)",
            {"error": exc},
            extra={"spider": spider},
        )

    def entries(self, now: float | None = None) -> dict[str, SiteEntry]:
        """What this crawl learned, per domain it sent requests to, over what was known at open."""
        now = time.time() if now is None else now
        registry = health_registry(self.crawler)
        known = set(registry.domains()) if registry is not None else set()
        stats = self.crawler.stats
        out = {}
        for domain, f in self.figures.domains.items():
            if not f.requests or domain == OTHER:  # ("other": the domains past OPENCLAW_REPORT_MAX_DOMAINS)
                continue
            state = registry.state(domain) if registry is not None and domain in known else None
            banned = bool(stats.get_value(f"openclaw/ban/domain/{domain}", 0))
            resumed = registry.remembered.resumed_limit(domain) if isinstance(registry, HealthRegistry) else None
            out[domain] = learned(state, f, banned=banned, before=self.known.get(domain), now=now, resumed=resumed)
        return out

    def _save_in_background(self) -> None:
        if self._saving:
            return
        self._saving = True
        entries = self.entries()
        d = deferToThread(self.store.save, entries, None, dict(self.saved))
        d.addCallback(self.saved.update)  # (what was written: the next save counts from there)
        d.addErrback(
            lambda failure: logger.warning("Could not save the site memory: %(error)s", {"error": failure.value})
        )
        d.addBoth(lambda _: setattr(self, "_saving", False))

    async def spider_closed(self, spider: Spider) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        if self.store is None:
            return
        entries = self.entries()
        try:
            written = await maybe_deferred_to_future(deferToThread(self.store.save, entries, None, dict(self.saved)))
            self.saved.update(written)
        except Exception as exc:  # a full disk, Redis down: the crawl itself is done
            logger.error(
                "Could not save the site memory to %(store)s: %(error)s",
                {"store": self.store, "error": exc},
                extra={"spider": spider},
            )
            return
        self.crawler.stats.set_value(f"{STATS_PREFIX}/saved", len(entries))
        logger.info(
            "Site memory: %(n)d domain(s) saved to %(store)s (scrapy openclaw-sites list)",
            {"n": len(entries), "store": self.store},
            extra={"spider": spider},
        )
