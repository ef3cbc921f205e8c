"""A domain's health record in Redis as tests read and forge it: one MessagePack map
(``health.lua``'s ``h_save``; ``scrapy_openclaw.distributed.fields`` reads it for the workers)."""

from __future__ import annotations

from typing import Any

import msgpack


def record(client: Any, key: str) -> dict[str, Any]:
    """The whole stored map (state, bookkeeping, and the policy, unpacked)."""
    value = client.get(key)
    assert value is not None, f"no health record at {key}"
    stored = dict(msgpack.unpackb(value, raw=False, unicode_errors="surrogateescape"))
    pol = stored["pol"].encode("utf-8", "surrogateescape") if isinstance(stored["pol"], str) else stored["pol"]
    return {**stored, "pol": msgpack.unpackb(pol, raw=False)}


def forge(client: Any, key: str, **changes: Any) -> None:
    """Change entries of the stored map as another writer would (its TTL and policy kept)."""
    stored = record(client, key)
    stored.update(changes, pol=msgpack.packb(stored["pol"]))
    client.set(key, msgpack.packb(stored, use_bin_type=False), keepttl=True)  # (Redis's cmsgpack reads no bin type)
