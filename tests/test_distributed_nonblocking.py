"""A paused Redis never stalls a worker's reactor: /metrics answers and timers fire on time.

The redis-server is frozen (SIGSTOP) for 3 s in the middle of a crawl: every
Redis call of the worker waits on its Redis thread meanwhile, the crawl
rides it out (prefetched requests, buffered writes) and finishes with
nothing lost.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

from scrapy_openclaw.testing.servers import free_port

_spec = importlib.util.spec_from_file_location(
    "openclaw_bench_distributed_nb", Path(__file__).resolve().parents[1] / "benchmarks" / "distributed.py"
)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

PAUSE = 3.0
NOT_BLOCKED = PAUSE / 3


def _get_metrics(port: int) -> float:
    """Seconds one GET /metrics takes (its timeout outlasts the pause: a blocked reactor fails the bound, not the GET)."""
    start = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        response.read()
    return time.monotonic() - start


def test_paused_redis_stalls_neither_reactor_nor_metrics(chaos_server: Any, redis_server: Any, tmp_path: Path) -> None:
    site = chaos_server(bench._site(60, hosts=2, latency=0.05))
    expected = site.reachable().ok
    port = free_port()
    stall_file = tmp_path / "stalls.json"
    settings = bench.ours(redis_server.url)
    settings.update(
        OPENCLAW_METRICS_PORT=port,
        STALL_FILE=str(stall_file),
        EXTENSIONS={"tests.distributed_spiders.StallMeter": 0},
        CONCURRENT_REQUESTS=4,
    )
    workers = bench.Workers(1, settings, site.start_urls, tmp_path / "w")
    try:
        assert bench.wait_for_items(redis_server.url, 8, 120) >= 8
        _get_metrics(port)  # up (and warm)
        pid = redis_server._proc.pid
        os.kill(pid, signal.SIGSTOP)
        paused_at = time.time()
        latencies = []
        try:
            while time.time() - paused_at < PAUSE:
                latencies.append(_get_metrics(port))
                time.sleep(0.1)
        finally:
            os.kill(pid, signal.SIGCONT)
        resumed_at = time.time()
        items_at_resume = bench.client(redis_server.url).llen("chaos:items")
        assert workers.wait(180) == [0], workers.log(0)[-3000:]
    finally:
        workers.wait(1)
    urls = bench.scraped_urls(redis_server.url)
    assert expected - set(urls) == set(), "pages lost while Redis was paused"
    # A reactor blocked on the paused Redis answers nothing until SIGCONT (its socket timeout is
    # 10 s): a GET would wait out the rest of the pause. A third of the pause tells the two apart
    # on a loaded machine too; the figures themselves (a few ms) are printed, not asserted.
    assert len(latencies) >= 10 and max(latencies) < NOT_BLOCKED, latencies
    stalls = json.loads(stall_file.read_text())
    during = [s for t, s in stalls["stalls"] if paused_at <= t <= resumed_at + 0.5]
    assert max(during, default=0.0) < NOT_BLOCKED, stalls["stalls"]
    # the crawl really needed Redis meanwhile: it was not over when the pause ended
    assert items_at_resume < len(expected)
    print(
        f"paused {PAUSE}s: /metrics max {max(latencies) * 1000:.1f} ms over {len(latencies)} GETs; "
        f"longest reactor stall during the pause {max(during, default=0.0) * 1000:.1f} ms "
        f"(whole crawl {stalls['max'] * 1000:.1f} ms); items at resume {items_at_resume}/{len(expected)}"
    )
    assert workers.stats(0)["finish_reason"] == "finished"
