"""Push/pop throughput and memory per pending request: DeadlinePriorityQueue vs Scrapy's queues.

N requests over 100 domains with a few priorities are pushed, then all popped,
for Scrapy's memory queue (``ScrapyPriorityQueue`` over ``LifoMemoryQueue``),
``DownloaderAwarePriorityQueue`` (Scrapy's default) and ours, with no
deadlines and with a deadline on every request. Memory is measured with
tracemalloc while all N are pending: the queue's own structures
(``overhead``) and requests + structures together (``total``; the issue's
"memory per pending request"), in bytes per request. Full: 1,000,000
requests; ``--quick``: 100,000.

    python -m benchmarks.queue [--quick]
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
        out.append(r)
    return out


def _build(kind: str, crawler: Any) -> Any:
    cls = {"scrapy": ScrapyPriorityQueue, "downloader_aware": DownloaderAwarePriorityQueue,
           "deadline": DeadlinePriorityQueue}[kind]
    return cls.from_crawler(crawler, LifoMemoryQueue, "", start_queue_cls=FifoMemoryQueue)


def _throughput(kind: str, n: int, deadlines: bool, crawler: Any) -> dict[str, float]:
    requests = _requests(n, deadlines)
    for r in requests:
        _ = r.meta  # every queue touches meta; create it outside the timing
    q = _build(kind, crawler)
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
    assert popped == n, (kind, popped, n)
    return {"push_per_s": round(n / push), "pop_per_s": round(n / pop)}


def _memory(kind: str, n: int, deadlines: bool, crawler: Any) -> dict[str, float]:
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    requests = _requests(n, deadlines)
    for r in requests:
        _ = r.meta
    after_requests = tracemalloc.get_traced_memory()[0]
    q = _build(kind, crawler)
    for r in requests:
        q.push(r)
    del requests
    gc.collect()
    pending = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(q) == n
    result = {
        "overhead_bytes_per_request": round((pending - after_requests) / n, 1),
        "total_bytes_per_request": round((pending - base) / n, 1),
    }
    while q.pop() is not None:
        pass
    return result


def run(quick: bool = False) -> dict[str, Any]:
    n = 100_000 if quick else 1_000_000
    crawler = _crawler()
    report: dict[str, Any] = {"requests": n, "domains": DOMAINS, "results": {}}
    cases = [("scrapy", False), ("downloader_aware", False), ("deadline", False), ("deadline", True)]
    for kind, deadlines in cases:
        name = kind + ("+deadlines" if deadlines else "")
        entry = _throughput(kind, n, deadlines, crawler)
        entry.update(_memory(kind, n, deadlines, crawler))
        report["results"][name] = entry
    ref = report["results"]["scrapy"]
    ours = report["results"]["deadline"]
    report["deadline_vs_scrapy_memory"] = {
        "total_ratio": round(ours["total_bytes_per_request"] / ref["total_bytes_per_request"], 3),
        "push_speed_ratio": round(ours["push_per_s"] / ref["push_per_s"], 3),
        "pop_speed_ratio": round(ours["pop_per_s"] / ref["pop_per_s"], 3),
    }
    report["target_met"] = {
        "memory per pending request within 10%": report["deadline_vs_scrapy_memory"]["total_ratio"] <= 1.10,
    }
    return report


if __name__ == "__main__":
    print(json.dumps(run(quick="--quick" in sys.argv), indent=1))
