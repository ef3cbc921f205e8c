"""Reading dead letters back: the one validating reader every store and command uses.

A store is untrusted input (a hand-edited file, a Redis stream other tools write
to), so a record's seal, format version and field types are checked before
anything uses it. A bad record raises :class:`InvalidRecord`; the stores skip it
with a counted warning, so one bad record never breaks the tooling for everybody.
"""

from __future__ import annotations

import json
import logging
import math
import re
import zlib
from dataclasses import fields
from typing import Any

from scrapy_openclaw.deadletter import FORMAT_VERSION, DeadLetter
from scrapy_openclaw.exceptions import InvalidRecord as InvalidRecord  # (re-exported)
from scrapy_openclaw.serialization import dumps, signing

__all__ = ["MAC", "InvalidRecord", "UnsealedRecord", "read_mark", "read_record", "safe_id", "seal", "unseal"]

logger = logging.getLogger(__name__)

MAC = "_mac"
_CRC = "_crc"  # older versions' unsigned checksum
_PURPOSE = "dead-letter"
_HEAD = '{"_mac":"'
#: A stored record beyond this is not a dead letter we wrote (a request with its body, an item).
MAX_RECORD_BYTES = 16 * 1024 * 1024
#: What our ids look like (uuid4 hex); anything else might be a terminal escape or a path.
_ID = re.compile(r"[0-9A-Za-z_.:-]{1,128}")

_STR, _NUM, _INT, _OBJ, _ANY = (str,), "number", "int", (dict,), None
_FIELD_TYPES: dict[str, Any] = {
    "url": _STR,
    "domain": _STR,
    "error_class": _STR,
    "reason": _STR,
    "spider": _STR,
    "crawl_id": _STR,
    "method": _STR,
    "status": _INT,
    "attempts": _INT,
    "exception_type": _STR,
    "exception_message": _STR,
    "traceback": _STR,
    "first_attempt_at": _NUM,
    "last_attempt_at": _NUM,
    "request": _OBJ,
    "item": _ANY,
    "validation_error": _STR,
    "replayed_at": _NUM,
    "replay_outcome": _STR,
    "replays": _INT,
    "id": _STR,
    "created_at": _NUM,
    "version": _INT,
}
#: Fields a record must have; the others fall back to DeadLetter's defaults.
_REQUIRED = ("id", "version", "created_at", "url", "domain", "error_class", "reason", "spider", "crawl_id")
_NULLABLE = {f.name for f in fields(DeadLetter) if f.default is None}


class UnsealedRecord(InvalidRecord):
    """A record that fails the store key check: forged, edited, damaged, or sealed with another key."""


def seal(data: dict[str, Any]) -> str:
    """The JSON line of *data*, its MAC first: ``{"_mac":"<hex>",<the rest of the JSON>}``."""
    body = dumps(data)
    mac = signing.current().mac(_PURPOSE, body.encode("utf-8"))
    return f'{_HEAD}{mac}"' + ("," + body[1:] if len(body) > 2 else "}")


def unseal(raw: bytes | str) -> dict[str, Any]:
    """The JSON object of a sealed line, verified before it is parsed; :class:`InvalidRecord` if not.

    An unsigned record of an older version (a CRC32 anyone can recompute) is
    refused unless ``OPENCLAW_STORE_ACCEPT_UNSIGNED`` is set.
    """
    if len(raw) > MAX_RECORD_BYTES:
        raise UnsealedRecord(f"{len(raw)} bytes, larger than a dead letter may be ({MAX_RECORD_BYTES})")
    text = raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else raw
    text = text.rstrip("\r\n")
    key = signing.current()
    end = len(_HEAD) + signing.MAC_LEN
    if not text.startswith(_HEAD):
        return _unsigned(text, key)
    rest = text[end + 1 :]
    body = "{" + rest[1:] if text[end : end + 1] == '"' and rest[:1] == "," else "{}" if rest == "}" else None
    encoded = None if body is None else body.encode("utf-8", "surrogateescape")
    if encoded is None or not key.check(_PURPOSE, encoded, text[len(_HEAD) : end]):
        raise UnsealedRecord("fails the store key check (forged, edited, damaged, or sealed with another key)")
    return _json_object(encoded)


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise InvalidRecord("corrupt line (not JSON)") from None
    if not isinstance(data, dict):
        raise InvalidRecord(f"not a JSON object but {type(data).__name__}")
    return data


def _unsigned(text: str, key: signing.StoreKey) -> dict[str, Any]:
    data = _json_object(text.encode("utf-8", "surrogateescape"))
    crc = data.pop(_CRC, None)
    if crc is None:
        raise UnsealedRecord("not sealed (not written by scrapy-openclaw, or edited by hand)")
    try:
        body = dumps(data)
    except (TypeError, ValueError) as exc:  # e.g. keys of mixed types: no JSON line reads back like that
        raise InvalidRecord(f"not JSON data ({exc})") from None
    if crc != zlib.crc32(body.encode("utf-8")):
        raise InvalidRecord("checksum mismatch (corrupt or edited)")
    if not key.accept_unsigned:
        raise UnsealedRecord(
            "unsigned, from an older scrapy-openclaw: set OPENCLAW_STORE_ACCEPT_UNSIGNED=True to read it "
            "(a replay then stores it again sealed)"
        )
    return data


def safe_id(value: Any) -> str:
    """*value* as an id fit for a log line: ours as is, anything else as a short repr."""
    if isinstance(value, str) and _ID.fullmatch(value):
        return value
    return repr(value)[:40]


def _type_error(name: str, value: Any, expected: str) -> InvalidRecord:
    return InvalidRecord(f"field {name!r} is {type(value).__name__} {repr(value)[:40]}, expected {expected}")


def _check_field(name: str, value: Any) -> None:
    kind = _FIELD_TYPES[name]
    if kind is _ANY or (value is None and name in _NULLABLE):
        return
    if kind == _NUM:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise _type_error(name, value, "a finite number")
    elif kind == _INT:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _type_error(name, value, "a whole number")
    elif not isinstance(value, kind):
        raise _type_error(name, value, "a string" if kind is _STR else "an object")


def read_record(data: Any) -> DeadLetter:
    """A validated :class:`DeadLetter` from unsealed *data*; :class:`InvalidRecord` says what is wrong."""
    if not isinstance(data, dict):
        raise InvalidRecord(f"not a JSON object but {type(data).__name__}")
    missing = [name for name in _REQUIRED if name not in data]
    if missing:
        raise InvalidRecord(f"missing field(s) {', '.join(missing)}")
    if data["version"] != FORMAT_VERSION or isinstance(data["version"], bool):
        raise InvalidRecord(
            f"unknown format version {repr(data['version'])[:20]} (this scrapy-openclaw reads {FORMAT_VERSION})"
        )
    for name in _FIELD_TYPES:
        if name in data:
            _check_field(name, data[name])
    if not _ID.fullmatch(data["id"]):
        raise InvalidRecord(f"field 'id' {data['id'][:40]!r} is not a record id")
    return DeadLetter(**{name: data[name] for name in _FIELD_TYPES if name in data})


def read_mark(data: dict[str, Any]) -> tuple[str, float]:
    """(id, time) of a "replayed" mark line (checksum already verified)."""
    id_, at = data.get("id"), data.get("at")
    if not isinstance(id_, str) or not _ID.fullmatch(id_):
        raise InvalidRecord(f"replayed mark with a bad id {repr(id_)[:40]}")
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at):
        raise InvalidRecord(f"replayed mark of {id_} with a bad time {repr(at)[:40]}")
    return id_, float(at)
