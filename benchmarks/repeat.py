"""Benchmark: the same rate-limited site crawled twice, site memory on vs off, beside plain Scrapy.

Two sites: the 3-host 10 req/s site of ``ratelimit`` (burst 5, 429 +
``Retry-After: 1`` beyond it) and the limit sweep's hosts (3, 12 and 40 req/s).
Each configuration crawls a site twice in a row (a fresh server each time, the
same hosts); the add-on keeps its site memory in a file between the two crawls
(``OPENCLAW_SITES_PATH``), or has it switched off. Reported per crawl, from the
server's ground truth:

- ``first_429_max_host`` / ``second_429_max_host``: the most 429s any host
  answered in the first / second crawl (the goal: at most 1 in the second);
- ``first_429_hosts`` / ``second_429_hosts``: those counts per host, in host order;
- ``first_vs_bound`` / ``second_vs_bound``: the slowest host's first request to
  last answer, over the time a compliant client needs for its pages at its
  limit (``presets.limit_seconds``; the goal: within 5% of it, 1.05);
- ``second_scraped_fraction``: pages scraped / pages reachable in the second crawl.

    python -m benchmarks.repeat [--quick]
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from benchmarks.suite import crawl_site, run_module
from scrapy_openclaw.testing.chaos import RateLimit
from scrapy_openclaw.testing.crawl import CrawlTimeout
from scrapy_openclaw.testing.presets import limit_seconds, limit_sweep_site, rate_limited_site

RATE, BURST, HOSTS = 10.0, 5, 3
SWEEP_LIMITS = (3, 12, 40)
COMMON: dict[str, Any] = {"LOG_LEVEL": "INFO", "CONCURRENT_REQUESTS": 16}
ADDON = {"ADDONS": {"scrapy_openclaw.Addon": 100}, "OPENCLAW_REPORT_ENABLED": False}
CONFIGS: dict[str, dict[str, Any]] = {
    "scrapy": {},
    "openclaw_memory_off": {**ADDON, "OPENCLAW_SITES_ENABLED": False},
    "openclaw_memory_on": {**ADDON, "OPENCLAW_SITES_ENABLED": True},
}


def sites(quick: bool) -> dict[str, Any]:
    return {
        "ratelimit": rate_limited_site(n_hosts=HOSTS, rate=RATE, burst=BURST, pages=100 if quick else 300),
        "sweep": limit_sweep_site(limits=SWEEP_LIMITS, seconds=8.0 if quick else 20.0),
    }


def crawl_numbers(crawl: Any, site: Any) -> dict[str, Any]:
    """One crawl's 429s per host and its slowest host's time over the bound."""
    counts, ratios = [], []
    for host in site.hosts:
        requests = [r for r in crawl.truth["hosts"][host.address]["requests"] if r["path"] != "/robots.txt"]
        counts.append(sum(1 for r in requests if r["status"] == 429))
        limit = host.rate_limit or RateLimit(rate=RATE, burst=BURST)
        pages = len({r["path"] for r in requests if str(r["status"]).startswith("2")})
        bound = limit_seconds(limit, pages)
        ends = [r["end"] or r["t"] for r in requests]
        if requests and bound > 0:
            ratios.append((max(ends) - requests[0]["t"]) / bound)
    scraped = {item["url"] for item in crawl.result.items} & crawl.reachable
    return {
        "finish_reason": crawl.result.stats.get("finish_reason"),
        "429_hosts": counts,
        "429_max_host": max(counts),
        "vs_bound": round(max(ratios), 3) if ratios else None,
        "scraped_fraction": round(len(scraped) / len(crawl.reachable), 4) if crawl.reachable else None,
    }


def _twice(name: str, settings: dict[str, Any], site: Any, quick: bool, out: Path) -> dict[str, Any]:
    row: dict[str, Any] = {}
    store = out / name / "sites.json"
    for which in ("first", "second"):
        merged = {**COMMON, **settings, "OPENCLAW_SITES_PATH": str(store)} if "ADDONS" in settings else COMMON
        try:
            crawl = crawl_site(site, f"{name}-{which}", merged, out, limit=120 if quick else 300, requests=True)
        except CrawlTimeout as exc:
            return {"error": str(exc)[:300]}
        for key, value in crawl_numbers(crawl, site).items():
            row[f"{which}_{key}"] = value
    return row


def run(quick: bool) -> dict[str, Any]:
    """Each site crawled twice per configuration: ``{"tables": {site: {"baseline", "configs"}}}``."""
    tables: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="openclaw-bench-repeat-") as tmp:
        for site_name, site in sites(quick).items():
            configs = {name: _twice(name, s, site, quick, Path(tmp) / site_name) for name, s in CONFIGS.items()}
            tables[site_name] = {"baseline": "scrapy", "configs": configs}
    return {"quick": quick, "tables": tables}


def main() -> None:
    run_module(run)


if __name__ == "__main__":
    main()
