"""A domain's health fields as read from Redis: untrusted input, each field checked on its own.

Anyone who can write to Redis can write a domain's hash (``requests=inf``,
``ctl_hold=1e300``, a megabyte of text). A field that is not a number in its
range is reported (one warning per domain and field), counted in
``openclaw/redis/invalid_fields`` and left out: the domain keeps this
worker's own value for it. The Lua scripts apply the same bounds when they
load a hash (``health.lua``'s ``h_num``), so a forged value is never acted on.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

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
    "cuts": (0, _RESUMED),
}
#: Fields that hold times or durations: never negative.
_NOT_NEGATIVE = {"updated", "opened_at", "probe_at", "hold_until", "cooldown", "down_since", "ctl_hold"} | set(
    _COUNTERS
)
OPTIONAL = ("threshold", "latency", "best_latency", "delivered")
CIRCUITS = (CLOSED, OPEN, HALF_OPEN)


#: fields of a domain's hash that are not its state: its policy, and the scripts' own bookkeeping
#: (``health.lua``: when its TTL was last set, where the limit fit's history starts)
NOT_STATE = frozenset({"policy", "ttl_at", "fit"})


def typed_fields(fields: dict[str, str], bad: Callable[[str, str], None]) -> dict[str, Any]:
    """Redis hash strings -> the field types of a local registry snapshot; each field that
    fails its check is handed to *bad* ``(field, value)`` and left out."""
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


def _parse(name: str, value: str) -> Any:
    if len(value) > MAX_TEXT:
        return _INVALID
    if name == "circuit":
        return value if value in CIRCUITS else _INVALID
    if name in OPTIONAL and value == "":
        return None
    try:
        number = float(value)
    except ValueError:
        return _INVALID
    low, high = RANGES.get(name, (0.0 if name in _NOT_NEGATIVE else -MAX_NUMBER, MAX_NUMBER))
    if not (math.isfinite(number) and low <= number <= high):
        return _INVALID
    if name in _COUNTERS:
        return int(number)
    return number
