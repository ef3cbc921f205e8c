"""Push/pop throughput and memory per pending request: DeadlinePriorityQueue vs Scrapy's queues.

Requests over 100 domains with a few priorities are pushed, then all popped,
for Scrapy's memory queue (``ScrapyPriorityQueue`` over ``LifoMemoryQueue``),
``DownloaderAwarePriorityQueue`` (Scrapy's default) and ours, with no
deadlines and with a deadline on every request. Two separate passes, so one
cannot distort the other:

* **throughput** at ``THROUGHPUT_N`` pending requests (1,000,000; quick
  100,000), timed with nothing else running (no tracemalloc, which makes
  allocation-heavy code ~10x slower, gc off during the timing);
* **memory** at ``MEMORY_N`` pending requests (200,000; quick 50,000) with
  tracemalloc: the queue's own structures (``overhead``) and requests +
  structures (``total``, the issue's "memory per pending request"), in bytes
  per request. Bytes per request barely depend on N past a few thousand, so
  the smaller pass measures the same thing in a fifth of the time.

Module name: ``queue_ops``, not ``queue`` (a ``benchmarks/queue.py`` shadows
the stdlib module when a file in this directory is run as a script).

    python -m benchmarks.queue_ops [--quick]
"""

from __future__ import annotations

import gc
import json
import sys
import time
import tracemalloc
from typing import Any

from scrapy import Request, Spider
from scrapy.pqueues import DownloaderAwarePriorityQueue, ScrapyPriorityQueue
from scrapy.squeues import FifoMemoryQueue, LifoMemoryQueue
from scrapy.utils.test import get_crawler

from scrapy_openclaw import meta as M
from scrapy_openclaw.pqueues import DeadlinePriorityQueue

DOMAINS = 100
THROUGHPUT_N, MEMORY_N = 1_000_000, 200_000
QUICK_THROUGHPUT_N, QUICK_MEMORY_N = 100_000, 50_000
BASELINE = "scrapy"
# name -> (queue class, a deadline on every request)
CASES: dict[str, tuple[type, bool]] = {
    "scrapy": (ScrapyPriorityQueue, False),
    "downloader_aware": (DownloaderAwarePriorityQueue, False),
    "deadline": (DeadlinePriorityQueue, False),
    "deadline+deadlines": (DeadlinePriorityQueue, True),
}


def _crawler() -> Any:
    from scrapy.utils.reactor import install_reactor, is_reactor_installed

    if not is_reactor_installed():  # the downloader's handlers expect one
        install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")
    crawler = get_crawler(Spider, {"LOG_LEVEL": "WARNING"})
    crawler.spider = crawler._create_spider("bench")
    crawler.engine = crawler._create_engine()  # DownloaderAwarePriorityQueue needs the downloader
    return crawler


def _requests(n: int, deadlines: bool) -> list[Request]:
    now = time.time()
    out = []
    for i in range(n):
        r = Request(f"http://h{i % DOMAINS}.example/page/{i}", priority=i % 5 - 2)
        if deadlines:
            r.meta[M.DEADLINE] = now + 3600 + (i * 7919) % 3600
        else:
            _ = r.meta  # every queue touches meta; create it outside the timing
        out.append(r)
    return out


def _build(cls: type, crawler: Any) -> Any:
    return cls.from_crawler(crawler, LifoMemoryQueue, "", start_queue_cls=FifoMemoryQueue)


def throughput(cls: type, n: int, deadlines: bool, crawler: Any) -> dict[str, float]:
    requests = _requests(n, deadlines)
    q = _build(cls, crawler)
    gc.collect()
    gc.disable()
    try:
        t = time.perf_counter()
        for r in requests:
            q.push(r)
        push = time.perf_counter() - t
        del requests
        t = time.perf_counter()
        popped = 0
        while q.pop() is not None:
            popped += 1
        pop = time.perf_counter() - t
    finally:
        gc.enable()
    assert popped == n, (cls, popped, n)
    return {"push_per_s": round(n / push), "pop_per_s": round(n / pop)}


def memory(cls: type, n: int, deadlines: bool, crawler: Any) -> dict[str, float]:
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        requests = _requests(n, deadlines)
        after_requests = tracemalloc.get_traced_memory()[0]
        q = _build(cls, crawler)
        for r in requests:
            q.push(r)
        del requests
        gc.collect()
        pending = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(q) == n
    return {
        "overhead_bytes_per_request": round((pending - after_requests) / n, 1),
        "total_bytes_per_request": round((pending - base) / n, 1),
    }


def run(quick: bool = False) -> dict[str, Any]:
    """Both passes for every case; ``{"baseline": "scrapy", "configs": {case: {metric: number}}}``."""
    n_tp, n_mem = (QUICK_THROUGHPUT_N, QUICK_MEMORY_N) if quick else (THROUGHPUT_N, MEMORY_N)
    crawler = _crawler()
    configs: dict[str, dict[str, Any]] = {}
    for name, (cls, deadlines) in CASES.items():
        started = time.monotonic()
        configs[name] = {**throughput(cls, n_tp, deadlines, crawler), **memory(cls, n_mem, deadlines, crawler),
                         "seconds": round(time.monotonic() - started, 1)}
    return {"baseline": BASELINE, "throughput_requests": n_tp, "memory_requests": n_mem,
            "domains": DOMAINS, "configs": configs}


if __name__ == "__main__":
    print(json.dumps(run(quick="--quick" in sys.argv), indent=1))
