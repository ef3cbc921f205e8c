"""Redis cost of distributed mode: commands and Redis CPU per crawled page, one Redis vs a 3-node cluster.

    python -m benchmarks.rediscost [--quick]

``run(quick) -> dict``. For 1, 2 and 3 worker processes
(``benchmarks.distributed.Workers``, the add-on on defaults plus
scrapy-redis's RedisPipeline for the items) against a fault-free 6-host
chaos site, once on one ``redis-server`` and once on a 3-master Redis Cluster
(``RedisClusterServer``): ``INFO commandstats`` (reset before each run) and
``INFO cpu`` (used_cpu_user + used_cpu_sys, before/after) summed over the
nodes, divided by the pages crawled. ``queue_commands_per_page`` leaves out
the item pipeline's RPUSH (not ours). The numbers include start-up and the
idle polling of workers that wait for the last pages (about 6 s per worker).
``docs/redis-sizing.md`` turns them into a sizing estimate.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.distributed import RedisClusterServer, Workers, _site, client, ours, scraped_urls
from scrapy_openclaw.testing.servers import ChaosServer, RedisServer

PAGES, QUICK_PAGES = 300, 120  # per host
HOSTS = 6
WORKERS = (1, 2, 3)


def _node_urls(backend: Any) -> list[str]:
    return [n.url for n in backend.nodes] if isinstance(backend, RedisClusterServer) else [backend.url]


def _cpu(urls: list[str]) -> float:
    import redis

    total = 0.0
    for url in urls:
        with redis.Redis.from_url(url) as conn:
            info = conn.info("cpu")
            total += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return total


def _commands(urls: list[str]) -> dict[str, int]:
    import redis

    calls: dict[str, int] = {}
    for url in urls:
        with redis.Redis.from_url(url) as conn:
            for name, stat in conn.info("commandstats").items():
                cmd = name.removeprefix("cmdstat_")
                calls[cmd] = calls.get(cmd, 0) + int(stat["calls"])
    return calls


def _reset(urls: list[str]) -> None:
    import redis

    for url in urls:
        with redis.Redis.from_url(url) as conn:
            conn.flushall()
            conn.config_resetstat()


def measure(backend: Any, kind: str, workers: int, pages: int, tmp: Path) -> dict[str, Any]:
    urls = _node_urls(backend)
    with ChaosServer(_site(pages, hosts=HOSTS, latency=0.02)) as site:
        expected = len(site.reachable().ok)
        _reset(urls)
        cpu_before = _cpu(urls)
        started = time.monotonic()
        w = Workers(workers, ours(backend.url), site.start_urls, tmp / f"{kind}-{workers}")
        codes = w.wait(600)
        seconds = time.monotonic() - started
        cpu = _cpu(urls) - cpu_before
        calls = _commands(urls)
        crawled = len(scraped_urls(backend.url))
    calls.pop("config|resetstat", None)
    calls.pop("config", None)
    total = sum(calls.values())
    queue_calls = total - calls.get("rpush", 0)
    pages_done = max(1, crawled)
    return {
        "backend": kind,
        "workers": workers,
        "nodes": len(urls),
        "pages": crawled,
        "expected": expected,
        "exit_codes": codes,
        "seconds": round(seconds, 2),
        "pages_per_s": round(crawled / seconds, 1),
        "commands": total,
        "commands_per_page": round(total / pages_done, 2),
        "queue_commands_per_page": round(queue_calls / pages_done, 2),
        "evalsha_per_page": round(calls.get("evalsha", 0) / pages_done, 2),
        "redis_cpu_s": round(cpu, 3),
        "redis_cpu_ms_per_page": round(1000 * cpu / pages_done, 3),
        # every node's core saturated by this workload alone, load spread evenly over the nodes
        # (an upper bound; plan for half of it)
        "pages_per_s_cpu_bound": round(len(urls) * pages_done / cpu, 0) if cpu > 0 else None,
        "top_commands": dict(sorted(calls.items(), key=lambda kv: -kv[1])[:8]),
    }


def run(quick: bool = False) -> dict[str, Any]:
    """``{"tables": {"cost": {"baseline": "single_1_workers", "configs": {...}}}}``."""
    pages = QUICK_PAGES if quick else PAGES
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="openclaw-bench-rediscost-") as d:
        tmp = Path(d)
        with RedisServer() as single:
            for n in WORKERS:
                rows[f"single_{n}_workers"] = measure(single, "single", n, pages, tmp)
        with RedisClusterServer() as cluster:
            client(cluster.url).ping()
            for n in WORKERS:
                rows[f"cluster_{n}_workers"] = measure(cluster, "cluster", n, pages, tmp)
    return {"tables": {"cost": {"baseline": "single_1_workers", "configs": rows}}}


if __name__ == "__main__":
    print(json.dumps(run("--quick" in sys.argv), indent=1))
