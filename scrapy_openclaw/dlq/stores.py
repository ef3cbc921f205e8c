"""Where dead letters live: an append-only JSON-lines file or a Redis stream.

Both stores share one small interface (:class:`DeadLetterStore`) so that the
pipeline and the ``scrapy openclaw-dlq`` command work on either. Records are
:meth:`DeadLetter.to_dict` data, never pickle. A replay marks its
records in place (``replayed_at``, ``replay_outcome``: :meth:`~DeadLetterStore.update`,
for a file an atomic rewrite: temp file, fsync, rename); older stores' separate
"replayed" mark lines are still read. Only ``purge`` removes records.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import sys
import time
from abc import ABC, abstractmethod
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlencode, urlparse, urlunparse

from scrapy_openclaw._files import atomic_writer, open_private, private_dir
from scrapy_openclaw.deadletter import DeadLetter
from scrapy_openclaw.dlq.records import InvalidRecord, check_crc, read_mark, read_record, safe_id, with_crc
from scrapy_openclaw.redact import mask_uri

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

logger = logging.getLogger(__name__)

#: Key of the replayed-mark lines in a JSON-lines store.
MARK = "openclaw_mark"


@dataclass(frozen=True)
class Filters:
    """Which dead letters a command or query is about; ``None`` means any."""

    domain: str | None = None
    error_class: str | None = None
    spider: str | None = None
    since: float | None = None  # UNIX time, compared with ``created_at``
    until: float | None = None
    ids: frozenset[str] | None = None
    include_replayed: bool = True

    def matches(self, record: DeadLetter, replayed: bool = False) -> bool:
        if replayed and not self.include_replayed:
            return False
        if self.ids is not None and record.id not in self.ids:
            return False
        if self.domain is not None and record.domain != self.domain:
            return False
        if self.error_class is not None and record.error_class != self.error_class:
            return False
        if self.spider is not None and record.spider != self.spider:
            return False
        if self.since is not None and record.created_at < self.since:
            return False
        return not (self.until is not None and record.created_at > self.until)


ANY = Filters()


class DeadLetterStore(ABC):
    """The interface every store implements; ``uri`` says where it writes."""

    uri: str

    @property
    def skipped(self) -> dict[str, str]:
        """Unreadable records met so far: where (file and line, or stream entry) -> why."""
        return self.__dict__.setdefault("_skipped", {})

    def _skip(self, where: str, why: Any) -> None:
        """Count an unreadable record and warn about it once per store."""
        if where in self.skipped:
            return
        self.skipped[where] = str(why)
        logger.warning("Skipping dead letter %(where)s: %(why)s", {"where": where, "why": why})

    @abstractmethod
    def append(self, record: DeadLetter) -> None:
        """Store one record; must not lose it even if the backend is down."""

    @abstractmethod
    def iter(self, filters: Filters = ANY) -> Iterator[DeadLetter]:
        """Stored records matching *filters*, oldest first."""

    @abstractmethod
    def replayed(self) -> dict[str, float]:
        """Ids of replayed records -> when they were replayed."""

    @abstractmethod
    def mark_replayed(self, ids: Iterable[str]) -> int:
        """Remember that these records were replayed; returns how many were new marks."""

    def update(self, records: Iterable[DeadLetter]) -> int:
        """Replace stored records by id, in place (replay marks); returns how many were found."""
        raise NotImplementedError

    @abstractmethod
    def purge(self, filters: Filters = ANY) -> int:
        """Delete the matching records (and their marks); returns how many."""

    def get(self, id: str) -> DeadLetter | None:
        for record in self.iter(Filters(ids=frozenset([id]))):
            return record
        return None

    def stats(self, filters: Filters = ANY) -> dict[str, Any]:
        """Counts: total, replayed, by domain and by error class."""
        replayed = self.replayed()
        by_domain: Counter[str] = Counter()
        by_class: Counter[str] = Counter()
        total = done = 0
        for record in self.iter(filters):
            total += 1
            done += record.id in replayed
            by_domain[record.domain or "-"] += 1
            by_class[record.error_class] += 1
        return {
            "total": total,
            "replayed": done,
            "by_domain": dict(by_domain.most_common()),
            "by_class": dict(by_class.most_common()),
        }

    def sync(self) -> None:
        """Make what was appended durable (fsync / retry a buffer); cheap when idle."""

    def pending(self) -> int:
        """Records accepted but not yet in the backend (buffered)."""
        return 0

    def close(self) -> None:
        """Flush and release resources; the store may be reopened by using it."""


# --------------------------------------------------------------------------- jsonl


class JsonlStore(DeadLetterStore):
    """One JSON object per line, appended and flushed per record.

    Safe against partial lines: every line carries a CRC; the reader skips a
    torn, corrupt, unchecked or badly typed line with a warning (naming file,
    line and record id; counted in :attr:`skipped`), and the writer
    starts a fresh line if the file ends mid-line. ``fsync`` is batched: at most
    every ``fsync_interval`` seconds on append, and on :meth:`sync`/:meth:`close`.
    Writers hold a shared ``flock`` on ``<file>.lock`` per append and ``purge``
    an exclusive one, so a purge never loses a record a running crawl appends.
    """

    def __init__(self, path: str | os.PathLike[str], *, fsync_interval: float = 1.0):
        self.path = Path(path)
        self.uri = str(self.path)
        self.fsync_interval = fsync_interval
        self._file: Any = None
        self._dirty = False
        self._synced_at = time.monotonic()

    # writing ---------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self, mode: int) -> Iterator[None]:
        private_dir(self.path.parent)
        fd = open_private(f"{self.path}.lock", os.O_RDWR)
        try:
            fcntl.flock(fd, mode)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _open_for_append(self) -> Any:
        """The append handle, reopened if a purge replaced the file."""
        if self._file is not None:
            try:
                current = os.stat(self.path).st_ino
            except FileNotFoundError:
                current = None
            if current == os.fstat(self._file.fileno()).st_ino:
                return self._file
            self._close_file()
        f = os.fdopen(open_private(self.path, os.O_RDWR | os.O_APPEND), "a+b")  # kept open for appends; 0600
        end = f.seek(0, os.SEEK_END)
        if end:
            f.seek(end - 1)
            if f.read(1) != b"\n":  # a torn last line: never glue a record onto it
                f.write(b"\n")
        self._file = f
        return f

    def _write_line(self, line: str) -> None:
        with self._locked(fcntl.LOCK_SH):
            f = self._open_for_append()
            f.write(line.encode("utf-8") + b"\n")
            f.flush()
        self._dirty = True
        if time.monotonic() - self._synced_at >= self.fsync_interval:
            self.sync()

    def append(self, record: DeadLetter) -> None:
        self._write_line(with_crc(record.to_dict()))

    def mark_replayed(self, ids: Iterable[str]) -> int:
        already = self.replayed()
        new = [i for i in dict.fromkeys(ids) if i not in already]
        now = time.time()
        for id_ in new:
            self._write_line(with_crc({MARK: "replayed", "id": id_, "at": now}))
        self.sync()
        return len(new)

    def sync(self) -> None:
        if self._file is not None and self._dirty:
            os.fsync(self._file.fileno())
            self._dirty = False
        self._synced_at = time.monotonic()

    def _close_file(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.flush()
                os.fsync(self._file.fileno())
            self._file.close()
            self._file = None
            self._dirty = False

    def close(self) -> None:
        self._close_file()

    # reading ---------------------------------------------------------------

    def _lines(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """(where, checked JSON object) per line; torn/corrupt/unchecked lines skipped with a warning."""
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            return
        with f:
            for number, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                where = f"in {self.path}, line {number}"
                try:
                    data = json.loads(raw)
                except (ValueError, UnicodeDecodeError, RecursionError):
                    self._skip(where, "torn last line" if not raw.endswith(b"\n") else "corrupt line (not JSON)")
                    continue
                if isinstance(data, dict):
                    where += f" (id {safe_id(data.get('id'))})"
                try:
                    if not isinstance(data, dict):
                        raise InvalidRecord(f"not a JSON object but {type(data).__name__}")
                    check_crc(data)
                except InvalidRecord as exc:
                    self._skip(where, exc)
                    continue
                yield where, data

    def _scan(self) -> tuple[list[DeadLetter], dict[str, float]]:
        records: list[DeadLetter] = []
        marks: dict[str, float] = {}
        for where, data in self._lines():
            try:
                if MARK in data:
                    if data.get(MARK) != "replayed":
                        raise InvalidRecord(f"unknown mark {repr(data.get(MARK))[:40]}")
                    id_, at = read_mark(data)
                    marks.setdefault(id_, at)
                else:
                    records.append(read_record(data, checksum=False))  # checked by _lines
            except InvalidRecord as exc:
                self._skip(where, exc)
        return records, marks

    def iter(self, filters: Filters = ANY) -> Iterator[DeadLetter]:
        records, marks = self._scan()
        seen: set[str] = set()
        for record in records:
            if record.id in seen:
                continue
            seen.add(record.id)
            if filters.matches(record, record.id in marks or record.replayed_at is not None):
                yield record

    def replayed(self) -> dict[str, float]:
        records, marks = self._scan()
        done = {r.id: r.replayed_at for r in records if r.replayed_at is not None}
        return {**marks, **done}

    def update(self, records: Iterable[DeadLetter]) -> int:
        new = {r.id: r for r in records}
        if not new or not self.path.exists():
            return 0
        with self._locked(fcntl.LOCK_EX):
            self._close_file()
            stored, marks = self._scan()
            found = {r.id for r in stored} & new.keys()
            if found:
                self._rewrite([new.get(r.id, r) for r in stored], marks)
        return len(found)

    def _rewrite(self, records: list[DeadLetter], marks: dict[str, float]) -> None:
        with atomic_writer(self.path) as out:
            for record in records:
                out.write(with_crc(record.to_dict()).encode("utf-8") + b"\n")
            for id_, at in marks.items():
                out.write(with_crc({MARK: "replayed", "id": id_, "at": at}).encode("utf-8") + b"\n")

    def purge(self, filters: Filters = ANY) -> int:
        if not self.path.exists():
            return 0
        with self._locked(fcntl.LOCK_EX):
            self._close_file()
            records, marks = self._scan()
            gone = {r.id for r in records if filters.matches(r, r.id in marks or r.replayed_at is not None)}
            if not gone:
                return 0
            self._rewrite([r for r in records if r.id not in gone], {i: at for i, at in marks.items() if i not in gone})
        return len(gone)


# --------------------------------------------------------------------------- redis

# Adds a record once: a retried XADD after a lost reply must not duplicate it.
_ADD_ONCE = """
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then return 0 end
local sid = redis.call('XADD', KEYS[1], '*', 'id', ARGV[1], 'data', ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], sid)
return 1
"""
# Replaces a record in place (same record id; the entry moves to the stream's end).
_UPDATE = """
local old = redis.call('HGET', KEYS[2], ARGV[1])
if not old then return 0 end
redis.call('XDEL', KEYS[1], old)
local sid = redis.call('XADD', KEYS[1], '*', 'id', ARGV[1], 'data', ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], sid)
return 1
"""


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
        self.redis = client or _redis_client(_redis_connection_url(url), params)
        if type(self.redis).__name__ == "RedisCluster" and "{" not in self.prefix:
            # a Redis Cluster: a stream and its :ids/:replayed hashes must share a slot
            self.prefix = "{" + self.prefix + "}"
        self._add = self.redis.register_script(_ADD_ONCE)
        self._update = self.redis.register_script(_UPDATE)
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
                self._add(keys=[key, f"{key}:ids"], args=[record.id, with_crc(record.to_dict())])
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
            data = json.loads(fields_.get(b"data") or b"null")
        except (ValueError, UnicodeDecodeError, RecursionError):
            self._skip(where, "not JSON")
            return None
        if isinstance(data, dict):
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
            n += self._update(keys=[key, f"{key}:ids"], args=[record.id, with_crc(record.to_dict())])
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


def _redis_client(url: str, params: dict[str, Any]) -> Any:
    """redis-py's client for *url*; its cluster client when *url* points at a Redis Cluster node."""
    import redis

    client = redis.Redis.from_url(url, **params)
    try:
        enabled = int(client.info("cluster").get("cluster_enabled", 0))
    except (redis.RedisError, OSError):
        return client  # unreachable now: buffered and retried like any outage
    if not enabled:
        return client
    from redis.cluster import RedisCluster

    client.close()
    return RedisCluster.from_url(url, **params)


