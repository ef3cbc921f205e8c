"""Benchmark: a crawl of eighteen different sites (``presets.heterogeneous_site``), on defaults.

Healthy, slow, limited in four ways (a limit that drops and comes back, one that
rises, a bare 429, a 503 limiter), one refusing every third request whatever the pace,
flaky, with pages broken for good, and a blackhole host that accepts connections and
never answers. The limited hosts have pages for 40 s at their limits: the bound of the
fastest compliant crawl. The same ``DOWNLOAD_TIMEOUT`` (10 s) and ``CONCURRENT_REQUESTS``
(32) for every configuration. From the ground truth:

- ``wall_vs_bound``: first request to the last answer of a reachable page, over 40 s
  (target <= 1.1);
- ``scraped_fraction``: reachable pages scraped (the blackhole's and broken pages aside;
  target 1.0);
- ``limiter_share``: requests to the four limited hosts answered by their limiter
  (target <= 2%), and per limited host its worst phase (``<host>_min_phase_rate``);
- ``dead_letters_exact``: 1 when every page broken for good has exactly one dead letter
  (add-on runs only).

    python -m benchmarks.hetero [--quick]
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from benchmarks.phases import CONFIGS, flat_row, phase_figures
from benchmarks.suite import crawl_site, dead_letters, run_module
from scrapy_openclaw.testing.crawl import CrawlTimeout
from scrapy_openclaw.testing.presets import heterogeneous_site

COMMON: dict[str, Any] = {"LOG_LEVEL": "INFO", "DOWNLOAD_TIMEOUT": 10, "CONCURRENT_REQUESTS": 32}
LIMITED = {8: "dropping", 9: "rising", 10: "noretry", 11: "limiter503"}
BLACKHOLE = 17


def _one(name: str, settings: dict[str, Any], seconds: float, out: Path, limit: float) -> dict[str, Any]:
    site = heterogeneous_site(seconds=seconds)
    try:
        crawl = crawl_site(site, name, {**COMMON, **settings}, out, limit=limit, requests=True)
    except CrawlTimeout as exc:
        return {"error": str(exc)[:300]}
    truth = crawl.truth["hosts"]
    hole = site.hosts[BLACKHOLE].address
    reachable = {u for u in crawl.reachable if f"//{hole}:" not in u}
    scraped = {item["url"] for item in crawl.result.items} & reachable
    ends = [r["end"] for h in truth.values() for r in h["requests"] if r["end"] and str(r["status"]).startswith("2")]
    starts = [h["requests"][0]["t"] for h in truth.values() if h["requests"]]
    row: dict[str, Any] = {
        "returncode": crawl.result.returncode,
        "finished": int(crawl.result.stats.get("finish_reason") == "finished"),
        "seconds": round(crawl.seconds, 1),
        "wall_vs_bound": round((max(ends) - min(starts)) / seconds, 3) if ends and starts else None,
        "scraped_fraction": round(len(scraped) / len(reachable), 4) if reachable else None,
        "circuit_opened": crawl.result.stats.get("openclaw/health/circuit_opened", 0),
    }
    limited_requests = refused = 0
    for index, label in LIMITED.items():
        host = site.hosts[index]
        assert host.rate_limit is not None
        requests = truth[host.address]["requests"]
        limited_requests += len(requests)
        refused += sum(1 for r in requests if r["status"] == host.rate_limit.status)
        figures = flat_row(label, phase_figures(requests, crawl.truth["started_at"], host.rate_limit))
        row[f"{label}_min_phase_rate"] = figures[f"{label}_min_phase_rate"]
        row[f"{label}_max_phase_limiter"] = figures[f"{label}_max_phase_limiter"]
    row["limiter_share"] = round(refused / limited_requests, 4) if limited_requests else None
    letters = dead_letters(crawl)
    if letters is not None:
        broken = set(crawl.failing)
        row["dead_letters_exact"] = int(all(letters.get(u) == 1 for u in broken))
        row["dead_letters_on_good_pages"] = sum(1 for u in letters if u in reachable)
    return row


def run(quick: bool = False) -> dict[str, Any]:
    seconds, limit = (20.0, 90.0) if quick else (40.0, 150.0)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="openclaw-bench-hetero-") as tmp:
        for name, settings in CONFIGS.items():
            results[name] = _one(name, settings, seconds, Path(tmp), limit)
    return {"baseline": "scrapy", "quick": quick, "bound_s": seconds, "configs": results}


def main() -> None:
    run_module(run)


if __name__ == "__main__":
    main()
