"""The append-only journal: one checksummed record per line, written with group commit.

Why lines with a CRC32 in front (``<crc32 hex> <payload>\\n``): a process
killed mid-write leaves at most one torn line at the end, and a flipped bit
anywhere breaks only its own line. The reader checks every line, skips the
bad ones and says how many it dropped, instead of crashing or silently
resuming from damaged state.

Why group commit: an ``fsync`` per scheduled request would cap a crawl at
the disk's sync rate. Records are buffered in memory and written together by a
reactor looping call (every 0.1 s: data in the OS page cache survives a
``kill -9``), and fsynced at most every ``OPENCLAW_CHECKPOINT_FLUSH``
seconds (what survives a power cut). The extension orders each batch so that any prefix of it is a
consistent state (new requests before "done" marks), so losing the unflushed
tail after a kill only costs re-fetching, never a lost request.

The first line of every journal file is a JSON header carrying the format
version; payloads of other lines are small space-separated texts (see
:mod:`scrapy_openclaw.checkpoint.state`).
"""

from __future__ import annotations

import json
import logging
import os
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any


from scrapy_openclaw._files import fsync_dir, open_private

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

logger = logging.getLogger(__name__)

#: Version of the on-disk format (journal and snapshot). Bump on any change.
FORMAT_VERSION = 1


class CheckpointError(Exception):
    """A checkpoint directory cannot be used as it is (the message says what and where)."""


class CheckpointVersionError(CheckpointError):
    """The checkpoint was written by an incompatible format version."""


def encode_line(payload: str) -> bytes:
    """One record: ``<crc32 of payload, 8 hex> <payload>\\n`` (payload has no newline)."""
    body = payload.encode("utf-8")
    return b"%08x %s\n" % (zlib.crc32(body), body)


def decode_line(line: bytes) -> str | None:
    """The payload of a complete record line, or None if its checksum does not match."""
    if len(line) < 10 or line[8:9] != b" " or not line.endswith(b"\n"):
        return None
    body = line[9:-1]
    try:
        if int(line[:8], 16) != zlib.crc32(body):
            return None
        return body.decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return None


def iter_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """``(line number, raw line)`` for every line of *path*; the last one may lack its newline."""
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            yield number, line


@dataclass
class JournalContents:
    """What a journal file held: its header and good payloads, and what was dropped."""

    path: Path
    header: dict[str, Any] | None
    payloads: list[str] = field(default_factory=list)
    corrupt: int = 0  #: bad records followed by good ones
    torn_tail: int = 0  #: bad records at the very end (a write cut short)

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
    format version raises :class:`CheckpointVersionError`.
    """
    contents = JournalContents(path=path, header=None)
    bad_run = 0
    for _number, raw in iter_lines(path):
        payload = decode_line(raw)
        if payload is None:
            bad_run += 1
            continue
        contents.corrupt += bad_run
        bad_run = 0
        if contents.header is None and not contents.payloads and payload.startswith("{"):
            contents.header = _parse_header(payload, path, "journal")
            continue
        if payload.startswith("{"):
            continue  # a header-like line elsewhere: ignore
        contents.payloads.append(payload)
    contents.torn_tail = bad_run
    return contents


def _parse_header(payload: str, path: Path, kind: str) -> dict[str, Any]:
    try:
        header = json.loads(payload)
    except ValueError:
        raise CheckpointError(f"{path}: header line is not JSON") from None
    if not isinstance(header, dict) or header.get("kind") != kind:
        raise CheckpointError(f"{path}: not a {kind} file (header {payload[:80]!r})")
    if header.get("v") != FORMAT_VERSION:
        raise CheckpointVersionError(
            f"{path}: checkpoint format version {header.get('v')!r}, this scrapy-openclaw "
            f"reads version {FORMAT_VERSION}; resume with the matching version or set "
            f"OPENCLAW_CHECKPOINT_RESTART=True to start over"
        )
    return header


class JournalWriter:
    """Appends records to one journal file; :meth:`flush` writes and fsyncs the batch.

    ``append`` only buffers (cheap, on the reactor thread). ``flush`` is
    called by the looping call started with :meth:`start`, by the extension
    before a snapshot, and at close. A failed write (disk full) keeps the
    records buffered and is retried at the next flush; a partly written line
    is terminated so it costs only itself.
    """

    def __init__(self, path: Path, header: dict[str, Any]):
        self.path = path
        self._fd = open_private(path, os.O_WRONLY | os.O_APPEND)
        self._buffer: list[bytes] = []
        self._torn = False
        self.records = 0  #: records made durable so far
        self.failures = 0  #: flushes that raised OSError
        if os.fstat(self._fd).st_size == 0:
            header = {"kind": "journal", "v": FORMAT_VERSION, **header}
            self._buffer.append(encode_line(json.dumps(header, sort_keys=True)))
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