def _redis_connection_url(url: str) -> str:
    """The URL without our own query parameters (``prefix``)."""
    parts = urlparse(url)
    query = {k: v for k, v in parse_qs(parts.query).items() if k != "prefix"}
    return urlunparse(parts._replace(query=urlencode(query, doseq=True)))


# --------------------------------------------------------------------------- factory


def expand_uri(uri: str, spider: str | None) -> str:
    """Fill ``%(name)s`` with the spider name; a clear error if it is needed but unknown."""
    if "%(" not in uri:
        return uri
    if spider is None:
        raise ValueError(f"dead-letter URI {mask_uri(uri)!r} contains %(name)s but no spider name is known")
    try:
        return uri % {"name": spider}
    except (KeyError, ValueError, TypeError) as exc:
        raise ValueError(f"dead-letter URI {mask_uri(uri)!r}: only %(name)s may be substituted ({exc})") from None


def default_uri(settings: Any) -> str:
    """``OPENCLAW_DLQ_URI``, else ``<project>/openclaw-data/%(name)s/deadletters.jsonl``.

    One store per spider for plain, checkpointed and scheduled crawls alike, so
    that ``scrapy openclaw-dlq list SPIDER`` finds all of them. ``<project>``
    is the directory of the Scrapy project's ``scrapy.cfg`` (the working
    directory outside a project), so the path is the same from any directory.
    """
    uri = settings.get("OPENCLAW_DLQ_URI")
    if uri:
        return str(uri)
    return os.path.join(_project_dir(), "openclaw-data", "%(name)s", "deadletters.jsonl")


