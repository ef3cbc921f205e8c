"""A domain's health fields as read from Redis: untrusted input, each field checked on its own.

A domain's record is one MessagePack map (``health.lua``'s ``h_save``; an
earlier version kept a hash of text fields, still read). Anyone who can write
to Redis can write it (``requests=inf``, ``ctl_hold=1e300``, a megabyte of
text, bytes that are not MessagePack). A field that is not a number in its
range is reported (one warning per domain and field), counted in
``openclaw/redis/invalid_fields`` and left out: the domain keeps this
worker's own value for it. The Lua scripts apply the same bounds when they
load a hash (``health.lua``'s ``h_num``), so a forged value is never acted on.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import msgpack
from redis.exceptions import ResponseError

from scrapy_openclaw.health.registry.record import _COUNTERS
from scrapy_openclaw.health.registry.tuning import _MAX_RATE, _RESUMED, CLOSED, HALF_OPEN, OPEN

if TYPE_CHECKING:
    from collections.abc import Callable

#: A number in a hash is never longer than this (``repr`` of a float is at most 24 characters).
MAX_TEXT = 40
#: Bound on every number (seconds, UNIX times up to the year 2286, rates); the Lua scripts use the same.
MAX_NUMBER = 1e10
#: Fields with a tighter range than ``[-MAX_NUMBER, MAX_NUMBER]``.
RANGES: dict[str, tuple[float, float]] = {
    "health": (0.0, 100.0),
    "rate": (0.0, _MAX_RATE),
    "ctl_rate": (0.0, _MAX_RATE),
    "declared": (0.0, _MAX_RATE),
    "ctl_down": (0, 1),
    "share_fast": (0.0, 1.0),
    "share_slow": (0.0, 1.0),
    "ref_share": (0.0, 1.0),
    "rate_cost": (0.0, 100.0),
    "cuts": (0, _RESUMED),
}
#: Fields that hold times or durations: never negative.
_NOT_NEGATIVE = {"updated", "opened_at", "probe_at", "hold_until", "cooldown", "down_since", "ctl_hold"} | set(
    _COUNTERS
)
OPTIONAL = ("threshold", "latency", "best_latency", "delivered")
CIRCUITS = (CLOSED, OPEN, HALF_OPEN)


#: entries of a domain's record that are not its state: its policy (``pol``, and ``pid`` its id;
#: ``policy``, an earlier version's JSON text), and the scripts' own bookkeeping (``health.lua``:
#: when its TTL was last set, where the limit fit's history starts and whether a hold refilled the bucket there)
NOT_STATE = frozenset({"policy", "pol", "pid", "ttl_at", "fit", "fitfull"})
#: A record is a few KB (the policy is most of it); a larger value is not read.
MAX_RECORD = 1024 * 1024


def unpack_state(blob: bytes | str | None) -> dict[str, Any]:
    """A stored record (a health script's reply, or the key's value) -> its state entries, the
    optional ones it leaves out as None; {} when it is not a MessagePack map."""
    if isinstance(blob, str):
        blob = blob.encode("utf-8", "surrogateescape")
    if not blob or len(blob) > MAX_RECORD:
        return {}
    try:
        record = msgpack.unpackb(blob, raw=False, strict_map_key=False, unicode_errors="replace")
    except Exception:  # (msgpack raises several kinds for bytes that are not one map)
        return {}
    if not isinstance(record, dict):
        return {}
    state = {k: v for k, v in record.items() if isinstance(k, str) and k not in NOT_STATE}
    if "health" in state:
        for name in OPTIONAL:
            state.setdefault(name, None)
    return state


def read_state(server: Any, key: str) -> dict[str, Any]:
    """A domain's record read from Redis (one GET; an earlier version's hash: its text fields)."""
    try:
        raw = server.get(key)
    except ResponseError:  # WRONGTYPE: a hash written by an earlier version
        return {_text(k): _text(v) for k, v in server.hgetall(key).items()}
    return unpack_state(raw)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def shown(value: Any) -> str:
    """A field's value for a warning, cut short."""
    text = value if isinstance(value, str) else repr(value)
    return text[:40] + ("..." if len(text) > 40 else "")


def typed_fields(fields: dict[str, Any], bad: Callable[[str, Any], None]) -> dict[str, Any]:
    """A record's entries (numbers, or an earlier version's text) -> the field types of a local
    registry snapshot; each field that fails its check is handed to *bad* ``(field, value)``
    and left out."""
    out: dict[str, Any] = {}
    for name, value in fields.items():
        if name in NOT_STATE:
            continue
        parsed = _parse(name, value)
        if parsed is _INVALID:
            bad(name, value)
        else:
            out[name] = parsed
    return out


_INVALID = object()


def _parse(name: str, value: Any) -> Any:
    if name == "circuit":
        return value if isinstance(value, str) and value in CIRCUITS else _INVALID
    if name in OPTIONAL and (value is None or value == ""):
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return _INVALID
    if isinstance(value, str):
        if len(value) > MAX_TEXT:
            return _INVALID
        try:
            value = float(value)
        except ValueError:
            return _INVALID
    number = float(value)
    low, high = RANGES.get(name, (0.0 if name in _NOT_NEGATIVE else -MAX_NUMBER, MAX_NUMBER))
    if not (math.isfinite(number) and low <= number <= high):
        return _INVALID
    if name in _COUNTERS:
        return int(number)
    return number
