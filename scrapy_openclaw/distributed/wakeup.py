"""Waking idle workers when work arrives, without polling Redis.

A worker that found its shards empty would otherwise look at each of them again
several times a second, one script call each. Instead it waits on the crawl's
wake stream with ``XREAD BLOCK`` on a thread of its own, and a worker whose push
gives a shard work (or that turns idle) adds an entry (docs/distributed-workers.md).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from redis.exceptions import RedisError

from scrapy_openclaw.distributed.connection import is_cluster

logger = logging.getLogger(__name__)

#: seconds before a worker looks again at a shard it found empty if nothing woke it: a safety net
#: only, as the counting rounds (every COUNT_EVERY s, see batching.py) name the shards with ready
#: entries and the sweeps those whose due or expired entries they made ready
EMPTY_WAIT = 60.0
#: seconds one XREAD waits for an entry (an idle worker's one call per period)
BLOCK = 5.0
#: at most one wake entry per worker per this many seconds (the shards of that time together)
NOTIFY_EVERY = 0.1
#: entries the stream keeps (approximately): readers are at most a few seconds behind
STREAM_LENGTH = 200
IDLE = "idle"  # the field of a worker that turned idle


def notify(server: Any, key: str, shards: set[int], idle: bool) -> None:
    """Add one wake entry: *shards* got work, and/or a worker turned *idle* (the Redis thread)."""
    fields = {"s": ",".join(str(s) for s in sorted(shards))}
    if idle:
        fields[IDLE] = "1"
    server.xadd(key, fields, maxlen=STREAM_LENGTH, approximate=True)


def _socket_timeout(server: Any) -> float:
    """The client's socket timeout in seconds (infinite when it has none or it cannot be told)."""
    pool = getattr(server, "connection_pool", None)
    if pool is None:  # a cluster client: its nodes' pools share the kwargs
        nodes = getattr(getattr(server, "nodes_manager", None), "connection_kwargs", None) or {}
        timeout = nodes.get("socket_timeout")
    else:
        timeout = getattr(pool, "connection_kwargs", {}).get("socket_timeout")
    return float(timeout) if timeout else float("inf")


def _xread(server: Any, key: str, last: str, block_ms: int) -> Any:
    """``XREAD`` of *key* after *last*; on a cluster sent to the key's node, as redis-py's
    cluster client would otherwise ask a node ``COMMAND GETKEYS`` first, every time (XREAD's
    keys have no fixed place): two round trips per wait where one does."""
    if not is_cluster(server):
        return server.xread({key: last}, count=STREAM_LENGTH, block=block_ms)
    node = server.get_node_from_key(key)
    return server.execute_command(
        "XREAD", "COUNT", STREAM_LENGTH, "BLOCK", block_ms, "STREAMS", key, last, target_nodes=node
    )


def _entries(reply: Any) -> list[Any]:
    """XREAD's entries of the one stream read (RESP2: a list of [key, entries]; RESP3: a dict)."""
    if not reply:
        return []
    if isinstance(reply, dict):
        value = next(iter(reply.values()))
        return list(value[0] if value and isinstance(value[0], list) else value)
    return list(reply[0][1])


def _parse(entries: list[Any]) -> tuple[set[int], bool]:
    shards: set[int] = set()
    idle = False
    for _, fields in entries:
        for name, value in fields.items():
            name = name.decode() if isinstance(name, bytes) else str(name)
            value = value.decode() if isinstance(value, bytes) else str(value)
            if name == "s":
                shards.update(int(s) for s in value.split(",") if s.isdigit())
            elif name == IDLE:
                idle = True
    return shards, idle


class Wakeup:
    """Reads the wake stream *key* while wanted; ``deliver(on_wake, shards, idle)`` hands each
    read to the reactor thread (*deliver*: ``reactor.callFromThread``).

    The thread blocks only while its worker is *hungry* (its last pop round leased fewer
    requests than it wanted); a busy worker reads nothing, and the reactor never waits on
    Redis. A stream, not a list: every waiting worker reads each entry (``BLPOP`` would wake
    only one).
    """

    def __init__(
        self,
        server: Any,
        key: str,
        on_wake: Callable[[set[int], bool], None],
        deliver: Callable[..., Any],
        *,
        block: float = BLOCK,
    ):
        self.server, self.key, self.on_wake, self.deliver = server, key, on_wake, deliver
        self.block = min(block, 0.8 * _socket_timeout(server))  # (a reply later than that is an error)
        self._hungry = threading.Event()
        self._stop = threading.Event()
        self._last = f"{int(time.time() * 1000)}-0"  # entries from now on (stream ids are server ms)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="openclaw-wakeup", daemon=True)
        self._thread.start()

    def want(self, hungry: bool) -> None:
        """Whether the worker waits for work (the reactor thread; never blocks)."""
        if hungry:
            self._hungry.set()
        else:
            self._hungry.clear()

    def stop(self) -> None:
        """Stop reading (the thread ends after its current XREAD, at most ``block`` seconds)."""
        self._stop.set()
        self._hungry.set()
        self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._hungry.wait(1.0) or self._stop.is_set():
                continue
            try:
                reply = _xread(self.server, self.key, self._last, int(self.block * 1000))
            except RedisError as exc:  # the queue's own rounds report outages
                logger.debug("Wake stream not read: %(error)s", {"error": exc})
                self._stop.wait(1.0)
                continue
            entries = _entries(reply)
            if not entries:
                continue
            last = entries[-1][0]
            self._last = last.decode() if isinstance(last, bytes) else str(last)
            shards, idle = _parse(entries)
            if not self._stop.is_set():
                self.deliver(self.on_wake, shards, idle)
