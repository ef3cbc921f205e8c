"""Benchmark: success rate on a flaky 4-host site, plain Scrapy vs a careful user vs scrapy-openclaw.

The site (``presets.flaky_site``): 503 windows ~30% of the time (staggered
per host), ~3% dropped connections and ~2% hangs, two 404 pages and two
pages that fail to parse once per host. Success rate = pages scraped /
pages reachable from the start URLs (ground truth; 404 pages excluded,
parse-fail pages included since they recover). Each configuration crawls a
freshly started site with the same seed, in the same run.

    python -m benchmarks.flaky [--quick]
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from benchmarks.suite import crawl_site, run_module
from scrapy_openclaw.testing.crawl import CrawlTimeout
from scrapy_openclaw.testing.presets import flaky_site

# Same for everybody: hangs must not cost Scrapy's default 180 s.
COMMON = {"DOWNLOAD_TIMEOUT": 5, "LOG_LEVEL": "INFO", "CONCURRENT_REQUESTS": 16}

CONFIGS: dict[str, dict[str, Any]] = {
    "scrapy": {},
    # what a careful user would set: AutoThrottle and more retries
    "scrapy_careful": {"AUTOTHROTTLE_ENABLED": True, "RETRY_TIMES": 10},
    "openclaw": {"ADDONS": {"scrapy_openclaw.Addon": 100}},
    # the retry middlewares alone (no health, no deadline queue): what retry itself buys
    "openclaw_retry_only": {
        "DOWNLOADER_MIDDLEWARES": {
            "scrapy_openclaw.retry.ClassifiedRetryMiddleware": 550,
            "scrapy.downloadermiddlewares.retry.RetryMiddleware": None,
        },
        "SPIDER_MIDDLEWARES": {"scrapy_openclaw.retry.ParseRetryMiddleware": 45},
    },
}


def _one(name: str, settings: dict[str, Any], quick: bool, out: Path) -> dict[str, Any]:
    site = flaky_site(n_hosts=4, pages=20 if quick else 50, period=6.0 if quick else 10.0)
    try:
        crawl = crawl_site(site, name, {**COMMON, **settings}, out, limit=60 if quick else 300)
    except CrawlTimeout as exc:
        return {"error": str(exc)[:300]}
    result, ok, truth, elapsed = crawl.result, crawl.reachable, crawl.truth, crawl.seconds
    scraped = {item["url"] for item in result.items}
    stats = result.stats
    return {
        "returncode": result.returncode,
        "reachable": len(ok),
        "scraped": len(scraped & ok),
        "success_rate": round(len(scraped & ok) / len(ok), 4) if ok else None,
        "duplicates": len(result.items) - len(scraped),
        "requests_at_server": sum(h["total"] for h in truth["hosts"].values()),
        "seconds": round(elapsed, 1),
        "finish_reason": stats.get("finish_reason"),
        "retries": stats.get("retry/count", 0)
        + sum(v for k, v in stats.items() if k.startswith("openclaw/retry/") and k.endswith("/count")),
        "dead_letters": stats.get("openclaw/retry/dead_letters", 0),
        "log_tail": None if result.returncode == 0 else result.log[-1500:],
    }


def run(quick: bool) -> dict[str, Any]:
    """Crawl the flaky site once per configuration: ``{"baseline": "scrapy", "configs": {name: {...}}}``."""
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="openclaw-bench-flaky-") as tmp:
        out = Path(tmp)
        for name, settings in CONFIGS.items():
            results[name] = _one(name, settings, quick, out)
    for res in results.values():
        if not res.get("log_tail"):
            res.pop("log_tail", None)
    return {"baseline": "scrapy", "quick": quick, "configs": results}


def main() -> None:
    run_module(run)


if __name__ == "__main__":
    main()
