"""HeapFreeze: keep the start-up heap out of the cyclic garbage collector's full collections.

The objects alive when the engine starts (modules, settings, components) live as
long as the crawl, yet every full collection scans them again: ~15% of a fast
crawl's CPU. ``gc.freeze()`` moves them to the permanent generation, until the
last crawl of the process stops (docs/heap-freeze.md).
"""

from __future__ import annotations

import gc
import logging
from typing import TYPE_CHECKING

from scrapy import signals
from scrapy.exceptions import NotConfigured

from scrapy_openclaw.settings import OpenClawSettings

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

STATS_KEY = "openclaw/gc/frozen_objects"

# Crawls of this process that froze the heap and have not stopped yet, and whether the first of
# them found nothing frozen (else the process froze its heap itself: it stays as it was found).
_freezers = 0
_unfreeze_at_end = True


class HeapFreeze:
    """Extension: ``gc.freeze()`` when the engine starts, ``gc.unfreeze()`` when the last one stops."""

    def __init__(self, crawler: Crawler):
        self.crawler = crawler
        self.frozen = False
        crawler.signals.connect(self.engine_started, signal=signals.engine_started)
        crawler.signals.connect(self.engine_stopped, signal=signals.engine_stopped)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> HeapFreeze:
        if not OpenClawSettings.for_crawler(crawler).gc_freeze:
            raise NotConfigured
        return cls(crawler)

    def engine_started(self) -> None:
        global _freezers, _unfreeze_at_end
        if _freezers == 0:
            _unfreeze_at_end = gc.get_freeze_count() == 0
        gc.collect()  # garbage of the start-up must not be frozen with it
        gc.freeze()
        _freezers += 1
        self.frozen = True
        count = gc.get_freeze_count()
        assert self.crawler.stats is not None
        self.crawler.stats.set_value(STATS_KEY, count)
        logger.debug("Froze %d start-up objects out of the GC's full collections (OPENCLAW_GC_FREEZE)", count)

    def engine_stopped(self) -> None:
        global _freezers
        if not self.frozen:
            return
        self.frozen = False
        _freezers -= 1
        if _freezers == 0 and _unfreeze_at_end:
            gc.unfreeze()
