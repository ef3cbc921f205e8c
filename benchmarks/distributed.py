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

    def __init__(self, n: int, settings: dict[str, Any], start_urls: list[str], out: Path,
                 spider: str = SPIDER):
        self.procs: list[subprocess.Popen[bytes]] = []
        self.outs: list[Path] = []
        out.mkdir(parents=True, exist_ok=True)
        cfg = out / "settings.json"
        cfg.write_text(json.dumps(settings), encoding="utf-8")
        for i in range(n):
            wout = out / f"w{i}"
            args = [sys.executable, "-m", "scrapy_openclaw.testing.runcrawl", "--spider", spider,
                    "--settings-json", str(cfg), "--out", str(wout)]
            if i == 0 and start_urls:
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


def items_by_worker(redis_url: str, pid: int, key: str = "chaos:items") -> int:
    import redis

    client = redis.Redis.from_url(redis_url)
    return sum(1 for raw in client.lrange(key, 0, -1) if json.loads(raw).get("worker") == pid)


def leases_of(redis_url: str, pid: int, key: str = "chaos:requests") -> int:
    """Requests the worker with this pid holds leased right now (ours only)."""
    import redis

    owners = redis.Redis.from_url(redis_url).hvals(key + ":owner")
    return sum(1 for o in owners if o.decode().split(":")[1] == str(pid))


# Latency-bound on purpose: each worker may have only SCALE_CONCURRENCY requests
# in flight and every page takes SCALE_LATENCY, so one worker needs
# pages * latency / concurrency seconds however idle the CPUs are, and more
# workers can actually help on a 2-core machine (a CPU-bound site would only
# measure how the workers share the two cores).
SCALE_LATENCY = 0.2
SCALE_CONCURRENCY = 2


def scenario_scaling(n: int, pages: int, tmp: Path) -> dict[str, Any]:
    """Seconds until every reachable page is in Redis (worker start-up included)."""
    with ChaosServer(_site(pages, latency=SCALE_LATENCY)) as site, RedisServer() as redis_server:
        expected = len(site.reachable().ok)
        settings = ours(redis_server.url)
        settings["CONCURRENT_REQUESTS"] = SCALE_CONCURRENCY
        t0 = time.monotonic()
        w = Workers(n, settings, site.start_urls, tmp / f"scale{n}")
        wait_for_items(redis_server.url, expected, 300)
        elapsed = time.monotonic() - t0
        codes = w.wait(300)
        urls = scraped_urls(redis_server.url)
    return {"workers": n, "seconds": round(elapsed, 2), "pages": sum(urls.values()),
            "unique": len(urls), "expected": expected, "exit_codes": codes}


def scenario_kill(kind: str, pages: int, tmp: Path, after: int = 5) -> dict[str, Any]:
    """3 workers; kill -9 worker 1 once it has scraped ``after`` items itself (so it is
    mid-crawl with requests in flight); count pages lost (reachable - scraped) and duplicates.

    Latency-bound like the scaling run, so the crawl lasts long enough for plain
    scrapy-redis workers (which look at Redis on the engine's 5-s heartbeat) to join.
    """
    with ChaosServer(_site(pages, latency=SCALE_LATENCY)) as site, RedisServer() as redis_server:
        expected = site.reachable().ok
        settings = ours(redis_server.url) if kind == "openclaw" else plain(redis_server.url)
        settings["CONCURRENT_REQUESTS"] = 4
        w = Workers(3, settings, site.start_urls, tmp / f"kill-{kind}")
        pid = w.procs[1].pid
        deadline = time.monotonic() + 90
        while items_by_worker(redis_server.url, pid) < after and time.monotonic() < deadline:
            time.sleep(0.05)
        leased = leases_of(redis_server.url, pid) if kind == "openclaw" else None
        own = items_by_worker(redis_server.url, pid)
        done = len(scraped_urls(redis_server.url))
        w.kill(1)
        w.wait(300)
        urls = scraped_urls(redis_server.url)
    return {"kind": kind, "expected": len(expected), "killed_after_items": done, "its_items": own,
            "killed_worker_leases": leased, "scraped_unique": len(set(urls) & expected),
            "lost": len(expected - set(urls)), "duplicates": sum(c - 1 for c in urls.values() if c > 1)}


def scenario_rate(kind: str, limit: float, pages: int, tmp: Path) -> dict[str, Any]:
    """3 workers, one host; ours shares a ``limit`` req/s budget, plain scrapy-redis gives each
    worker DOWNLOAD_DELAY = 1/limit. The server counts the busiest 1-s window."""
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
            "ratio_to_limit": round(host["max_1s_window"] / limit, 2), "requests": host["total"]}


def run(quick: bool = False) -> dict[str, Any]:
    scale_pages = 80 if quick else 160  # x2 hosts; 1 worker: >= pages*2*0.2/2 s
    pages = 100 if quick else 160
    with tempfile.TemporaryDirectory(prefix="openclaw-bench-dist-") as d:
        tmp = Path(d)
        scaling = [scenario_scaling(n, scale_pages, tmp) for n in (1, 2, 3)]
        base = scaling[0]["seconds"]
        for row in scaling:
            row["speedup"] = round(base / row["seconds"], 2)
        kill = [scenario_kill(k, pages, tmp) for k in ("openclaw", "plain")]
        # >= 16 s at the limit, so plain workers (joining on the 5-s heartbeat) overlap
        rate = [scenario_rate(k, 5.0, 80 if quick else 120, tmp) for k in ("openclaw", "plain")]
    return {"scaling": scaling, "kill": kill, "rate": rate}


def table(result: dict[str, Any]) -> str:
    """The result as a few Markdown tables."""
    lines = ["| workers | seconds | speedup | unique/expected |", "| --- | --- | --- | --- |"]
    for r in result["scaling"]:
        lines.append(f"| {r['workers']} | {r['seconds']} | {r['speedup']} | {r['unique']}/{r['expected']} |")
    lines += ["", "| kill -9 one of 3 | killed after items (its own) | its leases | lost | duplicates |",
              "| --- | --- | --- | --- | --- |"]
    for r in result["kill"]:
        lines.append(f"| {r['kind']} | {r['killed_after_items']} ({r['its_items']}) | {r['killed_worker_leases']} | "
                     f"{r['lost']}/{r['expected']} | {r['duplicates']} |")
    lines += ["", "| 3 workers, one host | limit req/s | max in any 1 s | ratio |", "| --- | --- | --- | --- |"]
    for r in result["rate"]:
        lines.append(f"| {r['kind']} | {r['limit']} (+burst {r['burst']}) | {r['max_1s_window']} | "
                     f"{r['ratio_to_limit']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    out = run("--quick" in sys.argv)
    print(json.dumps(out, indent=1))
    print(table(out))