def _project_dir() -> str:
    from scrapy.utils.conf import closest_scrapy_cfg

    cfg = closest_scrapy_cfg()
    return os.path.dirname(os.path.abspath(cfg)) if cfg else os.getcwd()


def open_store(
    uri: str,
    *,
    spider: str | None = None,
    fsync_interval: float = 1.0,
    schedule: Callable[..., Any] | None = None,
) -> DeadLetterStore:
    """The store for *uri*: ``jsonl://path`` or a plain path, or ``redis://...``.

    ``%(name)s`` in the URI is the spider name. For Redis, ``?prefix=`` sets the
    key prefix (default ``openclaw:dlq``; the stream is ``<prefix>:<spider>``).
    """
    uri = expand_uri(str(uri), spider)
    scheme = urlparse(uri).scheme.lower()
    if scheme in ("redis", "rediss", "unix"):
        prefix = parse_qs(urlparse(uri).query).get("prefix", ["openclaw:dlq"])[0]
        return RedisStore(uri, prefix=prefix, schedule=schedule)
    if scheme == "jsonl":
        path = uri[len("jsonl://") :]
    elif scheme in ("", "file") or len(scheme) == 1:  # a plain (or Windows drive) path
        path = uri[len("file://") :] if scheme == "file" else uri
    else:
        raise ValueError(
            f"dead-letter URI {mask_uri(uri)!r}: unsupported scheme {scheme!r} (use a path, jsonl:// or redis://)"
        )
    if not path:
        raise ValueError(f"dead-letter URI {uri!r} has no path")
    return JsonlStore(os.path.expanduser(path), fsync_interval=fsync_interval)
