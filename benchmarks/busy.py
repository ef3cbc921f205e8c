"""Benchmark: the same crawls on a quiet machine and beside two CPU-hog processes.

A busy crawler must not read as a slow site. Each configuration (plain Scrapy,
the add-on on its defaults) crawls, first on a quiet machine and then with two
processes spinning beside it (``HOGS``), in the same run:

- the sweep's hosts (``sweep``: 12, 40 and 60 req/s): ``sweep_rate_after_5s_min_host``
  (2xx rate after each host's first 5 s over its limit, the worst host),
  ``sweep_share_429``, ``sweep_wall_vs_bound``;
- the rate-limited 3-host site (``ratelimit``: 10 req/s each):
  ``ratelimit_rate_after_5s``, ``ratelimit_share_429``;
- a healthy site (20 ms answers) crawled by a spider that holds its event loop
  0.4 s every 25 pages (``StallingSpider``): ``stall_seconds`` and, for the
  add-on, ``stall_rate_cuts`` (cuts of the site's rate; the site never slowed,
  so the target is 0) and ``stall_seen_s`` (the stalls the add-on measured).

Targets (busy vs quiet, add-on): at least 0.85 of each limit and no more 429s.

    python -m benchmarks.busy [--quick]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import ratelimit, sweep
from benchmarks.suite import run_module
from scrapy_openclaw.testing.chaos import ChaosConfig, HostConfig
from scrapy_openclaw.testing.crawl import CrawlTimeout, run_crawl
from scrapy_openclaw.testing.servers import ChaosServer, stop_process

HOGS = 2
LIMITS = (12, 40, 60)
CONFIGS = {"scrapy": {}, "openclaw": {"ADDONS": {"scrapy_openclaw.Addon": 100}}}


def _hogs(n: int) -> list[subprocess.Popen[bytes]]:
    spin = "import time\nend = time.monotonic() + 1800\nwhile time.monotonic() < end: pass"
    return [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(n)]


def _stalling(name: str, settings: dict[str, Any], out: Path, pages: int) -> dict[str, Any]:
    site = ChaosConfig(hosts=(HostConfig("127.0.0.2", pages=pages, links_per_page=20, latency=0.02),))
    server = ChaosServer(site).start()
    try:
        dlq = {"OPENCLAW_DLQ_URI": str(out / name / "stall-dead.jsonl")} if "ADDONS" in settings else {}
        started = time.monotonic()
        result = run_crawl(
            "scrapy_openclaw.testing.spiders.StallingSpider",
            settings={"LOG_LEVEL": "INFO", **dlq, **settings},
            spider_args={"start_urls": server.start_urls, "stall": 0.4, "every": 25},
            timeout=300,
            out_dir=out / name / "stall",
        )
        seconds = time.monotonic() - started
    finally:
        server.stop()
    stats = result.stats
    row: dict[str, Any] = {"stall_seconds": round(seconds, 1), "stall_items": len(result.items)}
    if dlq:
        row["stall_rate_cuts"] = sum(v for k, v in stats.items() if k.startswith("openclaw/health/rate_cuts/"))
        row["stall_seen_s"] = stats.get("openclaw/health/crawler_stalled_seconds")
    return row


def _measure(name: str, settings: dict[str, Any], quick: bool, out: Path) -> dict[str, Any]:
    row: dict[str, Any] = {}
    try:
        s = sweep.one(name, settings, LIMITS, sweep.QUICK_SECONDS if quick else 12.0, out, 60.0)
        row.update({f"sweep_{k}": s.get(k) for k in ("rate_after_5s_min_host", "share_429", "wall_vs_bound")})
        r = ratelimit._one(name, settings, quick, out)
        row.update(
            {"ratelimit_rate_after_5s": r.get("rate_2xx_fraction_after_5s"), "ratelimit_share_429": r.get("share_429")}
        )
        row.update(_stalling(name, settings, out, 150 if quick else 300))
    except CrawlTimeout as exc:
        row["error"] = str(exc)[:300]
    return row


def run(quick: bool = False) -> dict[str, Any]:
    """``{"baseline": "scrapy_quiet", "configs": {"<config>_<quiet|busy>": {...}}}`` (no "/": a
    name like ``openclaw/busy`` reads as a stats key in the docs)."""
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="openclaw-bench-busy-") as tmp:
        for load in ("quiet", "busy"):
            hogs = _hogs(HOGS) if load == "busy" else []
            try:
                for name, settings in CONFIGS.items():
                    key = f"{name}_{load}"
                    results[key] = _measure(key, settings, quick, Path(tmp))
            finally:
                for hog in hogs:
                    stop_process(hog)
    return {"baseline": "scrapy_quiet", "quick": quick, "hogs": HOGS, "limits": list(LIMITS), "configs": results}


def main() -> None:
    run_module(run)


if __name__ == "__main__":
    main()
