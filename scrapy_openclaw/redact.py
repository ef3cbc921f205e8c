"""Credentials out of messages: every store or Redis URI we log or print goes through here.

``redis://:secret@host:6379/0`` becomes ``redis://:***@host:6379/0`` (user
names are kept, they help to tell stores apart), and ``?password=...``-style
query parameters are masked too (``OPENCLAW_SECRET_QUERY_PARAMS`` names
them), and so are credential headers (:func:`mask_headers`). Masking is
textual and never raises, so it is safe on anything, including a URI that
does not parse.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["MASK", "SECRET_HEADERS", "configure", "mask_headers", "mask_uri"]

#: Headers whose values are credentials: never printed.
SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key"})

MASK = "***"

# scheme://user:password@ -- the password runs to the last "@" of the authority
# (an unescaped "@" or "/" in it is common in hand-written URLs); over-masking a
# strange URL is fine, printing a secret is not.
_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:@/\s?#]*):(?P<secret>[^\s?#]*)@")
DEFAULT_QUERY_PARAMS = (
    "password|passwd|pass|pwd|secret|token|access_token|api_key|apikey|key|sig|signature|auth|session"
)


def _query_pattern(params: str) -> re.Pattern[str]:
    return re.compile(rf"(?P<head>[?&;](?:[A-Za-z0-9_.\-]*[_.\-])?(?:{params})=)[^&;#\s]*", re.IGNORECASE)


_QUERY = _query_pattern(DEFAULT_QUERY_PARAMS)


def configure(params: str) -> None:
    """Mask the query parameters named one of *params* (a ``|``-separated regex), alone or as the last
    ``_``/``-``/``.`` part of a name (``x_signature``)."""
    global _QUERY
    _QUERY = _query_pattern(params or DEFAULT_QUERY_PARAMS)


def mask_uri(uri: object) -> str:
    """*uri* (or a message holding URIs) with passwords and secret query parameters masked."""
    text = str(uri)
    text = _USERINFO.sub(lambda m: f"{m.group('head')}:{MASK}@", text)
    return _QUERY.sub(lambda m: f"{m.group('head')}{MASK}", text)


def mask_headers(headers: Any) -> dict[str, str]:
    """``{name: value}`` of request or response headers fit to print: credentials masked, URLs too."""
    out: dict[str, str] = {}
    for name, values in dict(headers or {}).items():
        text = name.decode("latin-1") if isinstance(name, bytes) else str(name)
        items = values if isinstance(values, (list, tuple)) else [values]
        shown = [v.decode("latin-1") if isinstance(v, bytes) else str(v) for v in items]
        out[text] = MASK if text.lower() in SECRET_HEADERS else mask_uri(", ".join(shown))
    return out
