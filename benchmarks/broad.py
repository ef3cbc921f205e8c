"""Broad crawl: many domains x 10 pages, at queue level and as a crawl, vs Scrapy's queues.

**Queue level** (real ``scrapy.Request`` objects, a real crawler from
``scrapy.utils.test.get_crawler`` with its engine and downloader):

* ``pop``: for 1,000 / 10,000 / 100,000 domains x ``PAGES`` pages (quick: 2
  pages), push every request, then time pops for up to ``POP_SECONDS`` (or
  all): microseconds per pop for ``ScrapyPriorityQueue`` (one heap of
  priorities, domain-blind), ``DownloaderAwarePriorityQueue`` (Scrapy's
  default: picks the slot with the fewest active downloads by looking at every
  slot) and ours. The target: ours flat (100,000 / 1,000 domains <= 1.5x).
* ``memory``: tracemalloc, ``MEMORY_DOMAINS`` domains x 10 pages (bytes per
  request depend on pages per domain, not on the count: the smaller traced
  pass measures the same thing): total bytes per pending request (request +
  meta + queue, as ``benchmarks.queue_ops``) and the queue's own bytes per
  domain. Target: ours within 1.1x of ``DownloaderAwarePriorityQueue``.
* ``registry``: the HealthRegistry with ``REGISTRY_DOMAINS`` domains that each
  answered once: traced bytes per domain, its snapshot (the checkpoint's
  ``health`` part) in JSON bytes; then the same after ``evict_idle`` past
  ``OPENCLAW_HEALTH_IDLE_TTL`` with one domain in 100 held (kept): memory and
  snapshot bounded by what is still in use. Plus the JSON bytes a pending
  request costs in a checkpoint (``request_to_data``, compact).

**Crawl**: the chaos site's one fast host, every request with its own
``meta["download_slot"]`` (``d<N>.example``): Scrapy's downloader, our queue
and the health registry all key domains by download slot, so one loopback
host serves as many domains as we like without binding thousands of
addresses or resolver tricks (the TCP side is one host, which is what a
benchmark of the scheduling side wants). ``CRAWL_DOMAINS`` x ``CRAWL_PAGES``
requests, ``CONCURRENT_REQUESTS`` 64: plain Scrapy (DownloaderAware) vs the
add-on (and the add-on with a 2 s idle TTL, to see eviction at work).

    python -m benchmarks.broad [--quick]
"""

from __future__ import annotations

import gc
import json
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from scrapy import Request, Spider
from scrapy.pqueues import DownloaderAwarePriorityQueue, ScrapyPriorityQueue
from scrapy.squeues import FifoMemoryQueue, LifoMemoryQueue

DOMAIN_COUNTS = (1_000, 10_000, 100_000)
PAGES, QUICK_PAGES = 10, 2
POP_SECONDS, QUICK_POP_SECONDS = 2.0, 0.5
MEMORY_DOMAINS, QUICK_MEMORY_DOMAINS = 20_000, 3_000
REGISTRY_DOMAINS, QUICK_REGISTRY_DOMAINS = 100_000, 20_000
CRAWL_DOMAINS, CRAWL_PAGES = 5_000, 4
QUICK_CRAWL_DOMAINS, QUICK_CRAWL_PAGES = 500, 2
CRAWL_CAP, QUICK_CRAWL_CAP = 90.0, 20.0
IDLE_TTL = 1800.0
QUEUES: dict[str, type] = {
    "scrapy": ScrapyPriorityQueue,
    "downloader_aware": DownloaderAwarePriorityQueue,
}


def _queues() -> dict[str, type]:
    from scrapy_openclaw.pqueues import DeadlinePriorityQueue

    return {**QUEUES, "deadline": DeadlinePriorityQueue}


def _crawler() -> Any:
    from benchmarks.queue_ops import _crawler as crawler

    return crawler()


