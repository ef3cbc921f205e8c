"""Redis cost of distributed mode beside plain scrapy-redis: commands, round trips and Redis CPU per page.

    python -m benchmarks.rediscost [--quick] [--single]

``run(quick) -> dict``. For 1, 2 and 3 worker processes
(``benchmarks.distributed.Workers``) against a fault-free 6-host chaos site,
once on one ``redis-server`` and once on a 3-master Redis Cluster
(``RedisClusterServer``), each crawl twice in the same run: ours (the add-on,
``benchmarks.distributed.ours``) and plain scrapy-redis (its own scheduler and
dupefilter, ``benchmarks.distributed.plain``; on one Redis only: its queue's pop needs
MULTI, which redis-py's cluster pipeline refuses); both list scrapy-redis's RedisPipeline,
which the add-on replaces in ours with its own (``distributed/items.py``: a page's items
written with its acknowledgement). Per page, summed over the nodes:

- ``commands_per_page``: ``INFO commandstats`` (reset before each crawl), the
  ``redis.call`` of every Lua script included; ``queue_commands_per_page``
  leaves out the items' RPUSH;
- ``round_trips_per_page``: requests the server read (``INFO stats``
  ``total_reads_processed``: one per request, a pipeline counting as one),
  this benchmark's own INFO calls taken out;
- ``redis_cpu_ms_per_page``: ``used_cpu_user + used_cpu_sys`` before/after.

One more crawl of ours with 3 workers sets ``OPENCLAW_DISTRIBUTED_ROUND_GAP`` to
``WIDE_GAP`` (its row ``..._gap_0.15``): rounds further apart, fewer round trips; and
one keeps scrapy-redis's RedisPipeline (row ``..._their_pipeline``): an item's own RPUSH
per item, as before the add-on wrote them with the acknowledgements.

The numbers include start-up and the workers' idle time while they wait for
the last pages. ``idle``: the calls per second one more worker adds while it
has nothing to do (ours: a second worker joining a crawl whose only request
takes 30 s to answer; scrapy-redis: a RedisSpider with an empty queue),
measured over IDLE_WINDOW seconds; ours then gets one request pushed by another
process, and ``wake_s`` is the time until a waiting worker leased it.
``docs/redis-sizing.md`` turns it into a sizing estimate.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.distributed import (
    ROOT,
    RedisClusterServer,
    Workers,
    _site,
    client,
    ours,
    ours_defaults,
    plain,
    queue_size,
    scraped_urls,
    wait_for_workers,
)
from scrapy_openclaw.testing.servers import ChaosServer, RedisServer, subprocess_env

PAGES, QUICK_PAGES = 300, 120  # per host
HOSTS = 6
WORKERS = (1, 2, 3)
KINDS = ("openclaw", "scrapy_redis")
#: listed with None, ours does not take scrapy-redis's RedisPipeline's place
THEIRS_KEPT = "scrapy_openclaw.distributed.pipelines.RedisItemPipeline"
WIDE_GAP = 0.15  # OPENCLAW_DISTRIBUTED_ROUND_GAP of one more crawl of ours (the default: 0.05)
IDLE_WINDOW = 20.0  # > the engine heartbeat (5 s) and the default lease sweep (every lease / 3 = 20 s)
IDLE_LATENCY = 90.0  # the one page of the idle crawl answers after this long
#: stock scrapy-redis's spider that waits for work in Redis (a RedisSpider)
IDLE_STOCK_SPIDER = "tests.distributed_spiders.RedisChaosSpider"


_CONNS: dict[str, Any] = {}
_CRAWLS = itertools.count()  # (each crawl's own output directory)


def _node_urls(backend: Any) -> list[str]:
    return [n.url for n in backend.nodes] if isinstance(backend, RedisClusterServer) else [backend.url]


def _info(urls: list[str]) -> dict[str, float]:
    """CPU seconds, reads processed and every command's calls, summed over the nodes (one INFO each)."""
    import redis

    total: dict[str, float] = {"cpu": 0.0, "reads": 0.0, "info": float(len(urls))}
    for url in urls:
        if url not in _CONNS:  # kept open: a new connection's handshake would count as calls
            _CONNS[url] = redis.Redis.from_url(url)
        info = _CONNS[url].info("all")
        total["cpu"] += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
        total["reads"] += float(info["total_reads_processed"])
        for name, stat in info.items():
            if name.startswith("cmdstat_"):
                cmd = "cmd:" + name.removeprefix("cmdstat_")
                total[cmd] = total.get(cmd, 0.0) + float(stat["calls"])
    return total


def _delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """after - before; our own INFO calls (one per node per reading) taken out."""
    out = {k: v - before.get(k, 0.0) for k, v in after.items()}
    out["reads"] -= before["info"]
    out["cmd:info"] = out.get("cmd:info", 0.0) - before["info"]
    return out


