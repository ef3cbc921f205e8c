"""Key names of the sharded queue and health state: one hash tag per shard.

A domain belongs to shard ``crc32(domain) % OPENCLAW_DISTRIBUTED_SHARDS``;
every key of a shard (its ready sets, leases, payloads, its part of the
dupefilter and its domains' health hashes) carries the tag ``{<spider>#<n>}``,
so a script touching them all runs on one Redis Cluster slot, and shards spread
over the cluster's nodes. Key names are built here only; the Lua scripts get
them in ``KEYS``.
"""

from __future__ import annotations

import zlib
from typing import Any

from scrapy_openclaw.exceptions import ShardLayoutError as ShardLayoutError  # (re-exported)

#: the names of a shard's keys, in the order the queue scripts take them (KEYS[1..16])
QUEUE_KEYS = (
    "q",
    "a",
    "e",
    "domains",
    "served",
    "seq",
    "count",
    "delayed",
    "inflight",
    "owner",
    "data",
    "info",
    "released",
    "rejected",
    "seen",
    "found",
)
_SEEN = QUEUE_KEYS.index("seen")
#: the crawl's worker keys (in shard 0's tag), in the order ``lua/workers.lua`` takes them
WORKER_KEYS = ("live", "busy", "epoch", "wake")


def check_name(what: str, name: str) -> None:
    if "{" in name or "}" in name:
        raise ShardLayoutError(
            f"scrapy-openclaw distributed mode: {what} {name!r} contains '{{' or '}}'; the queue "
            f"puts its own Redis Cluster hash tags into key names, so it must not have one"
        )


def shard_of(domain: str, shards: int) -> int:
    return zlib.crc32(domain.encode("utf-8", "surrogatepass")) % shards if shards > 1 else 0


def tag(spider: str, shard: int) -> str:
    return f"{{{spider}#{shard}}}"


def health_key(spider: str, domain: str, shards: int) -> str:
    """The domain's health hash (in the domain's shard)."""
    return f"{spider}:health:{tag(spider, shard_of(domain, shards))}:d:{domain}"


def health_domains_key(spider: str, shard: int) -> str:
    """The set of domains with health state in *shard*."""
    return f"{spider}:health:{tag(spider, shard)}:domains"


class ShardKeys:
    """The key names of queue *key*'s shards."""

    def __init__(self, key: str, spider: str, shards: int):
        check_name("SCHEDULER_QUEUE_KEY", key)
        check_name("spider name", spider)
        self.key, self.spider, self.count = key, spider, shards
        self._keys = [self._build(i) for i in range(shards)]

    def _build(self, shard: int) -> list[str]:
        base = f"{self.key}:{tag(self.spider, shard)}"
        return [f"{base}:{name}" for name in QUEUE_KEYS]

    def of(self, domain: str) -> int:
        return shard_of(domain, self.count)

    def keys(self, shard: int, seen: str | None = None) -> list[str]:
        """KEYS of a queue script on *shard*; *seen*: the dupefilter key whose shard part to use."""
        keys = self._keys[shard]
        if seen is None:
            return keys
        return [*keys[:_SEEN], self.seen(seen, shard), *keys[_SEEN + 1 :]]

    def format_key(self) -> str:
        """The format of the crawl's stored data (``scheduler.FORMAT``), in shard 0's tag."""
        return f"{self.key}:{tag(self.spider, 0)}:format"

    def workers(self) -> list[str]:
        """KEYS of ``lua/workers.lua``: the crawl's live and busy workers, in shard 0's tag."""
        base = f"{self.key}:{tag(self.spider, 0)}"
        return [f"{base}:{name}" for name in WORKER_KEYS]

    def name(self, what: str, shard: int) -> str:
        return self._keys[shard][QUEUE_KEYS.index(what)]

    def seen(self, dupefilter_key: str, shard: int) -> str:
        return f"{dupefilter_key}:{tag(self.spider, shard)}"

    def legacy(self) -> list[str]:
        """Keys of the single-node layout before sharding (refused at start, see docs/distributed.md)."""
        return [f"{self.key}:{name}" for name in ("data", "inflight", "delayed", "domains")]

    def clear(self, server: Any) -> None:
        """Delete every key of the queue: all shards, and the layouts before them."""
        for shard in range(self.count):
            server.delete(*(k for i, k in enumerate(self.keys(shard)) if i != _SEEN))
            server.delete(self.name("seen", shard))
        server.delete(*self.workers())
        old = ("served", "seq", "count", "info", "owner", "released")
        for key in [self.key, *self.legacy(), *(f"{self.key}:{name}" for name in old)]:
            server.delete(key)
        for part in (":q:", ":a:", ":e:"):
            for key in list(server.scan_iter(match=self.key + part + "*", count=500)):
                server.delete(key)
