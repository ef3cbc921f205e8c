"""The JSON-lines dead-letter store: an append-only file, one sealed record per line.

A replay marks records in place by an atomic rewrite (temp file, fsync,
rename); older files' separate "replayed" mark lines are still read. A
``flock`` on ``<file>.lock`` keeps a purge from losing a running crawl's append.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy_openclaw._files import atomic_writer, open_private, private_dir
from scrapy_openclaw.dlq.records import InvalidRecord, read_mark, read_record, safe_id, seal, unseal
from scrapy_openclaw.dlq.stores.base import ANY, DeadLetterStore, Filters

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from scrapy_openclaw.deadletter import DeadLetter

#: Key of the replayed-mark lines in a JSON-lines store.
MARK = "openclaw_mark"


class JsonlStore(DeadLetterStore):
    """One JSON object per line, appended and flushed per record.

    Safe against partial lines and forgery: every line carries a MAC (the store key's); the reader skips a
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
        self._write_line(seal(record.to_dict()))

    def mark_replayed(self, ids: Iterable[str]) -> int:
        already = self.replayed()
        new = [i for i in dict.fromkeys(ids) if i not in already]
        now = time.time()
        for id_ in new:
            self._write_line(seal({MARK: "replayed", "id": id_, "at": now}))
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
                if not raw.endswith(b"\n"):
                    self._skip(where, "torn last line")
                    continue
                try:
                    data = unseal(raw)
                except InvalidRecord as exc:
                    self._skip(where, exc)
                    continue
                yield f"{where} (id {safe_id(data.get('id'))})", data

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
                    records.append(read_record(data))
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
                out.write(seal(record.to_dict()).encode("utf-8") + b"\n")
            for id_, at in marks.items():
                out.write(seal({MARK: "replayed", "id": id_, "at": at}).encode("utf-8") + b"\n")

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
