"""Benchmark: some pages broken for good on an otherwise healthy site.

The site (``presets.mixed_failures_site``): two hosts of 200 pages; on the
second, every 5th page (never the root) always answers 503 and a few pages
404. That is the pages' trouble, not the domain's: a crawler should fetch
every reachable page at full speed and give the broken URLs up. Plain
Scrapy, careful Scrapy and the add-on on its defaults crawl it in the same
run; from the server's ground truth and the add-on's dead-letter file:

- ``scraped_fraction``: reachable pages scraped / reachable (target 1.0);
- ``failed_urls``: reachable URLs that fail for good; ``failed_requested``:
  how many of them the crawl asked for;
- ``dead_letter_urls`` / ``dead_letter_duplicates``: failed URLs with a dead
  letter, and records beyond one per URL (target: every failed URL once);
  ``dead_letters_on_good_pages``: dead letters for pages that work;
- ``seconds`` and ``seconds_over_scrapy`` (target: within 10 s);
- ``broken_host_health``: the add-on's final health of the second host.

    python -m benchmarks.mixed [--quick]
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from benchmarks.suite import crawl_site, dead_letters, run_module
from scrapy_openclaw.testing.crawl import CrawlTimeout
from scrapy_openclaw.testing.presets import address, mixed_failures_site

PAGES, QUICK_PAGES = 200, 60  # per host
LIMIT, QUICK_LIMIT = 120.0, 30.0  # CLOSESPIDER_TIMEOUT per crawl
BROKEN_HOST = address(1)

COMMON: dict[str, Any] = {"LOG_LEVEL": "INFO"}
CONFIGS: dict[str, dict[str, Any]] = {
    "scrapy": {},
    "scrapy_careful": {"AUTOTHROTTLE_ENABLED": True, "RETRY_TIMES": 10},
    "openclaw": {"ADDONS": {"scrapy_openclaw.Addon": 100}},
}


def requested_urls(truth: dict[str, Any]) -> set[str]:
    """Every URL the server was asked for (robots.txt included)."""
    return {h["base_url"].rstrip("/") + path for h in truth["hosts"].values() for path in h["counts"]}


def measure(crawl: Any) -> dict[str, Any]:
    result, ok, failing = crawl.result, crawl.reachable, crawl.failing
    scraped = {item["url"] for item in result.items}
    letters = dead_letters(crawl)
    health = result.stats.get(f"openclaw/health/final_health/{BROKEN_HOST}")
    row: dict[str, Any] = {
        "returncode": result.returncode,
        "finish_reason": result.stats.get("finish_reason"),
        "finished": int(result.stats.get("finish_reason") == "finished"),  # 0: stopped by the time limit
        "seconds": round(crawl.seconds, 1),
        "reachable": len(ok),
        "scraped": len(scraped & ok),
        "scraped_fraction": round(len(scraped & ok) / len(ok), 4) if ok else None,
        "failed_urls": len(failing),
        "failed_requested": len(failing & requested_urls(crawl.truth)),
        "requests_at_server": sum(h["total"] for h in crawl.truth["hosts"].values()),
        "broken_host_health": health,
    }
    if letters is not None:
        on_failed = {u: n for u, n in letters.items() if u in failing}
        row.update(
            {
                "dead_letter_urls": len(on_failed),
                "dead_letter_duplicates": sum(n - 1 for n in on_failed.values()),
                "dead_letters_per_failed_url": round(sum(on_failed.values()) / len(failing), 3) if failing else None,
                "dead_letters_on_good_pages": sum(n for u, n in letters.items() if u not in failing),
            }
        )
    if result.returncode != 0:
        row["log_tail"] = result.log[-1500:]
    return row


def one(name: str, settings: dict[str, Any], pages: int, out: Path, limit: float) -> dict[str, Any]:
    try:
        crawl = crawl_site(mixed_failures_site(pages=pages), name, {**COMMON, **settings}, out, limit=limit)
    except CrawlTimeout as exc:
        return {"error": str(exc)[:300]}
    return measure(crawl)


def with_differences(configs: dict[str, dict[str, Any]], baseline: str = "scrapy") -> dict[str, dict[str, Any]]:
    """Add ``seconds_over_<baseline>`` to every row that has seconds."""
    base = configs.get(baseline, {}).get("seconds")
    for row in configs.values():
        if base is not None and row.get("seconds") is not None:
            row[f"seconds_over_{baseline}"] = round(row["seconds"] - base, 1)
    return configs


def run(quick: bool = False) -> dict[str, Any]:
    """``{"baseline": "scrapy", "configs": {name: {...}}}``, one crawl per configuration."""
    pages = QUICK_PAGES if quick else PAGES
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="openclaw-bench-mixed-") as tmp:
        for name, settings in CONFIGS.items():
            results[name] = one(name, settings, pages, Path(tmp), QUICK_LIMIT if quick else LIMIT)
    return {
        "baseline": "scrapy",
        "quick": quick,
        "pages_per_host": pages,
        "broken_host": BROKEN_HOST,
        "configs": with_differences(results),
    }


def main() -> None:
    run_module(run)


if __name__ == "__main__":
    main()
