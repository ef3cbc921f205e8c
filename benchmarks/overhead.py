"""Benchmark: what scrapy-openclaw costs on a site that needs none of it.

A fault-free, zero-latency chaos site (4 hosts x N pages) is crawled once per
configuration, in the same run, each on a freshly started site:

* ``scrapy``: plain Scrapy defaults;
* ``openclaw``: the add-on with its per-domain rate ceiling lifted out of the
  way (``base_rate``/``initial_rate`` very high, a large burst), so what is
  left is the cost of the code itself: middlewares, deadline queue, DLQ
  pipeline, metrics, health bookkeeping. The target is >= 0.95 x plain
  Scrapy's pages/s;
* ``openclaw_defaults``: the add-on exactly as shipped, whose politeness
  ceiling (``base_rate``, 20 req/s per domain by default, starting at
  ``initial_rate``) is *meant* to hold a crawl below what a fast site would
  take; shown so nobody mistakes that ceiling for overhead.

Pages/s comes from the server's ground truth (pages served with 200 over the
span from the first to the last request), so process start-up and shutdown
do not blur it; ``wall_s`` is the whole crawl subprocess, start to exit.
Peak memory is the crawl process's own maximum RSS (``os.wait4``'s rusage
for exactly that child). Correctness is checked too: every reachable page
must be scraped exactly once.

    python -m benchmarks.overhead [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from scrapy_openclaw.testing.crawl import DEFAULT_SPIDER, read_result, start_crawl
from scrapy_openclaw.testing.presets import fault_free_site
from scrapy_openclaw.testing.servers import ChaosServer

HOSTS = 4
PAGES = 500  # per host; 2,000 pages in all (a few seconds of crawling at full speed)
QUICK_PAGES = 60
TIMEOUT = 240.0  # per crawl

COMMON: dict[str, Any] = {"LOG_LEVEL": "INFO"}
_UNCAPPED = {"defaults": {"health": {"base_rate": 10000.0, "initial_rate": 10000.0, "burst": 10000}}}
CONFIGS: dict[str, dict[str, Any]] = {
    "scrapy": {},
    "openclaw": {"ADDONS": {"scrapy_openclaw.Addon": 100}, "OPENCLAW_POLICY": _UNCAPPED},
    "openclaw_defaults": {"ADDONS": {"scrapy_openclaw.Addon": 100}},
}
BASELINE = "scrapy"


def wait_with_rusage(proc: subprocess.Popen[bytes], timeout: float) -> tuple[int, int, bool]:
    """Reap ``proc`` ourselves to read its own rusage: ``(returncode, max RSS in KiB, timed_out)``.

    ``RUSAGE_CHILDREN`` would mix in every other child of this process (the
    chaos server, earlier crawls); ``wait4`` on the pid gives exactly this one.
    """
    deadline = time.monotonic() + timeout
    timed_out = False
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline:
            timed_out = True
            proc.kill()
            pid, status, usage = os.wait4(proc.pid, 0)
            break
        time.sleep(0.05)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_maxrss, timed_out


def crawl_once(name: str, settings: dict[str, Any], pages: int, work: Path) -> dict[str, Any]:
    """One crawl of a fresh fault-free site; numbers from the server and Scrapy's stats."""
    out = work / name
    merged = {**COMMON, **settings}
    if "ADDONS" in settings:  # dead letters (there should be none) stay in the scratch directory
        merged["OPENCLAW_DLQ_URI"] = str(out / "deadletters.jsonl")
    with ChaosServer(fault_free_site(n_hosts=HOSTS, pages=pages, links_per_page="all")) as server:
        reachable = server.reachable().ok
        started = time.monotonic()
        proc = start_crawl(DEFAULT_SPIDER, merged, {"start_urls": server.start_urls}, out_dir=out)
        returncode, max_rss_kib, timed_out = wait_with_rusage(proc, TIMEOUT)
        wall = time.monotonic() - started
        truth = server.truth()
    result = read_result(out, returncode)
    times = [r["t"] for h in truth["hosts"].values() for r in h["requests"]]
    ok_served = sum(1 for h in truth["hosts"].values() for r in h["requests"] if r["status"] == 200)
    span = (max(times) - min(times)) if len(times) > 1 else 0.0
    scraped = [item["url"] for item in result.items]
    row: dict[str, Any] = {
        "pages_per_s": round(ok_served / span, 1) if span > 0 else None,
        "wall_s": round(wall, 2),
        "crawl_span_s": round(span, 3),
        "peak_rss_mb": round(max_rss_kib / 1024, 1),
        "reachable": len(reachable),
        "scraped": len(set(scraped) & reachable),
        "duplicates": len(scraped) - len(set(scraped)),
        "requests_at_server": len(times),
        "scrapy_elapsed_s": result.stats.get("elapsed_time_seconds"),
        "finish_reason": result.stats.get("finish_reason"),
        "returncode": returncode,
    }
    if timed_out or returncode != 0 or row["scraped"] != len(reachable):
        row["error"] = "timed out" if timed_out else f"exit {returncode}, scraped {row['scraped']}/{len(reachable)}"
        row["log_tail"] = result.log[-1500:]
    return row


def run(quick: bool = False) -> dict[str, Any]:
    """Crawl the fast site once per configuration (in ``CONFIGS`` order)."""
    pages = QUICK_PAGES if quick else PAGES
    report: dict[str, Any] = {"hosts": HOSTS, "pages_per_host": pages, "baseline": BASELINE, "configs": {}}
    with tempfile.TemporaryDirectory(prefix="openclaw-bench-overhead-") as tmp:
        for name, settings in CONFIGS.items():
            report["configs"][name] = crawl_once(name, settings, pages, Path(tmp))
    base = report["configs"][BASELINE].get("pages_per_s")
    ours = report["configs"]["openclaw"].get("pages_per_s")
    report["ratio_pages_per_s"] = round(ours / base, 3) if base and ours else None
    report["target_met"] = {"openclaw >= 0.95 x scrapy pages/s": bool(
        report["ratio_pages_per_s"] is not None and report["ratio_pages_per_s"] >= 0.95)}
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(json.dumps(run(args.quick), indent=1))


if __name__ == "__main__":
    main()
