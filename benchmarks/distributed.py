"""Distributed mode vs plain scrapy-redis: scaling, worker kill, combined per-domain rate.

    python benchmarks/distributed.py [--quick]

``run(quick) -> dict``. Every scenario runs real worker processes
(``scrapy_openclaw.testing.runcrawl``) against a real redis-server and the
chaos site; items go to Redis (scrapy-redis's RedisPipeline), so a killed
worker loses no already-written output.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# run as a script, benchmarks/ is sys.path[0]: its siblings (e.g. queue.py) must not shadow the stdlib
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "benchmarks"]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from scrapy_openclaw.testing.servers import ChaosServer, RedisServer, subprocess_env  # noqa: E402

SPIDER = "tests.distributed_spiders.WorkerChaosSpider"


def ours(redis_url: str, *, rate: float = 200.0, burst: int = 20, lease: float = 3.0) -> dict[str, Any]:
    policy = {"defaults": {"health": {"initial_rate": rate, "base_rate": rate, "burst": burst,
                                      "base_concurrency": 16}}}
    return {
        "ADDONS": {"scrapy_openclaw.Addon": 100},
        "OPENCLAW_DISTRIBUTED": True,
        "REDIS_URL": redis_url,
        "OPENCLAW_DISTRIBUTED_LEASE": lease,
        "OPENCLAW_DISTRIBUTED_HEARTBEAT": 0.5,
        "OPENCLAW_POLICY": policy,
        "ITEM_PIPELINES": {"scrapy_redis.pipelines.RedisPipeline": 900},
        "CONCURRENT_REQUESTS": 8,
        "LOG_LEVEL": "INFO",
    }


def plain(redis_url: str, *, delay: float = 0.0) -> dict[str, Any]:
    """Stock scrapy-redis: its scheduler, dupefilter, pickle; per-worker DOWNLOAD_DELAY."""
    return {
        "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
        "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter",
        "SCHEDULER_PERSIST": True,
        "REDIS_URL": redis_url,
        "ITEM_PIPELINES": {"scrapy_redis.pipelines.RedisPipeline": 900},
        "DOWNLOAD_DELAY": delay,
        "RANDOMIZE_DOWNLOAD_DELAY": False,
        "CONCURRENT_REQUESTS": 8,
        "LOG_LEVEL": "INFO",
    }


class Workers:
    """N crawl subprocesses; the first one gets the start URLs."""

    def __init__(self, n: int, settings: dict[str, Any], start_urls: list[str], out: Path):
        self.procs: list[subprocess.Popen[bytes]] = []
        self.outs: list[Path] = []
        out.mkdir(parents=True, exist_ok=True)
        cfg = out / "settings.json"
        cfg.write_text(json.dumps(settings), encoding="utf-8")
        for i in range(n):
            wout = out / f"w{i}"
            args = [sys.executable, "-m", "scrapy_openclaw.testing.runcrawl", "--spider", SPIDER,
                    "--settings-json", str(cfg), "--out", str(wout)]
            if i == 0:
                args += ["-a", "start_urls=" + ",".join(start_urls)]
            self.procs.append(subprocess.Popen(args, cwd=ROOT, env=subprocess_env(),
                                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            self.outs.append(wout)

    def kill(self, i: int) -> None:
        os.kill(self.procs[i].pid, signal.SIGKILL)
        self.procs[i].wait()

    def wait(self, timeout: float) -> list[int | None]:
        deadline = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        return [p.returncode for p in self.procs]

    def stats(self, i: int) -> dict[str, Any]:
        path = self.outs[i] / "stats.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def log(self, i: int) -> str:
        path = self.outs[i] / "crawl.log"
        return path.read_text(errors="replace") if path.exists() else ""


def scraped_urls(redis_url: str, key: str = "chaos:items") -> Counter[str]:
    import redis

    client = redis.Redis.from_url(redis_url)
    return Counter(json.loads(raw)["url"] for raw in client.lrange(key, 0, -1))


def wait_for_items(redis_url: str, n: int, timeout: float, key: str = "chaos:items") -> int:
    import redis

    client = redis.Redis.from_url(redis_url)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        have = client.llen(key)
        if have >= n:
            return have
        time.sleep(0.05)
    return client.llen(key)


def _site(pages: int, hosts: int = 2, latency: float = 0.05, rate_limit: dict | None = None) -> dict[str, Any]:
    from scrapy_openclaw.testing.presets import fault_free_site

    cfg = fault_free_site(n_hosts=hosts, pages=pages, links_per_page=4).to_dict()
    for h in cfg["hosts"]:
        h["latency"] = latency
        if rate_limit:
            h["rate_limit"] = rate_limit
    return cfg


def scenario_scaling(n: int, pages: int, tmp: Path) -> dict[str, Any]:
    with ChaosServer(_site(pages)) as site, RedisServer() as redis_server:
        t0 = time.monotonic()
        w = Workers(n, ours(redis_server.url), site.start_urls, tmp / f"scale{n}")
        codes = w.wait(300)
        elapsed = time.monotonic() - t0
        urls = scraped_urls(redis_server.url)
        expected = len(site.reachable().ok)
    return {"workers": n, "seconds": round(elapsed, 2), "pages": sum(urls.values()),
            "unique": len(urls), "expected": expected, "exit_codes": codes}


def scenario_kill(kind: str, pages: int, tmp: Path) -> dict[str, Any]:
    """3 workers, kill -9 one after 30% of the pages; count lost and duplicated pages."""
    with ChaosServer(_site(pages, latency=0.1)) as site, RedisServer() as redis_server:
        expected = site.reachable().ok
        settings = ours(redis_server.url) if kind == "openclaw" else plain(redis_server.url)
        w = Workers(3, settings, site.start_urls, tmp / f"kill-{kind}")
        wait_for_items(redis_server.url, int(len(expected) * 0.3), 120)
        w.kill(1)
        w.wait(300)
        urls = scraped_urls(redis_server.url)
    return {"kind": kind, "expected": len(expected), "scraped_unique": len(set(urls) & expected),
            "lost": len(expected - set(urls)), "duplicates": sum(c - 1 for c in urls.values() if c > 1)}


def scenario_rate(kind: str, limit: float, pages: int, tmp: Path) -> dict[str, Any]:
    """3 workers, one host allowing ``limit`` req/s; the server counts the busiest 1-s window."""
    burst = 2
    cfg = _site(pages, hosts=1, latency=0.01, rate_limit={"rate": limit * 10, "burst": 100})
    with ChaosServer(cfg) as site, RedisServer() as redis_server:
        if kind == "openclaw":
            settings = ours(redis_server.url, rate=limit, burst=burst)
        else:  # each worker is individually polite at the same limit
            settings = plain(redis_server.url, delay=1.0 / limit)
        w = Workers(3, settings, site.start_urls, tmp / f"rate-{kind}")
        w.wait(300)
        truth = site.truth(include_requests=False)
    host = next(iter(truth["hosts"].values()))
    return {"kind": kind, "limit": limit, "burst": burst, "max_1s_window": host["max_1s_window"],
            "requests": host["total"]}


def run(quick: bool = False) -> dict[str, Any]:
    pages = 40 if quick else 120
    with tempfile.TemporaryDirectory(prefix="openclaw-bench-dist-") as d:
        tmp = Path(d)
        scaling = [scenario_scaling(n, pages, tmp) for n in (1, 2, 3)]
        base = scaling[0]["seconds"]
        for row in scaling:
            row["speedup"] = round(base / row["seconds"], 2)
        kill = [scenario_kill(k, pages, tmp) for k in ("openclaw", "plain")]
        rate = [scenario_rate(k, 5.0, 30 if quick else 60, tmp) for k in ("openclaw", "plain")]
    return {"scaling": scaling, "kill": kill, "rate": rate}


if __name__ == "__main__":
    print(json.dumps(run("--quick" in sys.argv), indent=1))