def _requests(domains: int, pages: int) -> list[Request]:
    """Page-major (every domain's first page, then every second page...), as a broad crawl
    discovers them; a few priorities."""
    return [
        Request(f"http://d{d}.example/page/{p}", priority=(d + p) % 3 - 1) for p in range(pages) for d in range(domains)
    ]


def _build(cls: type, crawler: Any) -> Any:
    return cls.from_crawler(crawler, LifoMemoryQueue, "", start_queue_cls=FifoMemoryQueue)


def pop_cost(cls: type, requests: list[Request], crawler: Any, seconds: float) -> dict[str, float]:
    """Push all (timed), then pop for up to *seconds* (timed), gc off; microseconds per operation."""
    for r in requests:
        r._meta = {}
    q = _build(cls, crawler)
    gc.collect()
    gc.disable()
    try:
        t = time.perf_counter()
        for r in requests:
            q.push(r)
        push = time.perf_counter() - t
        popped, t = 0, time.perf_counter()
        deadline = t + seconds
        while True:
            for _ in range(50):
                if q.pop() is None:
                    break
                popped += 1
            else:
                if time.perf_counter() < deadline:
                    continue
            break
        pop = time.perf_counter() - t
    finally:
        gc.enable()
    if hasattr(q, "close"):
        q.close()
    return {
        "push_us": round(push / len(requests) * 1e6, 2),
        "pop_us": round(pop / max(popped, 1) * 1e6, 2),
        "pops_timed": popped,
    }


def memory(cls: type, domains: int, pages: int, crawler: Any) -> dict[str, float]:
    """Traced bytes per pending request (request, meta, queue) and the queue's own bytes per domain."""
    gc.collect()
    tracemalloc.start()
    try:
        requests = _requests(domains, pages)
        bare = tracemalloc.get_traced_memory()[0]
        for r in requests:
            r._meta = {}
        with_meta = tracemalloc.get_traced_memory()[0]
        q = _build(cls, crawler)
        for r in requests:
            q.push(r)
        gc.collect()
        pending = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    n = len(requests)
    row = {
        "bytes_per_request": round(pending / n, 1),
        "queue_bytes_per_domain": round((pending - with_meta) / domains, 1),
        "request_bytes": round(bare / n, 1),
    }
    if hasattr(q, "overhead_bytes"):  # what the queue reports in its stats (an estimate)
        row["reported_queue_bytes_per_domain"] = round(q.overhead_bytes() / domains, 1)
    if hasattr(q, "close"):
        q.close()
    del q, requests
    gc.collect()
    return row


def registry_memory(domains: int) -> dict[str, float]:
    """The health registry: bytes and snapshot bytes per domain, before and after idle eviction."""
    from scrapy_openclaw.health import HealthRegistry
    from scrapy_openclaw.policy import PolicySet

    now = time.time()
    gc.collect()
    tracemalloc.start()
    try:
        reg = HealthRegistry(PolicySet({}, []), idle_ttl=IDLE_TTL)
        base = tracemalloc.get_traced_memory()[0]
        for d in range(domains):
            name = f"d{d}.example"
            reg.try_acquire(name, now)
            reg.record_success(name, 0.05, now=now)
            if d % 100 == 0:
                reg.hold(name, now + 10 * IDLE_TTL)  # state that matters: kept
        full = tracemalloc.get_traced_memory()[0] - base
        snapshot = len(json.dumps(reg.snapshot()))
        evicted = len(reg.evict_idle(now + IDLE_TTL + 1))  # (not the list: it holds the names)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    return {
        "domains": domains,
        "bytes_per_domain": round(full / domains, 1),
        "reported_bytes_per_domain": round(HealthRegistry.bytes_per_domain(reg), 1),
        "snapshot_bytes_per_domain": round(snapshot / domains, 1),
        "snapshot_mb": round(snapshot / 1e6, 2),
        "evicted": evicted,
        "kept": len(reg.domains()),
        "mb_after_eviction": round(after / 1e6, 2),
        "mb_before_eviction": round(full / 1e6, 2),
        "snapshot_mb_after_eviction": round(len(json.dumps(reg.snapshot())) / 1e6, 3),
    }


