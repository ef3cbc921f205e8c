"""Push/pop throughput and memory per pending request: DeadlinePriorityQueue vs Scrapy's queues.

Requests over 100 domains with a few priorities are pushed, then all popped,
for Scrapy's memory queue (``ScrapyPriorityQueue`` over ``LifoMemoryQueue``),
``DownloaderAwarePriorityQueue`` (Scrapy's default) and ours, with no
deadlines and with a deadline on every request. Three separate passes, so one
cannot distort another:

* **throughput** at ``THROUGHPUT_N`` pending requests (1,000,000; quick
  100,000), timed with nothing else running (no tracemalloc, which makes
  allocation-heavy code ~10x slower, gc off during the timing);
* **memory** at ``MEMORY_N`` pending requests (100,000; quick 20,000) with
  tracemalloc: the queue's own structures (``overhead``: for Scrapy's queue
  little more than a deque's 8-byte pointer per request) and requests +
  meta + structures (``total``, the issue's "memory per pending request"),
  in bytes per request. Bytes per request barely depend on N past a few
  thousand, so the smaller traced pass measures the same thing in a fraction
  of the time;
* **growth**: time per push+pop at 40,000 pending requests over the time at
  2,000 (``cost_growth_20x``; O(log n) is ~1.4, O(n) ~20).

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
THROUGHPUT_N, MEMORY_N = 1_000_000, 100_000
QUICK_THROUGHPUT_N, QUICK_MEMORY_N = 100_000, 20_000
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


def _requests(n: int) -> list[Request]:
    return [Request(f"http://h{i % DOMAINS}.example/page/{i}", priority=i % 5 - 2) for i in range(n)]


def _fresh_meta(requests: list[Request], deadlines: bool) -> None:
    """Give every request a new meta dict (empty, or with a deadline), as a newly made request has.

    Building 1,000,000 Requests takes longer than most queues need to push and pop them, so
    one list serves every case; only meta changes (queues write ``download_slot`` into it,
    and a meta dict never shrinks). Every queue touches meta, so it exists before the timing.
    """
    now = time.time()
    for i, r in enumerate(requests):
        r._meta = {M.DEADLINE: now + 3600 + (i * 7919) % 3600} if deadlines else {}


def _build(cls: type, crawler: Any) -> Any:
    return cls.from_crawler(crawler, LifoMemoryQueue, "", start_queue_cls=FifoMemoryQueue)


def throughput(cls: type, requests: list[Request], deadlines: bool, crawler: Any) -> dict[str, float]:
    """Push all, then pop all, untraced, gc off; requests per second."""
    for r in requests:
        r._meta = None
    _fresh_meta(requests, deadlines)
    q = _build(cls, crawler)
    gc.collect()
    gc.disable()
    try:
        t = time.perf_counter()
        for r in requests:
            q.push(r)
        push = time.perf_counter() - t
        t = time.perf_counter()
        popped = 0
        while q.pop() is not None:
            popped += 1
        pop = time.perf_counter() - t
    finally:
        gc.enable()
    assert popped == len(requests), (cls, popped, len(requests))
    return {"push_per_s": round(len(requests) / push), "pop_per_s": round(len(requests) / pop)}


def cost_growth(cls: type, deadlines: bool, crawler: Any, small: int = 2_000, large: int = 40_000) -> float:
    """Time per push+pop at *large* pending requests over the time at *small* (best of 3 each).

    20x the requests: a heap's O(log n) costs ~1.4x per operation, an O(n)
    scan ~20x. (This was a wall-clock unit test; timings belong here.)
    """

    def per_op(n: int) -> float:
        requests = _requests(n)
        _fresh_meta(requests, deadlines)
        q = _build(cls, crawler)
        started = time.perf_counter()
        for r in requests:
            q.push(r)
        while q.pop() is not None:
            pass
        return (time.perf_counter() - started) / n

    return round(min(per_op(large) for _ in range(3)) / min(per_op(small) for _ in range(3)), 2)


def request_bytes(n: int) -> int:
    """Bytes of ``n`` bare Requests (meta not yet created), traced."""
    gc.collect()
    tracemalloc.start()
    try:
        requests = _requests(n)
        size = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    del requests
    return size


def memory(cls: type, requests: list[Request], bare_bytes: int, deadlines: bool, crawler: Any) -> dict[str, float]:
    """Traced: each request's meta (as :func:`_fresh_meta` makes it) and the queue holding them all."""
    n = len(requests)
    for r in requests:
        r._meta = None
    gc.collect()
    tracemalloc.start()
    try:
        _fresh_meta(requests, deadlines)
        with_meta = tracemalloc.get_traced_memory()[0]
        q = _build(cls, crawler)
        for r in requests:
            q.push(r)
        gc.collect()
        pending = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(q) == n
    while q.pop() is not None:
        pass
    return {
        "overhead_bytes_per_request": round((pending - with_meta) / n, 1),
        "total_bytes_per_request": round((bare_bytes + pending) / n, 1),
    }


def run(quick: bool = False) -> dict[str, Any]:
    """Both passes for every case; ``{"baseline": "scrapy", "configs": {case: {metric: number}}}``."""
    n_tp, n_mem = (QUICK_THROUGHPUT_N, QUICK_MEMORY_N) if quick else (THROUGHPUT_N, MEMORY_N)
    crawler = _crawler()
    configs: dict[str, dict[str, Any]] = {name: {} for name in CASES}
    timings = {}
    started = time.monotonic()
    requests = _requests(n_tp)
    timings["build_requests"] = round(time.monotonic() - started, 1)
    for name, (cls, deadlines) in CASES.items():
        started = time.monotonic()
        configs[name].update(throughput(cls, requests, deadlines, crawler))
        timings[f"throughput {name}"] = round(time.monotonic() - started, 1)
    del requests
    for name, (cls, deadlines) in CASES.items():
        started = time.monotonic()
        configs[name]["cost_growth_20x"] = cost_growth(cls, deadlines, crawler)
        timings[f"growth {name}"] = round(time.monotonic() - started, 1)
    started = time.monotonic()
    bare = request_bytes(n_mem)
    requests = _requests(n_mem)
    for name, (cls, deadlines) in CASES.items():
        configs[name].update(memory(cls, requests, bare, deadlines, crawler))
    timings["memory pass"] = round(time.monotonic() - started, 1)
    return {
        "baseline": BASELINE,
        "throughput_requests": n_tp,
        "memory_requests": n_mem,
        "domains": DOMAINS,
        "configs": configs,
        "seconds": timings,
    }


if __name__ == "__main__":
    print(json.dumps(run(quick="--quick" in sys.argv), indent=1))
