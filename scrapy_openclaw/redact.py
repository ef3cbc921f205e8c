"""Credentials out of messages: every store or Redis URI we log or print goes through here.

``redis://:secret@host:6379/0`` becomes ``redis://:***@host:6379/0`` (user
names are kept, they help to tell stores apart), and ``?password=...``-style
query parameters are masked too. Masking is textual and never raises, so it is
safe on anything, including a URI that does not parse.
"""

from __future__ import annotations

import re

__all__ = ["MASK", "mask_uri"]

MASK = "***"

# scheme://user:password@ -- the password runs to the last "@" of the authority
# (an unescaped "@" or "/" in it is common in hand-written URLs); over-masking a
# strange URL is fine, printing a secret is not.
_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:@/\s?#]*):(?P<secret>[^\s?#]*)@")
_QUERY = re.compile(
    r"(?P<head>[?&;](?:password|passwd|pass|pwd|secret|token|access_token|api_key|apikey)=)[^&;#\s]*",
    re.IGNORECASE,
)


def mask_uri(uri: object) -> str:
    """*uri* (or a message holding URIs) with passwords and secret query parameters masked."""
    text = str(uri)
    text = _USERINFO.sub(lambda m: f"{m.group('head')}:{MASK}@", text)
    return _QUERY.sub(lambda m: f"{m.group('head')}{MASK}", text)