def _calls(delta: dict[str, float]) -> dict[str, int]:
    skip = {"config|resetstat", "config", "info"}
    return {k[4:]: int(v) for k, v in delta.items() if k.startswith("cmd:") and k[4:] not in skip and v > 0}


def _reset(urls: list[str]) -> None:
    import redis

    for url in urls:
        with redis.Redis.from_url(url) as conn:
            conn.flushall()
            conn.config_resetstat()


def _settings(kind: str, url: str) -> dict[str, Any]:
    return ours(url) if kind == "openclaw" else plain(url)


def measure(
    backend: Any, kind: str, workers: int, pages: int, tmp: Path, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One crawl of the 6-host site by *workers* workers of *kind* (*extra*: settings on top),
    and what Redis did for it."""
    urls = _node_urls(backend)
    with ChaosServer(_site(pages, hosts=HOSTS, latency=0.02)) as site:
        expected = len(site.reachable().ok)
        _reset(urls)
        before = _info(urls)
        started = time.monotonic()
        settings = {**_settings(kind, backend.url), **(extra or {})}
        w = Workers(workers, settings, site.start_urls, tmp / f"{kind}-{id(backend)}-{workers}-{next(_CRAWLS)}")
        codes = w.wait(600)
        seconds = time.monotonic() - started
        delta = _delta(before, _info(urls))
        crawled = len(scraped_urls(backend.url))
    calls = _calls(delta)
    total = sum(calls.values())
    done = max(1, crawled)
    cpu = delta["cpu"]
    return {
        "kind": kind,
        "workers": workers,
        "nodes": len(urls),
        "pages": crawled,
        "expected": expected,
        "exit_codes": codes,
        "seconds": round(seconds, 2),
        "pages_per_s": round(crawled / seconds, 1),
        "commands": total,
        "commands_per_page": round(total / done, 2),
        "queue_commands_per_page": round((total - calls.get("rpush", 0)) / done, 2),
        "evalsha_per_page": round(calls.get("evalsha", 0) / done, 2),
        "round_trips_per_page": round(delta["reads"] / done, 2),
        "redis_cpu_s": round(cpu, 3),
        "redis_cpu_ms_per_page": round(1000 * cpu / done, 3),
        # every node's core saturated by this workload alone, load spread evenly over the nodes
        # (an upper bound; plan for half of it)
        "pages_per_s_cpu_bound": round(len(urls) * done / cpu, 0) if cpu > 0 else None,
        "calls": dict(sorted(calls.items(), key=lambda kv: -kv[1])),
    }


def _window(urls: list[str], seconds: float) -> dict[str, float]:
    before = _info(urls)
    time.sleep(seconds)  # (the benchmark's own process: no reactor here)
    return _delta(before, _info(urls))


def _rates(delta: dict[str, float], seconds: float) -> tuple[float, float]:
    return delta["reads"] / seconds, sum(_calls(delta).values()) / seconds


def idle_cost(backend: Any, kind: str, tmp: Path) -> dict[str, Any]:
    """Round trips and commands per second that one idle worker of *kind* adds."""
    urls = _node_urls(backend)
    cfg = _site(1, hosts=1, latency=IDLE_LATENCY)
    cfg["hosts"][0]["links_per_page"] = 0
    with ChaosServer(cfg) as site:
        _reset(urls)
        out = tmp / f"idle-{kind}-{id(backend)}"
        if kind == "openclaw":  # a busy first worker (one request in flight), then one with nothing to do
            first = Workers(1, ours_defaults(backend.url), site.start_urls, out / "a")
            wait_for_workers(backend.url, 1, 60)
            time.sleep(1.5)
            base = _window(urls, IDLE_WINDOW)
            idle = Workers(1, ours_defaults(backend.url), [], out / "b", first_alone=False)
            joined = wait_for_workers(backend.url, 2, 60)
        else:
            first, base, joined = None, _window(urls, IDLE_WINDOW), 1
            idle = Workers(1, plain(backend.url), [], out / "b", IDLE_STOCK_SPIDER)
            time.sleep(4.0)  # its start-up
        time.sleep(1.5)
        both = _window(urls, IDLE_WINDOW)
        wake = _wake_latency(backend.url, site.start_urls[0]) if kind == "openclaw" else None
        for w in (idle, first):
            if w is not None:
                w.wait(0.1)  # (killed: the crawl's one page takes IDLE_LATENCY s)
    base_rt, base_cmd = _rates(base, IDLE_WINDOW)
    both_rt, both_cmd = _rates(both, IDLE_WINDOW)
    return {
        "kind": kind,
        "joined": joined,
        "window_s": IDLE_WINDOW,
        "wake_s": wake,
        "round_trips_per_s": round(both_rt - base_rt, 2),
        "commands_per_s": round(both_cmd - base_cmd, 1),
        "base_round_trips_per_s": round(base_rt, 2),
        "calls": _calls(both),
    }


def _wake_latency(redis_url: str, page: str) -> float | None:
    """Seconds from a push into the idle crawl (by another process, through the queue's own
    push) until a waiting worker leased it: how soon an idle worker wakes when work arrives."""
    before = queue_size(redis_url, "inflight")
    code = (
        "import sys, time; from benchmarks.rediscost import push_one; "
        "push_one(sys.argv[1], sys.argv[2]); print(time.time(), flush=True)"
    )
    child = subprocess.run(
        [sys.executable, "-c", code, redis_url, page.rstrip("/") + "/wake"],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    if child.returncode != 0:
        print(f"wake push failed: {child.stderr[-500:]}", file=sys.stderr)
        return None
    pushed = float(child.stdout.split()[-1])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if queue_size(redis_url, "inflight") > before:
            return round(time.time() - pushed, 3)
        time.sleep(0.005)
    return None


def push_one(redis_url: str, url: str) -> None:
    """Queue one request in the running crawl as a worker would (its settings, its seal), with
    no reactor running: the push goes to Redis at once."""
    from scrapy import Request
    from scrapy.utils.reactor import install_reactor
    from scrapy.utils.test import get_crawler

    from scrapy_openclaw.distributed import serializer
    from scrapy_openclaw.distributed.connection import client_from_settings
    from scrapy_openclaw.distributed.queue import LeasedDeadlineQueue
    from scrapy_openclaw.testing.spiders import ChaosSpider

    install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")
    crawler = get_crawler(ChaosSpider, ours_defaults(redis_url))
    crawler.spider = ChaosSpider.from_crawler(crawler)
    queue = LeasedDeadlineQueue(
        client_from_settings(crawler.settings), crawler.spider, "%(spider)s:requests", serializer
    )
    queue.push(Request(url, dont_filter=True))


def _backend_rows(backend: Any, kind: str, pages: int, tmp: Path) -> dict[str, Any]:
    """Every crawl and idle measure on *backend*; stock scrapy-redis on one Redis only (its
    PriorityQueue.pop needs MULTI, which redis-py's cluster pipeline refuses)."""
    kinds = KINDS if kind == "single" else ("openclaw",)
    rows: dict[str, Any] = {}
    for n in WORKERS:
        for k in kinds:
            rows[f"{kind}_{k}_{n}_workers"] = _progress(measure(backend, k, n, pages, tmp))
    # ours with rounds further apart: fewer round trips, more pages crawled twice after a crash
    gap = {"OPENCLAW_DISTRIBUTED_ROUND_GAP": WIDE_GAP}
    rows[f"{kind}_openclaw_{WORKERS[-1]}_workers_gap_{WIDE_GAP}"] = _progress(
        {**measure(backend, "openclaw", WORKERS[-1], pages, tmp, gap), "round_gap": WIDE_GAP}
    )
    # ours with scrapy-redis's own item pipeline kept: each item's RPUSH a round trip of its own
    theirs = {"ITEM_PIPELINES": {"scrapy_redis.pipelines.RedisPipeline": 900, THEIRS_KEPT: None}}
    rows[f"{kind}_openclaw_{WORKERS[-1]}_workers_their_pipeline"] = _progress(
        {**measure(backend, "openclaw", WORKERS[-1], pages, tmp, theirs), "item_pipeline": "RedisPipeline"}
    )
    for k in kinds:
        rows[f"{kind}_{k}_idle"] = _progress(idle_cost(backend, k, tmp))
    return rows


def _progress(row: dict[str, Any]) -> dict[str, Any]:
    print(json.dumps({k: v for k, v in row.items() if k != "calls"}), file=sys.stderr, flush=True)
    return row


def run(quick: bool = False, *, cluster: bool = True) -> dict[str, Any]:
    """``{"tables": {"cost": {"baseline": "single_scrapy_redis_1_workers", "configs": {...}}}}``
    (*cluster* False: one Redis only, ``--single``)."""
    pages = QUICK_PAGES if quick else PAGES
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="openclaw-bench-rediscost-") as d:
        tmp = Path(d)
        with RedisServer() as single:
            rows.update(_backend_rows(single, "single", pages, tmp))
        if cluster:
            with RedisClusterServer() as nodes:
                client(nodes.url).ping()
                rows.update(_backend_rows(nodes, "cluster", pages, tmp))
    return {"tables": {"cost": {"baseline": "single_scrapy_redis_1_workers", "configs": rows}}}


if __name__ == "__main__":
    print(json.dumps(run("--quick" in sys.argv, cluster="--single" not in sys.argv), indent=1))
