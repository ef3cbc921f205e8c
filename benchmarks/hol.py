"""Head-of-line blocking: 8 fast hosts and 2 slow ones (~1.5 s per page), three queues, one run.

For each of ScrapyPriorityQueue, DownloaderAwarePriorityQueue and
DeadlinePriorityQueue the same site is crawled with the same settings and
measured from the chaos server's ground truth (time of every request):

* ``total``: first request to the end of the last slow-host response, vs its
  lower bound: the slow hosts crawled alone (their own serial time);
* ``fast_done``: when the last fast-host page was fetched, vs the fast hosts
  crawled alone (no slow host present).

Targets: total <= 1.15 x lower bound, fast_done <= 1.2 x fast alone.
Run: ``python -m benchmarks.hol [--quick]``.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from scrapy_openclaw.testing.crawl import run_crawl
from scrapy_openclaw.testing.presets import hol_site
from scrapy_openclaw.testing.servers import ChaosServer

QUEUES = {
    "scrapy": "scrapy.pqueues.ScrapyPriorityQueue",
    "downloader_aware": "scrapy.pqueues.DownloaderAwarePriorityQueue",
    "deadline": "scrapy_openclaw.pqueues.DeadlinePriorityQueue",
}
FAST, SLOW, SLOW_LATENCY = 8, 2, 1.5
# Room for both: the slow hosts can use 2 x 8 places and the fast ones the rest.
SETTINGS = {"CONCURRENT_REQUESTS": 32, "CONCURRENT_REQUESTS_PER_DOMAIN": 8, "LOG_LEVEL": "INFO"}


def _measure(server: ChaosServer, hosts: list[str], queue: str, out: Path) -> dict[str, float]:
    server.reset()
    urls = [server.urls[h] for h in hosts]
    result = run_crawl(
        settings={**SETTINGS, "SCHEDULER_PRIORITY_QUEUE": queue},
        spider_args={"start_urls": urls},
        out_dir=out,
        timeout=600,
    )
    if result.stats.get("finish_reason") != "finished":
        raise RuntimeError(f"crawl with {queue} did not finish:\n{result.log[-2000:]}")
    truth = server.truth()["hosts"]
    latency = {h.address: h.latency for h in server.config.hosts}
    times = {h: [r["t"] for r in truth[h]["requests"]] for h in hosts if truth[h]["requests"]}
    t0 = min(min(ts) for ts in times.values())
    fast = [h for h in times if latency[h] < 0.5]
    return {
        "total": round(max(max(ts) + latency[h] for h, ts in times.items()) - t0, 3),
        "fast_done": round(max(max(times[h]) for h in fast) - t0, 3) if fast else 0.0,
        "pages": len(result.items),
        "elapsed": round(float(result.stats.get("elapsed_time_seconds", 0.0)), 3),
    }


def run(quick: bool = False) -> dict[str, Any]:
    pages = 20 if quick else 50
    config = hol_site(fast_hosts=FAST, slow_hosts=SLOW, slow_latency=SLOW_LATENCY, pages=pages)
    hosts = [h.address for h in config.hosts]
    fast_hosts, slow_hosts = hosts[:FAST], hosts[FAST:]
    # Scrapy's default queue (DownloaderAwarePriorityQueue) is the plain-Scrapy baseline.
    report: dict[str, Any] = {
        "baseline": "downloader_aware",
        "pages_per_host": pages,
        "settings": SETTINGS,
        "configs": {},
    }
    with ChaosServer(config) as server, tempfile.TemporaryDirectory(prefix="openclaw-hol-") as tmp:
        base = Path(tmp)
        # Baselines with the queue under test (alone, every queue behaves the same).
        slow_alone = _measure(server, slow_hosts, QUEUES["deadline"], base / "slow")["total"]
        fast_alone = _measure(server, fast_hosts, QUEUES["deadline"], base / "fast")["fast_done"]
        report["lower_bound_total"] = slow_alone
        report["fast_alone"] = fast_alone
        for name, path in QUEUES.items():
            m = _measure(server, hosts, path, base / name)
            m["total_vs_bound"] = round(m["total"] / slow_alone, 3)
            m["fast_vs_alone"] = round(m["fast_done"] / fast_alone, 3) if fast_alone else None
            report["configs"][name] = m
    ours = report["configs"]["deadline"]
    report["targets_met"] = {
        "total <= 1.15 x bound": ours["total_vs_bound"] <= 1.15,
        "fast_done <= 1.2 x fast alone": ours["fast_vs_alone"] is not None and ours["fast_vs_alone"] <= 1.2,
    }
    return report


if __name__ == "__main__":
    print(json.dumps(run(quick="--quick" in sys.argv), indent=1))
