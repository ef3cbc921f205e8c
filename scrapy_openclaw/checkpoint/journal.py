"""The append-only journal: one sealed record per line, written with group commit.

An ``fsync`` per scheduled request would cap a crawl at the disk's sync rate, so
records are buffered and written together; a torn or damaged line costs only
itself, and the reader counts what it skipped instead of failing. The record
format is in :mod:`scrapy_openclaw.checkpoint.records`.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scrapy_openclaw._files import fsync_dir, open_private
from scrapy_openclaw.checkpoint.records import (  # (re-exported: the format's names as before)
    FORMAT_VERSION as FORMAT_VERSION,
)
from scrapy_openclaw.checkpoint.records import (
    CheckpointError as CheckpointError,
)
from scrapy_openclaw.checkpoint.records import (
    CheckpointVersionError as CheckpointVersionError,
)
from scrapy_openclaw.checkpoint.records import (
    decode_line,
    encode_line,
    header_line,
    iter_lines,
    parse_header,
    sealed_elsewhere,
)
from scrapy_openclaw.checkpoint.refusal import refuses

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

logger = logging.getLogger(__name__)


@dataclass
class JournalContents:
    """What a journal file held: its header and good payloads, and what was dropped."""

    path: Path
    header: dict[str, Any] | None
    payloads: list[str] = field(default_factory=list)
    corrupt: int = 0  #: bad records followed by good ones
    torn_tail: int = 0  #: bad records at the very end (a write cut short)
    refused: int = 0  #: complete lines that fail the store key check (forged, or damaged)

    @property
    def dropped(self) -> int:
        return self.corrupt + self.torn_tail

    @property
    def version(self) -> int | None:
        return None if self.header is None else self.header.get("v")


def read_journal(path: Path) -> JournalContents:
    """Read every checksummed record; bad lines are counted and skipped, never fatal.

    A bad line followed by good ones is *corrupt* (skipped, the rest is kept);
    bad lines at the end are a *torn tail*. A file with a header from another
    format version raises :class:`CheckpointVersionError`, one sealed with
    another store key :class:`CheckpointError`.
    """
    contents = JournalContents(path=path, header=None)
    bad_run = 0
    for number, raw in iter_lines(path):
        payload = decode_line(raw)
        if payload is None:
            if number == 1 and sealed_elsewhere(raw):
                raise CheckpointError(
                    f"{path}: sealed with another store key (OPENCLAW_STORE_KEY changed, or another "
                    "project's key file?): resume with the key that wrote it, or set OPENCLAW_CHECKPOINT_RESTART=True"
                )
            bad_run += 1
            contents.refused += raw.endswith(b"\n")
            continue
        contents.corrupt += bad_run
        bad_run = 0
        if contents.header is None and not contents.payloads and payload.startswith("{"):
            contents.header = parse_header(payload, path, "journal")
            continue
        if payload.startswith("{"):
            continue  # a header-like line elsewhere: ignore
        contents.payloads.append(payload)
    contents.torn_tail = bad_run
    return contents


class JournalWriter:
    """Appends records to one journal file; :meth:`flush` writes and fsyncs the batch.

    ``append`` only buffers (cheap, on the reactor thread). ``flush`` is
    called by the checkpoint's commit, before a snapshot, and at close. A failed write (disk full) keeps the
    records buffered and is retried at the next flush; a partly written line
    is terminated so it costs only itself. Callers order each batch so that any prefix
    of it is a consistent state (new requests before "done" marks): losing the unwritten
    tail after a kill costs re-fetching, never a request.
    """

    def __init__(self, path: Path, header: dict[str, Any], on_refused: Callable[[Path, OSError], None] | None = None):
        self.path = path
        #: told of a write the disk refuses (full, read-only, see :mod:`.refusal`) instead of an error line
        self.on_refused = on_refused
        self._fd = open_private(path, os.O_WRONLY | os.O_APPEND)
        self._buffer: list[bytes] = []
        self._torn = False
        self.records = 0  #: records made durable so far
        self.failures = 0  #: flushes that raised OSError
        if os.fstat(self._fd).st_size == 0:
            self._buffer.append(encode_line(header_line("journal", header)))
            self.flush()
            fsync_dir(path.parent)

    def append(self, payload: str) -> None:
        self._buffer.append(encode_line(payload))

    def extend(self, payloads: list[str]) -> None:
        self._buffer.extend(encode_line(p) for p in payloads)

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def flush(self, fsync: bool = True) -> bool:
        """Write the buffered records (and fsync); False if the disk refused them."""
        if self._fd < 0:
            return False
        if self._buffer:
            data = b"".join(self._buffer)
            if self._torn:
                data = b"\n" + data
            written = 0
            try:
                while written < len(data):
                    written += os.write(self._fd, data[written:])
                if fsync:
                    os.fsync(self._fd)
            except OSError as exc:
                self.failures += 1
                self._torn = 0 < written < len(data) or (self._torn and written == 0)
                if self.on_refused is not None and refuses(exc):
                    self.on_refused(self.path, exc)
                    return False
                logger.error(
                    "Checkpoint journal %(path)s: cannot write %(n)d records (%(error)s); "
                    "keeping them in memory and retrying",
                    {"path": self.path, "n": len(self._buffer), "error": exc},
                )
                return False
            self._torn = False
            self.records += len(self._buffer)
            self._buffer.clear()
        elif fsync:
            try:
                os.fsync(self._fd)
            except OSError:
                return False
        return True

    def close(self) -> bool:
        """Flush what is buffered and close the file."""
        ok = self.flush()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        return ok
