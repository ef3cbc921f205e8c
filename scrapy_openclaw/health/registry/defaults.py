"""The registry's defaults from the project's Scrapy settings, so that they keep their meaning."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from scrapy_openclaw.settings import OpenClawSettings

if TYPE_CHECKING:
    from scrapy.crawler import Crawler


def scrapy_limits(crawler: Crawler) -> dict[str, Any]:
    """The registry's defaults from the project's Scrapy settings: the per-domain
    (or per-IP) concurrency, and the rate ``DOWNLOAD_DELAY`` allows."""
    settings = crawler.settings
    per_ip = int(settings["CONCURRENT_REQUESTS_PER_IP"] or 0)  # ([]: getint warns that it is deprecated)
    delay = settings.getfloat("DOWNLOAD_DELAY")
    return {
        "default_concurrency": per_ip or settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN"),
        "reported_rate_cap": 1.0 / delay if delay > 0 else math.inf,
        "idle_ttl": OpenClawSettings.for_crawler(crawler).health_idle_ttl,
    }
