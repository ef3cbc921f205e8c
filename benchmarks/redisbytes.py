"""Bytes of Redis memory per pending request: the add-on's leased queue beside plain scrapy-redis.

    python -m benchmarks.redisbytes [--quick]

``run(quick) -> dict``. ``N`` requests (1,000,000; quick 100,000) over
``DOMAINS`` hosts, each with its dupefilter fingerprint, are queued in a fresh
``redis-server`` (no persistence) through each implementation's own push path,
with nothing popped: ours (``LeasedDeadlineQueue.push`` with the fingerprint
marked in the same script, as the scheduler does; the add-on's defaults, no
deadline) and stock scrapy-redis (``PriorityQueue.push`` of its pickled
request and ``RFPDupeFilter.request_seen``). The figure is ``INFO memory``
``used_memory`` after, less before, over N; ``by_key`` splits it over the
keys (``MEMORY USAGE``, one sample per key), so the docs can say where the
bytes go. Health state is per domain, not per request, and is left out.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections import Counter
from typing import Any

from scrapy import Request, Spider
from scrapy.utils.reactor import install_reactor
from scrapy.utils.test import get_crawler

from scrapy_openclaw.testing.servers import RedisServer

N, QUICK_N = 1_000_000, 100_000
DOMAINS = 10_000
#: URLs of a realistic length (~70 bytes): a shop's category pages
URL = "https://www.shop-{d}.example.com/category/{c}/item-{i}.html?ref=list"


class _Spider(Spider):
    name = "bytes"


def _requests(n: int) -> Any:
    for i in range(n):
        yield Request(URL.format(d=i % DOMAINS, c=i % 37, i=i), priority=i % 3)


def _used(server: Any) -> int:
    server.execute_command("MEMORY", "PURGE")
    return int(server.info("memory")["used_memory"])


def _by_key(server: Any) -> dict[str, int]:
    """Bytes per kind of key (the part after the crawl name, shard numbers folded)."""
    kinds: Counter[str] = Counter()
    for key in server.scan_iter(count=1000):
        name = key.decode()
        kind = re.sub(r"\d+", "#", name.split(":", 1)[-1])
        kinds[kind] += int(server.execute_command("MEMORY", "USAGE", key, "SAMPLES", "0") or 0)
    return dict(kinds.most_common())


def _ours(url: str, n: int) -> None:
    from scrapy_openclaw.distributed import serializer
    from scrapy_openclaw.distributed.connection import client_from_settings
    from scrapy_openclaw.distributed.queue import LeasedDeadlineQueue

    install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")  # (not run: pushes go at once)
    crawler = get_crawler(_Spider, {"REDIS_URL": url, "OPENCLAW_HEALTH_ENABLED": False})
    spider = _Spider.from_crawler(crawler)
    crawler.spider = spider
    queue = LeasedDeadlineQueue(client_from_settings(crawler.settings), spider, "%(spider)s:requests", serializer)
    fingerprint = crawler.request_fingerprinter.fingerprint
    for request in _requests(n):
        queue.push(request, dupe=("bytes:dupefilter", fingerprint(request).hex()))
    if len(queue) != n:
        raise RuntimeError(f"ours: {len(queue)} queued of {n}")


def _stock(url: str, n: int) -> None:
    import redis
    from scrapy_redis.dupefilter import RFPDupeFilter  # type: ignore[import-untyped]
    from scrapy_redis.queue import PriorityQueue  # type: ignore[import-untyped]

    server = redis.Redis.from_url(url)
    crawler = get_crawler(_Spider)
    spider = _Spider.from_crawler(crawler)
    queue = PriorityQueue(server, spider, "bytes:requests")
    seen = RFPDupeFilter(server, "bytes:dupefilter")
    for request in _requests(n):
        if not seen.request_seen(request):
            queue.push(request)
    if len(queue) != n:
        raise RuntimeError(f"scrapy-redis: {len(queue)} queued of {n}")


def _measure(push: Any, n: int) -> dict[str, Any]:
    import redis

    redis_server = RedisServer().start()
    try:
        server = redis.Redis.from_url(redis_server.url)
        before = _used(server)
        started = time.monotonic()
        push(redis_server.url, n)
        seconds = time.monotonic() - started
        used = _used(server) - before
        return {
            "bytes_per_pending": round(used / n, 1),
            "used_mb": round(used / 2**20, 1),
            "pending": n,
            "push_seconds": round(seconds, 1),
            "by_key": {kind: round(b / n, 1) for kind, b in _by_key(server).items()},
        }
    finally:
        redis_server.stop()


def run(quick: bool = False) -> dict[str, Any]:
    n = QUICK_N if quick else N
    configs = {"scrapy_redis": _measure(_stock, n), "openclaw": _measure(_ours, n)}
    return {"baseline": "scrapy_redis", "configs": configs, "domains": DOMAINS}


if __name__ == "__main__":
    print(json.dumps(run(quick="--quick" in sys.argv), indent=1))
