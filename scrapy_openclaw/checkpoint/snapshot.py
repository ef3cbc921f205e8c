"""Atomic, sealed, versioned snapshots of the whole crawl state.

A snapshot compacts the journal (every live request, the seen fingerprints, the
health and the stats), so the journals before it can be deleted. It is all or
nothing: written through a temp file and a rename, with an end line whose counts
prove it complete, so a damaged one is rejected whole for the previous one.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from scrapy_openclaw._files import atomic_writer
from scrapy_openclaw.checkpoint.records import (
    FORMAT_VERSION,
    decode_line,
    encode_line,
    iter_lines,
    parse_header,
    parse_request_line,
    request_line,
)
from scrapy_openclaw.exceptions import CorruptSnapshot as CorruptSnapshot  # (re-exported)

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable

#: Fingerprints per snapshot line (one base64 blob each).
_FP_CHUNK = 4096
_WRITE_CHUNK = 8192


@dataclass
class Snapshot:
    path: Path
    header: dict[str, Any]
    #: ``(request id, state "p"|"f", request data as JSON text)``
    requests: list[tuple[int, str, str]] = field(default_factory=list)
    fingerprints: set[bytes] = field(default_factory=set)

    @property
    def generation(self) -> int:
        return int(self.header.get("gen", 0))

    @property
    def finished(self) -> bool:
        return bool(self.header.get("finished"))


def write_snapshot(
    path: Path,
    header: dict[str, Any],
    requests: Iterable[tuple[int, str, str]],
    fingerprints: Collection[bytes],
    *,
    opener: Callable[[Path], IO[bytes]] | None = None,
) -> int:
    """Write a snapshot atomically; return its size in bytes.

    Temp file, fsync, rename over *path*, directory fsync: a reader sees the previous
    snapshot or the new one, never half of one. *opener* opens the temp file (default: an exclusive new file next to *path*); tests
    pass one whose writes fail, to prove a failed snapshot keeps the old one.
    Raises OSError (after removing the temp file) when the write fails, leaving the
    previous snapshot in place.
    """
    fps = list(fingerprints)
    fp_len = len(fps[0]) if fps else 0
    fixed = all(len(fp) == fp_len for fp in fps)
    size = 0
    n_requests = n_fp_lines = 0
    with atomic_writer(path, opener=opener) as f:
        head = {"kind": "snapshot", "v": FORMAT_VERSION, **header, "fp_len": fp_len if fixed else 0}
        chunk = [encode_line(json.dumps(head, sort_keys=True))]
        for rid, state, data in requests:
            chunk.append(encode_line(request_line(rid, state, data)))
            n_requests += 1
            if len(chunk) >= _WRITE_CHUNK:
                size += f.write(b"".join(chunk))
                chunk = []
        if fixed:
            for i in range(0, len(fps), _FP_CHUNK):
                blob = base64.b64encode(b"".join(fps[i : i + _FP_CHUNK])).decode("ascii")
                chunk.append(encode_line(f"fp {blob}"))
                n_fp_lines += 1
        else:  # variable-length fingerprints (a custom fingerprinter): one per line
            for fp in fps:
                chunk.append(encode_line(f"fp1 {base64.b64encode(fp).decode('ascii')}"))
                n_fp_lines += 1
        end = {"kind": "end", "requests": n_requests, "fingerprint_lines": n_fp_lines, "fingerprints": len(fps)}
        chunk.append(encode_line(json.dumps(end, sort_keys=True)))
        size += f.write(b"".join(chunk))
    return size


def read_snapshot(path: Path) -> Snapshot:
    """Read and verify a whole snapshot; :class:`CorruptSnapshot` says what is wrong."""
    header: dict[str, Any] | None = None
    snapshot: Snapshot | None = None
    end: dict[str, Any] | None = None
    fp_lines = 0
    for number, raw in iter_lines(path):
        payload = decode_line(raw)
        if payload is None:
            what = "truncated" if not raw.endswith(b"\n") else "checksum mismatch"
            raise CorruptSnapshot(f"{path}: line {number}: {what}")
        if end is not None:
            raise CorruptSnapshot(f"{path}: line {number}: data after the end record")
        if header is None:
            if not payload.startswith("{"):
                raise CorruptSnapshot(f"{path}: line 1 is not a snapshot header")
            header = parse_header(payload, path, "snapshot")
            snapshot = Snapshot(path=path, header=header)
            continue
        assert snapshot is not None
        if payload.startswith("{"):
            end = json.loads(payload)
            continue
        if payload.startswith("fp "):
            blob = base64.b64decode(payload[3:])
            step = int(header.get("fp_len") or 0)
            if step <= 0 or len(blob) % step:
                raise CorruptSnapshot(f"{path}: line {number}: bad fingerprint block")
            snapshot.fingerprints.update(blob[i : i + step] for i in range(0, len(blob), step))
            fp_lines += 1
        elif payload.startswith("fp1 "):
            snapshot.fingerprints.add(base64.b64decode(payload[4:]))
            fp_lines += 1
        else:
            try:
                snapshot.requests.append(parse_request_line(payload))
            except ValueError:
                raise CorruptSnapshot(f"{path}: line {number}: bad request record") from None
    if snapshot is None:
        raise CorruptSnapshot(f"{path}: empty file")
    if end is None or end.get("kind") != "end":
        raise CorruptSnapshot(f"{path}: truncated (no end record)")
    if end.get("requests") != len(snapshot.requests) or end.get("fingerprint_lines") != fp_lines:
        raise CorruptSnapshot(
            f"{path}: incomplete: end record counts {end.get('requests')} requests and "
            f"{end.get('fingerprint_lines')} fingerprint lines, found "
            f"{len(snapshot.requests)} and {fp_lines}"
        )
    return snapshot
