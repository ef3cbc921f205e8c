"""Benchmark: a server that queues instead of refusing, found on defaults.

Most servers past their capacity do not answer 429: a fixed pool of workers
serves in turn and the rest wait in line, so pushing harder adds latency, not
throughput. The site (``presets.queueing_site``) is one host with 2 workers
and ~55 ms per answer (~36 pages/s at most), its root linking every page.
Plain Scrapy, careful Scrapy (AutoThrottle, whose signal is latency) and the
add-on on its defaults crawl it in the same run; from the server's record:

- ``pages_per_s``: 200 answers per second, first request to last answer,
  and ``vs_capacity``: that over what the workers can serve;
- ``wait_p50_ms`` / ``wait_p90_ms``: how long requests stood in the
  server's line (what a crawl costs the site beyond its own pages);
- ``max_in_flight``: the most requests at the server at once.

    python -m benchmarks.queueing [--quick]
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.suite import crawl_site, run_module
from scrapy_openclaw.testing.crawl import CrawlTimeout
from scrapy_openclaw.testing.presets import queueing_site

CAPACITY, LATENCY = 2, 0.05
PAGES, QUICK_PAGES = 600, 150
COMMON: dict[str, Any] = {"LOG_LEVEL": "INFO"}
CONFIGS: dict[str, dict[str, Any]] = {
    "scrapy": {},
    "scrapy_careful": {"AUTOTHROTTLE_ENABLED": True, "RETRY_TIMES": 10},
    "openclaw": {"ADDONS": {"scrapy_openclaw.Addon": 100}},
}


def measure(requests: list[dict[str, Any]], capacity_per_s: float) -> dict[str, Any]:
    """One crawl's numbers from the server's record of its requests."""
    if not requests:
        return {"pages": 0}
    ok = [r for r in requests if r["status"] == 200]
    span = max(r["end"] or r["t"] for r in requests) - requests[0]["t"]
    waits = sorted(r.get("wait", 0.0) for r in requests)
    rate = len(ok) / span if span > 0 else None
    return {
        "pages": len(ok),
        "seconds": round(span, 2),
        "pages_per_s": None if rate is None else round(rate, 2),
        "vs_capacity": None if rate is None else round(rate / capacity_per_s, 3),
        "wait_p50_ms": round(1000 * statistics.median(waits), 1),
        "wait_p90_ms": round(1000 * waits[int(0.9 * (len(waits) - 1))], 1),
    }


def one(name: str, settings: dict[str, Any], pages: int, out: Path, limit: float) -> dict[str, Any]:
    site = queueing_site(capacity=CAPACITY, latency=LATENCY, pages=pages)
    (host,) = site.hosts
    capacity_per_s = CAPACITY / (LATENCY * 1.1)  # (latency + a mean jitter of 10%)
    try:
        crawl = crawl_site(site, name, {**COMMON, **settings}, out, limit=limit, requests=True)
    except CrawlTimeout as exc:
        return {"error": str(exc)[:300]}
    truth = crawl.truth["hosts"][host.address]
    reason = crawl.result.stats.get("finish_reason")
    row = measure(truth["requests"], capacity_per_s)
    scraped = {item["url"] for item in crawl.result.items} & crawl.reachable
    row.update(
        {
            "finished": int(reason == "finished"),
            "max_in_flight": truth["max_in_flight"],
            "scraped_fraction": round(len(scraped) / len(crawl.reachable), 4) if crawl.reachable else None,
        }
    )
    return row


def run(quick: bool = False) -> dict[str, Any]:
    """``{"baseline": "scrapy", "configs": {name: {...}}}``, one crawl per configuration."""
    pages = QUICK_PAGES if quick else PAGES
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="openclaw-bench-queueing-") as tmp:
        for name, settings in CONFIGS.items():
            results[name] = one(name, settings, pages, Path(tmp), 90 if quick else 240)
    return {
        "baseline": "scrapy",
        "quick": quick,
        "capacity": CAPACITY,
        "latency": LATENCY,
        "pages": pages,
        "configs": results,
    }


def main() -> None:
    run_module(run)


if __name__ == "__main__":
    main()
