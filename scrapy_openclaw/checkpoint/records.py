"""The checkpoint's record format, written and read in one place.

Every line of a journal or snapshot file is ``<MAC of payload, 32 hex> <payload>\\n``,
sealed with the store key (:mod:`scrapy_openclaw.serialization.signing`): a torn
tail, a flipped bit or a line written without the key is found line by line. The
first line is a JSON header with ``kind`` and the format version.
"""

from __future__ import annotations

import json
import logging
import os
import zlib
from typing import TYPE_CHECKING, Any

from scrapy_openclaw._files import open_existing
from scrapy_openclaw.checkpoint.feeds import parse_outputs
from scrapy_openclaw.exceptions import CheckpointError as CheckpointError  # (re-exported)
from scrapy_openclaw.exceptions import CheckpointVersionError as CheckpointVersionError
from scrapy_openclaw.serialization import signing

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from scrapy_openclaw.checkpoint.state import RecoveredState

logger = logging.getLogger(__name__)

#: Version of the on-disk format (journal and snapshot) written. Bump on any change.
#: 2: the ``D`` record (durable outputs); a reader of version 1 skipped it without a word and
#: would have fetched again the pages whose items the outputs already hold.
#: 3: lines sealed with the store key instead of a CRC32 anyone can recompute.
FORMAT_VERSION = 3
#: Versions read: 1 and 2 (CRC32 lines) only with ``OPENCLAW_STORE_ACCEPT_UNSIGNED``.
READABLE_VERSIONS = (1, 2, 3)
_PURPOSE = "checkpoint"
_MAC = signing.MAC_LEN


# --- lines ------------------------------------------------------------------------------


def encode_line(payload: str) -> bytes:
    """One record: ``<MAC of payload, 32 hex> <payload>\\n`` (payload has no newline)."""
    body = payload.encode("utf-8")
    return b"%s %s\n" % (signing.current().mac(_PURPOSE, body).encode("ascii"), body)


def decode_line(line: bytes) -> str | None:
    """The payload of a complete record line, or None if it is torn or fails the key check.

    An unsigned header of an older version raises :class:`CheckpointVersionError`
    with advice, unless ``OPENCLAW_STORE_ACCEPT_UNSIGNED`` lets it be read.
    """
    if not line.endswith(b"\n"):
        return None
    key = signing.current()
    if line[8:9] != b" ":
        body = line[_MAC + 1 : -1]
        if line[_MAC : _MAC + 1] != b" " or not key.check(_PURPOSE, body, line[:_MAC]):
            return None
    else:
        unsigned = _unsigned_body(line)
        if unsigned is None:
            return None
        body = unsigned
        if not key.accept_unsigned:
            if body.startswith(b'{"') and b'"kind"' in body:
                raise CheckpointVersionError(
                    "checkpoint written by an older scrapy-openclaw (lines not sealed with the store key): "
                    "finish it with that version, set OPENCLAW_STORE_ACCEPT_UNSIGNED=True to trust it once, "
                    "or OPENCLAW_CHECKPOINT_RESTART=True to start over"
                )
            return None
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return None


def sealed_elsewhere(line: bytes) -> bool:
    """Whether *line* (that failed :func:`decode_line`) is a header sealed with another key."""
    return line[_MAC : _MAC + 3] == b' {"' and b'"kind"' in line[:200] and line.endswith(b"\n")


def _unsigned_body(line: bytes) -> bytes | None:
    """The payload of a CRC32 line (format versions 1 and 2), or None."""
    if len(line) < 10 or line[8:9] != b" ":
        return None
    body = line[9:-1]
    try:
        return body if int(line[:8], 16) == zlib.crc32(body) else None
    except ValueError:
        return None


def iter_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """``(line number, raw line)`` for every line of *path*; the last one may lack its newline."""
    with os.fdopen(open_existing(path, os.O_RDONLY), "rb") as f:  # never through a symlink
        yield from enumerate(f, 1)


def header_line(kind: str, header: dict[str, Any]) -> str:
    """The first payload of a *kind* ("journal", "snapshot") file."""
    return json.dumps({"kind": kind, "v": FORMAT_VERSION, **header}, sort_keys=True)


