"""RunStatsExtension: what a scheduled crawl tells its scheduler, written at close.

The scheduler enables it on the ``scrapy crawl`` command line together with
``OPENCLAW_SCHEDULE_RUN_FILE``; at ``spider_closed`` it writes that file
(atomically) with the crawl's stats, its finish reason and, for incremental
tasks, the spider's final ``openclaw_cursor``. It also decodes the cursor the
scheduler passed as JSON (see ``cursor.py`` for the contract).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import NotConfigured

from scrapy_openclaw.schedule.tasks import CURSOR_ARG

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)  # datetimes and the like


class RunStatsExtension:
    def __init__(self, crawler: Crawler, path: Path):
        self.crawler, self.path = crawler, path
        crawler.signals.connect(self.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(self.spider_closed, signal=signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> RunStatsExtension:
        path = crawler.settings.get("OPENCLAW_SCHEDULE_RUN_FILE")
        if not path:
            raise NotConfigured
        return cls(crawler, Path(path))

    def spider_opened(self, spider: Spider) -> None:
        raw = getattr(spider, CURSOR_ARG, None)
        if isinstance(raw, str):
            try:
                setattr(spider, CURSOR_ARG, json.loads(raw))
            except ValueError:
                logger.error("-a %(arg)s is not JSON: %(raw)r; the cursor stays a string",
                             {"arg": CURSOR_ARG, "raw": raw[:200]}, extra={"spider": spider})

    def spider_closed(self, spider: Spider, reason: str) -> None:
        data: dict[str, Any] = {
            "finish_reason": reason,
            "stats": _json_safe(self.crawler.stats.get_stats() if self.crawler.stats else {}),
        }
        if hasattr(spider, CURSOR_ARG):
            cursor = getattr(spider, CURSOR_ARG)
            try:
                json.dumps(cursor)
                data["cursor"] = cursor
            except (TypeError, ValueError):
                logger.error("spider.%(arg)s = %(value)r cannot be stored as JSON; the cursor is not updated",
                             {"arg": CURSOR_ARG, "value": cursor}, extra={"spider": spider})
                data["cursor_error"] = repr(cursor)[:200]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
