"""Benchmark: two healthy hosts beside two dead ones.

Start URLs: the roots of two healthy chaos hosts, 40 pages on a host that
refuses connections (a loopback port where nothing listens) and 40 on a
name that does not resolve (``dead.test``, failed by the tests' own
resolver, so no query reaches the system DNS; every configuration uses it).
Plain Scrapy, careful Scrapy and the add-on on its defaults crawl it in the
same run:

- ``seconds`` and ``seconds_over_scrapy`` (target: within 20 s);
- ``dead_letter_urls`` / ``dead_letter_duplicates``: the 80 dead URLs with a
  dead letter, and records beyond one per URL (target: all 80, once each);
- ``scraped_fraction``: reachable pages of the healthy hosts scraped;
- ``finished``: 1 when the crawl ended by itself, 0 when the time limit
  closed it, ``killed_after_s`` when even closing did not end it (careful
  Scrapy: AutoThrottle keeps its 5 s start delay on a host that never
  answers, so 11 attempts of 40 URLs take many minutes, and closing waits
  for every request already queued in a download slot);
- ``dead_attempts``: download attempts that failed (Scrapy's
  ``downloader/exception_count``; the healthy hosts raise none).

    python -m benchmarks.deadhosts [--quick]
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from benchmarks.mixed import with_differences
from benchmarks.suite import crawl_site, dead_letters, run_module
from scrapy_openclaw.testing.crawl import CrawlTimeout
from scrapy_openclaw.testing.presets import UNRESOLVABLE_HOST, fault_free_site, page_urls
from scrapy_openclaw.testing.resolver import resolver_settings
from scrapy_openclaw.testing.servers import refused_base_url

DEAD_URLS = 40  # per dead host
PAGES, QUICK_PAGES = 100, 30  # per healthy host
# CLOSESPIDER_TIMEOUT per crawl, then GRACE more seconds before the crawl is killed. Closing waits
# for the requests queued in the download slots: with AutoThrottle's 5 s start delay on the dead
# slots (no response ever lowers it), careful Scrapy needs over a minute to drain them.
LIMIT, QUICK_LIMIT = 120.0, 12.0
GRACE, QUICK_GRACE = 60.0, 15.0
REFUSED_ADDRESS = "127.0.0.254"  # never a chaos host (they count up from 127.0.0.2)

COMMON: dict[str, Any] = {"LOG_LEVEL": "INFO", **resolver_settings({UNRESOLVABLE_HOST: None})}
CONFIGS: dict[str, dict[str, Any]] = {
    "scrapy": {},
    "scrapy_careful": {"AUTOTHROTTLE_ENABLED": True, "RETRY_TIMES": 10},
    "openclaw": {"ADDONS": {"scrapy_openclaw.Addon": 100}},
}


def one(
    name: str,
    settings: dict[str, Any],
    pages: int,
    out: Path,
    limit: float,
    dead_per_host: int = DEAD_URLS,
    grace: float = GRACE,
) -> dict[str, Any]:
    dead = page_urls(refused_base_url(REFUSED_ADDRESS), dead_per_host)
    dead += page_urls(f"http://{UNRESOLVABLE_HOST}/", dead_per_host)
    site = fault_free_site(n_hosts=2, pages=pages)
    try:
        crawl = crawl_site(site, name, {**COMMON, **settings}, out, limit=limit, extra_start_urls=dead, grace=grace)
    except CrawlTimeout as exc:  # not even closing ended: a result in itself, not a broken benchmark
        return {"finished": 0, "killed_after_s": limit + grace, "seconds": None, "note": str(exc)[:300]}
    result, ok = crawl.result, crawl.reachable
    scraped = {item["url"] for item in result.items} & ok
    row: dict[str, Any] = {
        "returncode": result.returncode,
        "finish_reason": result.stats.get("finish_reason"),
        "finished": int(result.stats.get("finish_reason") == "finished"),  # 0: stopped by the time limit
        "seconds": round(crawl.seconds, 1),
        "reachable": len(ok),
        "scraped_fraction": round(len(scraped) / len(ok), 4) if ok else None,
        "dead_urls": len(dead),
        "dead_attempts": result.stats.get("downloader/exception_count", 0),
    }
    letters = dead_letters(crawl)
    if letters is not None:
        on_dead = {u: letters[u] for u in dead if letters[u]}
        row.update(
            {
                "dead_letter_urls": len(on_dead),
                "dead_letter_duplicates": sum(n - 1 for n in on_dead.values()),
                "dead_letters_on_good_pages": sum(n for u, n in letters.items() if u not in on_dead),
            }
        )
    if result.returncode != 0:
        row["log_tail"] = result.log[-1500:]
    return row


def run(quick: bool = False) -> dict[str, Any]:
    """``{"baseline": "scrapy", "configs": {name: {...}}}``, one crawl per configuration."""
    pages = QUICK_PAGES if quick else PAGES
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="openclaw-bench-deadhosts-") as tmp:
        for name, settings in CONFIGS.items():
            results[name] = one(
                name, settings, pages, Path(tmp), QUICK_LIMIT if quick else LIMIT, grace=QUICK_GRACE if quick else GRACE
            )
    return {
        "baseline": "scrapy",
        "quick": quick,
        "pages_per_host": pages,
        "dead_urls_per_host": DEAD_URLS,
        "configs": with_differences(results),
    }


def main() -> None:
    run_module(run)


if __name__ == "__main__":
    main()