def checkpoint_bytes_per_request(crawler: Any, n: int = 2000) -> float:
    """JSON bytes of a pending request as the checkpoint stores it (``request_to_data``, compact)."""
    from scrapy_openclaw.serialization import request_to_data

    requests = _requests(max(1, n // PAGES), PAGES)
    total = sum(
        len(json.dumps(request_to_data(r, spider=crawler.spider, compact=True), separators=(",", ":")))
        for r in requests
    )
    return round(total / len(requests), 1)


# --- the crawl -----------------------------------------------------------------------------


class BroadSpider(Spider):
    """``-a base=URL -a domains=N -a pages=P``: N x P requests to one chaos host, each page of
    domain d under ``meta["download_slot"] = "d<d>.example"`` (its own download slot)."""

    name = "broad"

    def __init__(
        self, *args: Any, base: str = "", domains: str = "100", pages: str = "2", site_pages: str = "1", **kwargs: Any
    ):
        super().__init__(*args, **kwargs)
        self.base, self.domains, self.pages = base.rstrip("/"), int(domains), int(pages)
        self.site_pages = int(site_pages)

    async def start(self) -> Any:
        for p in range(self.pages):
            for d in range(self.domains):
                yield Request(
                    f"{self.base}/page/{(d * self.pages + p) % self.site_pages}?d={d}&p={p}",
                    meta={"download_slot": f"d{d}.example"},
                    callback=self.parse,
                )

    def start_requests(self) -> Any:  # Scrapy < 2.13
        for p in range(self.pages):
            for d in range(self.domains):
                yield Request(
                    f"{self.base}/page/{(d * self.pages + p) % self.site_pages}?d={d}&p={p}",
                    meta={"download_slot": f"d{d}.example"},
                    callback=self.parse,
                )

    def parse(self, response: Any) -> None:
        return None


CRAWL_CONFIGS: dict[str, dict[str, Any]] = {
    "scrapy": {},
    "openclaw": {"ADDONS": {"scrapy_openclaw.Addon": 100}},
    "openclaw_ttl2": {"ADDONS": {"scrapy_openclaw.Addon": 100}, "OPENCLAW_HEALTH_IDLE_TTL": 2.0},
}


def crawl(name: str, settings: dict[str, Any], domains: int, pages: int, cap: float, work: Path) -> dict[str, Any]:
    from benchmarks.overhead import wait_with_rusage
    from scrapy_openclaw.testing.crawl import read_result, start_crawl
    from scrapy_openclaw.testing.presets import fast_site
    from scrapy_openclaw.testing.servers import ChaosServer

    out = work / name
    site_pages = 500
    merged = {
        "LOG_LEVEL": "INFO",
        "CLOSESPIDER_TIMEOUT": cap,
        "CONCURRENT_REQUESTS": 64,
        "OPENCLAW_DLQ_URI": str(out / "deadletters.jsonl"),
        **settings,
    }
    with ChaosServer(fast_site(pages=site_pages)) as server:
        started = time.monotonic()
        proc = start_crawl(
            "benchmarks.broad.BroadSpider",
            merged,
            {"base": server.start_urls[0], "domains": domains, "pages": pages, "site_pages": site_pages},
            out_dir=out,
        )
        returncode, max_rss_kib, timed_out = wait_with_rusage(proc, cap + 120)
        wall = time.monotonic() - started
    result = read_result(out, returncode)
    stats = result.stats
    ok = stats.get("downloader/response_status_count/200", 0)
    elapsed = stats.get("elapsed_time_seconds") or wall
    row: dict[str, Any] = {
        "pages": ok,
        "requests": domains * pages,
        "pages_per_s": round(ok / elapsed, 1) if elapsed else None,
        "peak_rss_mb": round(max_rss_kib / 1024, 1),
        "finish_reason": stats.get("finish_reason"),
        "complete": int(stats.get("finish_reason") == "finished" and ok == domains * pages),
    }
    for key in (
        "openclaw/health/domains",
        "openclaw/health/evicted",
        "openclaw/health/bytes_per_domain",
        "openclaw/queue/bytes_per_request",
    ):
        if key in stats:
            row[key.split("/", 1)[1].replace("/", "_")] = stats[key]
    if timed_out or returncode != 0:
        row["error"] = "timed out" if timed_out else f"exit {returncode}"
        row["log_tail"] = result.log[-1500:]
    return row


# --- the run --------------------------------------------------------------------------------------


def run(quick: bool = False) -> dict[str, Any]:
    pages = QUICK_PAGES if quick else PAGES
    seconds = QUICK_POP_SECONDS if quick else POP_SECONDS
    timings: dict[str, float] = {}
    # the crawls first: a child's peak RSS counts the memory of the process that forked it
    crawl_rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="openclaw-bench-broad-") as tmp:
        for name, settings in CRAWL_CONFIGS.items():
            started = time.monotonic()
            crawl_rows[name] = crawl(
                name,
                settings,
                QUICK_CRAWL_DOMAINS if quick else CRAWL_DOMAINS,
                QUICK_CRAWL_PAGES if quick else CRAWL_PAGES,
                QUICK_CRAWL_CAP if quick else CRAWL_CAP,
                Path(tmp),
            )
            timings[f"crawl {name}"] = round(time.monotonic() - started, 1)
    crawler = _crawler()
    queues = _queues()
    pop_rows: dict[str, dict[str, Any]] = {name: {} for name in queues}
    for domains in DOMAIN_COUNTS:
        started = time.monotonic()
        requests = _requests(domains, pages)
        for name, cls in queues.items():
            row = pop_cost(cls, requests, crawler, seconds)
            pop_rows[name][f"pop_us_{domains}"] = row["pop_us"]
            pop_rows[name][f"push_us_{domains}"] = row["push_us"]
        del requests
        gc.collect()
        timings[f"pop {domains}"] = round(time.monotonic() - started, 1)
    for row in pop_rows.values():
        first, last = row.get(f"pop_us_{DOMAIN_COUNTS[0]}"), row.get(f"pop_us_{DOMAIN_COUNTS[-1]}")
        row["pop_growth"] = round(last / first, 2) if first and last else None
    started = time.monotonic()
    mem_domains = QUICK_MEMORY_DOMAINS if quick else MEMORY_DOMAINS
    mem_rows = {name: memory(cls, mem_domains, PAGES, crawler) for name, cls in queues.items()}
    timings["memory"] = round(time.monotonic() - started, 1)
    started = time.monotonic()
    registry = registry_memory(QUICK_REGISTRY_DOMAINS if quick else REGISTRY_DOMAINS)
    registry["checkpoint_bytes_per_request"] = checkpoint_bytes_per_request(crawler)
    timings["registry"] = round(time.monotonic() - started, 1)
    return {
        "tables": {
            "pop": {
                "baseline": "downloader_aware",
                "domains": list(DOMAIN_COUNTS),
                "pages_per_domain": pages,
                "configs": pop_rows,
            },
            "memory": {
                "baseline": "downloader_aware",
                "domains": mem_domains,
                "pages_per_domain": PAGES,
                "configs": mem_rows,
            },
            "registry": {"baseline": None, "configs": {"health_registry": registry}},
            "crawl": {
                "baseline": "scrapy",
                "configs": crawl_rows,
                "domains": QUICK_CRAWL_DOMAINS if quick else CRAWL_DOMAINS,
                "pages_per_domain": QUICK_CRAWL_PAGES if quick else CRAWL_PAGES,
            },
        },
        "seconds": timings,
    }


if __name__ == "__main__":
    print(json.dumps(run(quick="--quick" in sys.argv), indent=1))
