"""JSON for scrapy-redis's ``SCHEDULER_SERIALIZER`` hook: requests as data, never pickle.

scrapy-redis's default serializer is pickle, so anyone who can write to the queue
key can run code on every worker. ``dumps`` seals the JSON with the store key
(``{"_mac":"<hex>",...}``); ``loads`` checks the size and the seal before parsing
a byte, and raises :class:`RefusedPayload`, which the queue moves aside unrun.
"""

from __future__ import annotations

import json
from typing import Any

from scrapy_openclaw.exceptions import RefusedPayload as RefusedPayload  # (re-exported)
from scrapy_openclaw.serialization import dumps as _json_dumps
from scrapy_openclaw.serialization import signing

__all__ = ["RefusedPayload", "UnsealedPayload", "dumps", "loads"]

_PICKLE_PROTO = 0x80  # protocol 2+ pickles start with PROTO (0x80)
#: Larger entries are refused unread: a queued request with a body of a few MB is plenty
#: (a 15 MB forged entry took a worker from 93 MB to 927 MB while it was parsed).
MAX_ENTRY_BYTES = 8 * 1024 * 1024
_PURPOSE = "queue"
_HEAD = b'{"_mac":"'
_BODY = len(_HEAD) + signing.MAC_LEN + 2  # where the request's JSON resumes, after '",'


class UnsealedPayload(RefusedPayload):
    """An entry without a valid seal: written by someone without the store key."""


def _describe(raw: bytes) -> str:
    if raw[:1] == bytes([_PICKLE_PROTO]) or raw[:1] in (b"(", b"c", b"]", b"}", b"S", b"I"):
        return "a pickle payload (refused: unpickling would run code)"
    return f"not a JSON request ({raw[:40]!r})"


def dumps(obj: Any) -> str:
    """Compact JSON of a request dict (from ``request_to_data``), sealed."""
    body = _json_dumps(obj)
    mac = signing.current().mac(_PURPOSE, body.encode("utf-8"))
    return f'{_HEAD.decode()}{mac}",{body[1:]}'


def loads(raw: bytes | str) -> dict[str, Any]:
    """Parse a sealed request dict; :class:`RefusedPayload` for anything else."""
    data = raw.encode("utf-8", "surrogateescape") if isinstance(raw, str) else bytes(raw)
    if len(data) > MAX_ENTRY_BYTES:
        raise RefusedPayload(f"queue entry of {len(data)} bytes is larger than {MAX_ENTRY_BYTES} (not read)")
    if not data.lstrip().startswith(b"{"):
        raise RefusedPayload(f"queue entry is {_describe(data)}")
    body = b"{" + data[_BODY:]
    if not (
        data.startswith(_HEAD)
        and data[_BODY - 2 : _BODY] == b'",'
        and signing.current().check(_PURPOSE, body, data[len(_HEAD) : _BODY - 2])
    ):
        raise UnsealedPayload("queue entry fails the store key check (not written by this crawl's workers)")
    try:
        obj = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise RefusedPayload(f"queue entry is not valid JSON: {exc}") from None
    except RecursionError:
        raise RefusedPayload("queue entry is JSON nested too deeply") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("url"), str):
        raise RefusedPayload("queue entry is JSON but not a serialised request (no 'url')")
    return obj
