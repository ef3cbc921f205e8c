"""Benchmark: 429s that carry no rate information (every third request refused, whatever the pace).

One host (``presets.every_nth_site``) answering 429 + ``Retry-After: 1`` to every third
request however slowly it is asked, each answer after ~1 s, 400 pages linked from its
root (quick: 120). The issue's server (400 pages, plain Scrapy 354 s) is scaled down to
a 1 s answer so that plain Scrapy needs about 80 s. Slowing down does not lower the
share of 429s, so they are no rate signal: the target is a crawl time at most 1.1 x
plain Scrapy's (``seconds_vs_scrapy``) with every page scraped (``scraped_fraction``).

Two figures say where a gap to plain Scrapy comes from: ``max_in_flight`` and
``mean_in_flight`` (requests open at the server at once: Scrapy 2.19's downloader starts
every request queued in a slot before any counts as transferring, so plain Scrapy exceeds
its ``CONCURRENT_REQUESTS_PER_DOMAIN`` of 8; the add-on keeps it), and
``seconds_per_page_vs_scrapy`` (the span per page scraped: plain Scrapy gives up on the
pages refused three times, the add-on fetches them).

    python -m benchmarks.every3rd [--quick]
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from benchmarks.phases import COMMON, CONFIGS
from benchmarks.suite import crawl_site, run_module
from scrapy_openclaw.testing.crawl import CrawlTimeout
from scrapy_openclaw.testing.presets import every_nth_site


def _one(name: str, settings: dict[str, Any], pages: int, out: Path, limit: float) -> dict[str, Any]:
    site = every_nth_site(pages=pages)
    try:
        crawl = crawl_site(site, name, {**COMMON, **settings}, out, limit=limit, requests=True)
    except CrawlTimeout as exc:
        return {"error": str(exc)[:300]}
    requests = crawl.truth["hosts"][site.hosts[0].address]["requests"]
    scraped = {item["url"] for item in crawl.result.items} & crawl.reachable
    stats = crawl.result.stats
    return {
        "returncode": crawl.result.returncode,
        "finished": int(stats.get("finish_reason") == "finished"),
        "seconds": round(crawl.seconds, 1),
        "span_s": round(max(r["end"] or r["t"] for r in requests) - requests[0]["t"], 1) if requests else None,
        "requests_at_server": len(requests),
        "share_429": round(sum(1 for r in requests if r["status"] == 429) / len(requests), 4) if requests else None,
        "scraped_fraction": round(len(scraped) / len(crawl.reachable), 4) if crawl.reachable else None,
        "circuit_opened": stats.get("openclaw/health/circuit_opened", 0),
        "max_in_flight": crawl.truth["hosts"][site.hosts[0].address]["max_in_flight"],
        "mean_in_flight": _mean_in_flight(requests),
        "pages_scraped": len(scraped),
    }


def _mean_in_flight(requests: list[dict[str, Any]]) -> float | None:
    """Requests open at the server, averaged over the crawl's span (the sum of their durations
    over the span: Little's law)."""
    ended = [r for r in requests if r["end"]]
    if not ended:
        return None
    span = max(r["end"] for r in ended) - min(r["t"] for r in ended)
    return round(sum(r["end"] - r["t"] for r in ended) / span, 2) if span > 0 else None


def run(quick: bool = False) -> dict[str, Any]:
    pages, limit = (120, 120.0) if quick else (400, 400.0)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="openclaw-bench-every3rd-") as tmp:
        for name, settings in CONFIGS.items():
            results[name] = _one(name, settings, pages, Path(tmp), limit)
    base, base_pages = results["scrapy"].get("span_s"), results["scrapy"].get("pages_scraped")
    for row in results.values():
        if base and row.get("span_s"):
            row["seconds_vs_scrapy"] = round(row["span_s"] / base, 3)
            if base_pages and row.get("pages_scraped"):
                row["seconds_per_page_vs_scrapy"] = round(row["span_s"] / row["pages_scraped"] / (base / base_pages), 3)
    return {"baseline": "scrapy", "quick": quick, "pages": pages, "configs": results}


def main() -> None:
    run_module(run)


if __name__ == "__main__":
    main()
