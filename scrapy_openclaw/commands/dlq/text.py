"""Dead letters as text for a terminal: times, tables and records made readable.

Stored text is untrusted, so everything printed goes through
:func:`_printable` (no control characters, no terminal escapes).
"""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone
from typing import Any

from scrapy.exceptions import UsageError

from scrapy_openclaw.redact import MASK, SECRET_HEADERS, mask_headers, mask_uri

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_time(value: str, option: str) -> float:
    """A UNIX time from ``1700000000``, an ISO date/time (UTC unless given) or ``2h`` (ago)."""
    value = value.strip()
    match = _RELATIVE.match(value)
    if match:
        return time.time() - float(match.group(1)) * _UNITS[match.group(2)]
    try:
        return float(value)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise UsageError(
            f"{option} {value!r}: expected a UNIX time, an ISO date/time or an age like 30m, 2h, 1d",
            print_help=False,
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def _when(ts: float | None) -> str:
    if not ts:
        return "-"
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _printable(text: str) -> str:
    """Stored text is untrusted: no control characters (terminal escapes) reach the terminal."""
    return "".join(ch if ch.isprintable() else "?" for ch in text)


#: How much of a request body ``show`` prints.
BODY_PREVIEW = 500


def _text(value: Any) -> Any:
    """Stored bytes (``{"__bytes__": base64}``) as text, lists of one value as the value."""
    from scrapy_openclaw.serialization import decode_value

    try:
        value = decode_value(value)
    except Exception:  # a display helper: show what is stored
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, list):
        values = [_text(v) for v in value]
        return values[0] if len(values) == 1 else values
    return value


def readable(data: dict[str, Any]) -> dict[str, Any]:
    """A stored record for a person: headers and body decoded, engine meta, defaults and empty
    fields left out, times in UTC, the traceback as lines."""
    from scrapy_openclaw.deadletter import ENGINE_META

    out = {k: v for k, v in data.items() if v is not None}
    request = data.get("request")
    if isinstance(request, dict):
        shown: dict[str, Any] = {"method": request.get("method"), "url": request.get("url")}
        headers = request.get("headers")
        if isinstance(headers, dict) and headers:
            shown["headers"] = mask_headers({str(k): _text(v) for k, v in headers.items()})
        body = _text(request.get("body"))
        if body:
            text = str(body)
            shown["body"] = text[:BODY_PREVIEW] + (f"... ({len(text)} characters)" if len(text) > BODY_PREVIEW else "")
        meta = request.get("meta")
        if isinstance(meta, dict):
            meta = {k: v for k, v in meta.items() if k not in ENGINE_META}
            if meta:
                shown["meta"] = meta
        for name in ("callback", "errback", "cb_kwargs", "cookies", "priority", "flags", "_class"):
            if request.get(name) not in (None, {}, [], 0):
                shown[name] = request[name]
        out["request"] = shown
    if isinstance(data.get("traceback"), str):
        out["traceback"] = data["traceback"].rstrip("\n").splitlines()
    for name in ("first_attempt_at", "last_attempt_at", "created_at", "replayed_at"):
        if isinstance(data.get(name), (int, float)):
            out[name] = _when(data[name]) + " UTC"
    return out


def masked(data: dict[str, Any]) -> dict[str, Any]:
    """A stored record with its credentials masked (headers, cookies); URLs are masked when printed."""
    request = data.get("request")
    if not isinstance(request, dict):
        return data
    request = dict(request)
    headers = request.get("headers")
    if isinstance(headers, dict):
        request["headers"] = {k: MASK if str(k).lower() in SECRET_HEADERS else v for k, v in headers.items()}
    if request.get("cookies"):
        request["cookies"] = MASK
    return {**data, "request": request}


def format_table(rows: list[list[str]], headers: list[str]) -> str:
    rows = [[mask_uri(_printable(cell)) for cell in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines)