def parse_header(payload: str, path: Path, kind: str) -> dict[str, Any]:
    """The header of a *kind* file; CheckpointError if it is not one, CheckpointVersionError
    if another format version wrote it."""
    try:
        header = json.loads(payload)
    except ValueError:
        raise CheckpointError(f"{path}: header line is not JSON") from None
    if not isinstance(header, dict) or header.get("kind") != kind:
        raise CheckpointError(f"{path}: not a {kind} file (header {payload[:80]!r})")
    version = header.get("v")
    if version in (1, 2) and not isinstance(version, bool):
        logger.warning(
            "%(path)s: an unsigned checkpoint of an older version, read because OPENCLAW_STORE_ACCEPT_UNSIGNED "
            "is set: it is trusted as it is",
            {"path": path},
        )
    if isinstance(version, bool) or version not in READABLE_VERSIONS:
        raise CheckpointVersionError(
            f"{path}: checkpoint format version {header.get('v')!r}, this scrapy-openclaw "
            f"reads versions {READABLE_VERSIONS[0]}-{FORMAT_VERSION}; resume with the matching version or set "
            f"OPENCLAW_CHECKPOINT_RESTART=True to start over"
        )
    return header


# --- journal payloads -------------------------------------------------------------------


def live_record(rid: int, state: str, fp: str | None, data: str) -> str:
    return f"a {rid} {state} {fp or '-'} {data}"


def in_flight_record(rid: int) -> str:
    return f"f {rid}"


def start_seen_record(fp: str) -> str:
    return f"S {fp}"


def done_record(done: list[int], seen: list[str], outputs: dict[str, Any] | None = None) -> str:
    """``D {"d": [ids finished], "s": [fingerprints seen], "o": {output: state}}``: one line, so atomic.

    ``s`` holds the fingerprints of requests that finished before they were journaled. An
    output is a feed (``feed:<FEEDS key>``: URI, batch id, byte offset to resume from,
    items) or an opted-in pipeline (``writer:<name>``: marker, items); see
    :mod:`scrapy_openclaw.checkpoint.feeds`. The outputs were written before the record,
    so the pages it marks done have their items in them, below those offsets.
    """
    record: dict[str, Any] = {"d": done, "s": seen}
    if outputs:
        record["o"] = outputs
    return "D " + json.dumps(record, separators=(",", ":"))


def outputs_record(outputs: dict[str, Any]) -> str:
    """Durable outputs' starting points, journaled before any of their bytes."""
    return "D " + json.dumps({"o": outputs}, separators=(",", ":"))


def apply_payloads(state: RecoveredState, payloads: list[str]) -> None:
    """Replay journal records onto *state* (idempotent, order-sensitive).

    The payloads: ``a <id> <state p|f> <fingerprint hex|-> <request JSON>`` a live request
    (new or changed), ``f <id>`` popped (in flight), ``S <fingerprint hex>`` a start
    request's fingerprint, ``D <JSON>`` pages done with the durable outputs
    (:func:`done_record`). ``d <id>`` (finished) and ``s <fingerprint hex>`` (seen) are
    what format 1 wrote instead of ``D``.
    """
    requests, fps = state.requests, state.fingerprints
    next_id = state.next_id
    for payload in payloads:
        op = payload[:1]
        try:
            if op == "a":
                _, rid_s, st, fp, data = payload.split(" ", 4)
                rid = int(rid_s)
                requests[rid] = [st, data, None if fp == "-" else fp]
                if fp != "-":
                    fps.add(bytes.fromhex(fp))
                next_id = max(next_id, rid + 1)
            elif op == "d":
                requests.pop(int(payload[2:]), None)
            elif op == "f":
                entry = requests.get(int(payload[2:]))
                if entry is not None:
                    entry[0] = "f"
            elif op == "s":
                fps.add(bytes.fromhex(payload[2:]))
            elif op == "S":
                state.start_fingerprints.add(bytes.fromhex(payload[2:]))
            elif op == "D":
                _apply_done(state, json.loads(payload[2:]))
        except (ValueError, TypeError, AttributeError):
            state.warnings.append(f"ignored an unreadable journal record {payload[:60]!r}")
    state.next_id = next_id


def _apply_done(state: RecoveredState, record: Any) -> None:
    if not isinstance(record, dict):
        raise ValueError("not an object")
    done, seen = record.get("d", []), record.get("s", [])
    if not isinstance(done, list) or not isinstance(seen, list):
        raise ValueError("bad lists")
    fps = [bytes.fromhex(fp) for fp in seen]  # ValueError/TypeError before anything changes
    rids = [int(rid) for rid in done if isinstance(rid, int)]
    outputs, bad = parse_outputs(record.get("o", {}))
    if bad:
        state.warnings.append(f"ignored invalid output state(s) {', '.join(bad[:5])} in a journal record")
    for rid in rids:
        state.requests.pop(rid, None)
    state.fingerprints.update(fps)
    state.outputs.update(outputs)


# --- snapshot payloads ------------------------------------------------------------------


def request_line(request_id: int, state: str, data: str) -> str:
    """A snapshot's ``<id> <state> <request JSON>`` line; fingerprint and end lines follow them."""
    return f"{request_id} {state} {data}"


def parse_request_line(payload: str) -> tuple[int, str, str]:
    rid, state, data = payload.split(" ", 2)
    return int(rid), state, data
