"""The Redis dead-letter store: one stream per spider, shared by all workers.

Adds are exactly-once (a Lua script keyed by record id); when Redis cannot be
reached, records wait in memory, in order, and are retried with backoff on a
reactor timer, so a Redis outage never drops a dead letter nor stalls the crawl.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlencode, urlparse, urlunparse

from scrapy_openclaw.distributed import lua
from scrapy_openclaw.distributed.connection import client_for_url
from scrapy_openclaw.dlq.records import InvalidRecord, read_record, safe_id, seal, unseal
from scrapy_openclaw.dlq.stores.base import ANY, DeadLetterStore, Filters
from scrapy_openclaw.redact import mask_uri

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from scrapy_openclaw.deadletter import DeadLetter

logger = logging.getLogger(__name__)


class RedisStore(DeadLetterStore):
    """A Redis stream per spider (``<prefix>:<spider>``), shared by all workers.

    ``<stream>:ids`` maps record id -> stream entry id (exactly-once adds, fast
    ``get``); ``<stream>:replayed`` maps id -> replay time. When Redis cannot
    be reached, records are kept in memory, in order, and retried with
    exponential backoff on a reactor timer (``schedule``, e.g.
    :func:`scrapy.utils.asyncio.call_later`); :meth:`close` tries a last time
    and :meth:`drain_to` saves what is left, so a record is never dropped.
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "openclaw:dlq",
        schedule: Callable[..., Any] | None = None,
        retry_base: float = 0.5,
        retry_max: float = 30.0,
        timeout: float = 2.0,
        client: Any = None,
    ):
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.uri = mask_uri(url)  # for messages; the password stays in the client only
        self.prefix = prefix.rstrip(":")
        self._schedule = schedule
        self.retry_base, self.retry_max = retry_base, retry_max
        self._errors = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError, OSError)
        # One immediate retry (a pooled connection gone stale after a Redis
        # restart), not redis-py's default of 10 with backoff: a down Redis must
        # not stall the reactor; our own timer retries later.
        params = {"socket_timeout": timeout, "socket_connect_timeout": timeout, "retry": Retry(NoBackoff(), 1)}
        self.redis = client or client_for_url(_redis_connection_url(url), **params)
        if type(self.redis).__name__ == "RedisCluster" and "{" not in self.prefix:
            # a Redis Cluster: a stream and its :ids/:replayed hashes must share a slot
            self.prefix = "{" + self.prefix + "}"
        self._add = self.redis.register_script(lua.DLQ_ADD)
        self._update = self.redis.register_script(lua.DLQ_UPDATE)
        self._buffer: deque[DeadLetter] = deque()
        self._delay = retry_base
        self._timer: Any = None
        self._sending = False  # a batch is on its way (in a thread)
        self.failures = 0  # failed attempts to reach Redis, for stats

    def stream_key(self, spider: str) -> str:
        return f"{self.prefix}:{spider}"

    def _streams(self, spider: str | None) -> list[str]:
        if spider is not None:
            return [self.stream_key(spider)]
        keys = self.redis.scan_iter(match=f"{self.prefix}:*", count=500, _type="stream")
        return sorted({k.decode() if isinstance(k, bytes) else k for k in keys})

    # writing ---------------------------------------------------------------

    def append(self, record: DeadLetter) -> None:
        self._buffer.append(record)
        if self._timer is None:  # not already waiting for Redis to come back
            self.sync()

    def pending(self) -> int:
        return len(self._buffer)

    def sync(self) -> None:
        """Send the buffer in order; on failure keep it and retry later with backoff.

        With a reactor timer (``schedule``, i.e. in a crawl) the sending runs in a
        thread (``deferToThread``), one batch at a time, so a slow or paused
        Redis never stalls the reactor; otherwise (the CLI) it runs inline.
        """
        if self._schedule is None or "twisted.internet.reactor" not in sys.modules:
            sent, exc = self._send(list(self._buffer))
            self._sent((sent, exc))
            return
        if self._sending or not self._buffer:
            return
        from twisted.internet.threads import deferToThread

        self._sending = True
        deferToThread(self._send, list(self._buffer)).addCallback(self._sent)

    def _send(self, records: list[DeadLetter]) -> tuple[int, BaseException | None]:
        """Add *records* in order; how many went in, and the error that stopped it."""
        sent = 0
        for record in records:
            key = self.stream_key(record.spider)
            try:
                self._add(keys=[key, f"{key}:ids"], args=[record.id, seal(record.to_dict())])
            except self._errors as exc:
                return sent, exc
            sent += 1
        return sent, None

    def _sent(self, result: tuple[int, BaseException | None]) -> None:
        sent, exc = result
        self._sending = False
        for _ in range(min(sent, len(self._buffer))):
            self._buffer.popleft()
        if exc is not None:
            self.failures += 1
            self._retry_later(exc)
            return
        self._delay = self.retry_base
        if self._buffer and self._schedule is not None and self._timer is None:
            self.sync()  # appended while the batch was on its way

    def _retry_later(self, exc: BaseException) -> None:
        logger.warning(
            "Dead-letter store %(uri)s unreachable (%(error)s); %(n)d record(s) kept in memory, "
            "retrying in %(delay).1fs",
            {"uri": self.uri, "error": exc, "n": len(self._buffer), "delay": self._delay},
        )
        if self._schedule is not None and self._timer is None:
            self._timer = self._schedule(self._delay, self._on_timer)
        self._delay = min(self.retry_max, self._delay * 2)

    def _on_timer(self) -> None:
        self._timer = None
        self.sync()
        if not self._buffer:
            logger.info("Dead-letter store %(uri)s reachable again; buffer flushed", {"uri": self.uri})

    def drain_to(self, store: DeadLetterStore) -> int:
        """Move still-buffered records to another store (last resort at close)."""
        n = 0
        while self._buffer:
            store.append(self._buffer.popleft())
            n += 1
        return n

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.sync()  # one last try; still-buffered records stay for drain_to
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # reading ---------------------------------------------------------------

    def _entries(self, filters: Filters) -> Iterator[tuple[str, bytes, DeadLetter]]:
        for key in self._streams(filters.spider):
            replayed = self._replayed_of(key)
            last = "-"
            while True:  # bounded: each page advances past the last entry
                page = self.redis.xrange(key, min=last, max="+", count=500)
                for sid, fields_ in page:
                    record = self._read_entry(key, sid, fields_)
                    done = record is not None and (record.id in replayed or record.replayed_at is not None)
                    if record is not None and filters.matches(record, done):
                        yield key, sid, record
                if len(page) < 500:
                    break
                last = "(" + page[-1][0].decode()

    def _read_entry(self, key: str, sid: Any, fields_: dict[bytes, bytes]) -> DeadLetter | None:
        """The validated record of one stream entry, or None (skipped with a counted warning)."""
        where = f"in Redis stream {key} entry {sid.decode() if isinstance(sid, bytes) else sid}"
        try:
            data = unseal(fields_.get(b"data") or b"")
        except InvalidRecord as exc:
            self._skip(where, exc)
            return None
        where += f" (id {safe_id(data.get('id'))})"
        try:
            return read_record(data)
        except InvalidRecord as exc:
            self._skip(where, exc)
            return None

    def iter(self, filters: Filters = ANY) -> Iterator[DeadLetter]:
        for _key, _sid, record in self._entries(filters):
            yield record

    def get(self, id: str) -> DeadLetter | None:
        for key in self._streams(None):
            sid = self.redis.hget(f"{key}:ids", id)
            if sid is None:
                continue
            entries = self.redis.xrange(key, min=sid, max=sid)
            if entries:
                record = self._read_entry(key, entries[0][0], entries[0][1])
                if record is not None and record.id == id:
                    return record
        return None

    def _replayed_of(self, key: str) -> dict[str, float]:
        marks: dict[str, float] = {}
        for raw_id, raw_at in self.redis.hgetall(f"{key}:replayed").items():
            id_, at = raw_id.decode("utf-8", "replace"), raw_at.decode("utf-8", "replace")
            try:
                marks[id_] = float(at)
            except ValueError:
                self._skip(f"in Redis hash {key}:replayed (id {safe_id(id_)})", f"bad replay time {at[:40]!r}")
        return marks

    def replayed(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for key in self._streams(None):
            out.update(self._replayed_of(key))
        for record in self.iter():
            if record.replayed_at is not None:
                out[record.id] = record.replayed_at
        return out

    def update(self, records: Iterable[DeadLetter]) -> int:
        n = 0
        for record in records:
            key = self.stream_key(record.spider)
            n += self._update(keys=[key, f"{key}:ids"], args=[record.id, seal(record.to_dict())])
        return n

    def mark_replayed(self, ids: Iterable[str]) -> int:
        wanted = set(ids)
        now = time.time()
        new = 0
        for key in self._streams(None):
            known = [i for i in wanted if self.redis.hexists(f"{key}:ids", i)]
            for id_ in known:
                new += self.redis.hsetnx(f"{key}:replayed", id_, repr(now))
        return new

    def purge(self, filters: Filters = ANY) -> int:
        by_key: dict[str, list[tuple[bytes, str]]] = {}
        for key, sid, record in self._entries(filters):
            by_key.setdefault(key, []).append((sid, record.id))
        n = 0
        for key, entries in by_key.items():
            for i in range(0, len(entries), 500):
                chunk = entries[i : i + 500]
                pipe = self.redis.pipeline(transaction=True)
                pipe.xdel(key, *[sid for sid, _ in chunk])
                pipe.hdel(f"{key}:ids", *[id_ for _, id_ in chunk])
                pipe.hdel(f"{key}:replayed", *[id_ for _, id_ in chunk])
                n += pipe.execute()[0]
        return n


def _redis_connection_url(url: str) -> str:
    """The URL without our own query parameters (``prefix``)."""
    parts = urlparse(url)
    query = {k: v for k, v in parse_qs(parts.query).items() if k != "prefix"}
    return urlunparse(parts._replace(query=urlencode(query, doseq=True)))
