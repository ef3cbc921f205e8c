"""A distributed worker's memory in a broad crawl: RSS after 1,000 and after 100,000 domains.

    python -m benchmarks.workermemory [--quick]

Driven at registry level, not as a crawl (100,000 domains would take hours
of crawling; a push, pop and ack per domain too: six Redis round trips, ~10
minutes here): the worker's own ``RedisHealthRegistry`` and
``LeasedDeadlineQueue`` on a real redis-server, each domain ensured in Redis
and answered once (``record_success``), as a crawl does with a domain's page.
A fake clock moves 0.5 s per domain, the queue's timer runs every 20 domains
and its idle sweep as in a crawl (every ``OPENCLAW_HEALTH_IDLE_TTL`` / 4 at
most), so about
``IDLE_TTL`` / 0.5 domains are recent at any time. Measured: the process's
resident set (``/proc/self/statm``, what an operator sees) and the domains
the registry holds, at 1,000 and at 100,000 domains; once with the sweep
(``OPENCLAW_HEALTH_IDLE_TTL`` 300 s) and once without (0: never forget).
Target: RSS at 100,000 within 1.1x of RSS at 1,000 with the sweep.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from scrapy import Spider

DOMAINS, QUICK_DOMAINS = 100_000, 20_000
CHECKPOINTS = (1_000, 10_000, 50_000, 100_000)
STEP = 0.5  # fake seconds between two domains
IDLE_TTL = 300.0
TICK_EVERY = 20  # domains between two runs of the queue's timer (a crawl's poll interval)


class _Spider(Spider):
    name = "memory"


class _Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def rss_mb() -> float:
    """The process's resident set now (not its peak), in MB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def measure(
    redis_url: str, domains: int, idle_ttl: float, checkpoints: tuple[int, ...] = CHECKPOINTS
) -> dict[str, Any]:
    """One worker's queue and registry through *domains* domains (in this process)."""
    from scrapy.utils.reactor import install_reactor
    from scrapy.utils.test import get_crawler

    from scrapy_openclaw.distributed import serializer
    from scrapy_openclaw.distributed.connection import client_from_settings
    from scrapy_openclaw.distributed.queue import LeasedDeadlineQueue

    if "twisted.internet.reactor" not in sys.modules:  # (the queue's timer needs one; a test has its own)
        install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")
    clock = _Clock()
    crawler = get_crawler(
        _Spider,
        {
            "REDIS_URL": redis_url,
            "OPENCLAW_HEALTH_ENABLED": True,
            "OPENCLAW_HEALTH_IDLE_TTL": idle_ttl,
            "OPENCLAW_HEALTH_REGISTRY_CLASS": "scrapy_openclaw.distributed.health.RedisHealthRegistry",
        },
    )
    crawler.spider = _Spider.from_crawler(crawler)
    server = client_from_settings(crawler.settings)
    q = LeasedDeadlineQueue(server, crawler.spider, "%(spider)s:requests", serializer, clock=clock)
    reg = q.registry
    assert reg is not None
    rows: list[dict[str, Any]] = []
    start = rss_mb()
    try:
        for i in range(1, domains + 1):
            domain = f"d{i}.example"
            reg.ensure(domain)  # (what the queue's push does for a new domain)
            reg.record_success(domain, 0.05, now=clock())
            clock.now += STEP
            if i % TICK_EVERY == 0:
                q._tick()  # the queue's timer: heartbeat and, when due, the idle sweep
            if i in checkpoints:
                gc.collect()
                rows.append({"domains": i, "rss_mb": round(rss_mb(), 1), "held": len(reg.domains())})
    finally:
        q._loop.stop()
    return {
        "idle_ttl": idle_ttl,
        "rss_at_start_mb": round(start, 1),
        "points": rows,
        "evicted": int(crawler.stats.get_value("openclaw/health/evicted", 0)),
    }


def _child(redis_url: str, domains: int, idle_ttl: float) -> dict[str, Any]:
    """*measure* in a fresh process: one run's memory does not carry over into the next."""
    code = (
        "import json, sys; from benchmarks.workermemory import measure; "
        f"print(json.dumps(measure({redis_url!r}, {domains}, {idle_ttl})))"
    )
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _row(run: dict[str, Any]) -> dict[str, Any]:
    points = {p["domains"]: p for p in run["points"]}
    first, last = points[CHECKPOINTS[0]], run["points"][-1]
    return {
        "idle_ttl": run["idle_ttl"],
        "domains": last["domains"],
        "rss_at_start_mb": run["rss_at_start_mb"],
        "rss_at_1000_mb": first["rss_mb"],
        "rss_at_end_mb": last["rss_mb"],
        "rss_ratio": round(last["rss_mb"] / first["rss_mb"], 3),
        "held_at_1000": first["held"],
        "held_at_end": last["held"],
        "evicted": run["evicted"],
        "points": run["points"],
    }


def run(quick: bool = False) -> dict[str, Any]:
    """``{"tables": {"worker_memory": {"baseline": "never_forget", "configs": {...}}}}``."""
    from scrapy_openclaw.testing.servers import RedisServer

    domains = QUICK_DOMAINS if quick else DOMAINS
    configs = {}
    for name, ttl in (("idle_sweep", IDLE_TTL), ("never_forget", 0.0)):
        with RedisServer() as redis_server:  # an empty Redis for each
            configs[name] = _row(_child(redis_server.url, domains, ttl))
    return {"tables": {"worker_memory": {"baseline": "never_forget", "configs": configs}}}


if __name__ == "__main__":
    print(json.dumps(run(quick="--quick" in sys.argv), indent=2))
