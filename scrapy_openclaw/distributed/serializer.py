"""JSON for scrapy-redis's ``SCHEDULER_SERIALIZER`` hook: requests as data, never pickle.

scrapy-redis's default serializer is pickle, so anyone who can write to the queue
key can run code on every worker. ``dumps`` seals the JSON with the store key
(``{"_mac":"<seal>",...}``: the 128-bit HMAC in 22 base64url characters; entries
written before 2026-12-06 carry it as 32 hex characters, still read); ``loads``
checks the size and the seal before parsing a byte, and raises
:class:`RefusedPayload`, which the queue moves aside unrun.
"""

from __future__ import annotations

import base64
import binascii
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
_SEAL = 22  # base64url characters of the 16-byte MAC (signing.MAC_LEN hex characters)


class UnsealedPayload(RefusedPayload):
    """An entry without a valid seal: written by someone without the store key."""


def _describe(raw: bytes) -> str:
    if raw[:1] == bytes([_PICKLE_PROTO]) or raw[:1] in (b"(", b"c", b"]", b"}", b"S", b"I"):
        return "a pickle payload (refused: unpickling would run code)"
    return f"not a JSON request ({raw[:40]!r})"


def _seal(mac_hex: str) -> str:
    return base64.urlsafe_b64encode(bytes.fromhex(mac_hex)).rstrip(b"=").decode("ascii")


def _as_hex(seal: bytes) -> str | None:
    """A seal as ``signing`` writes a MAC (hex); None when it is not one."""
    if len(seal) == signing.MAC_LEN:
        return seal.decode("ascii", "replace")  # (an entry written before 2026-12-06)
    try:
        return base64.urlsafe_b64decode(seal + b"==").hex()
    except (binascii.Error, ValueError):
        return None


def dumps(obj: Any) -> str:
    """Compact JSON of a request dict (from ``request_to_data``), sealed."""
    body = _json_dumps(obj)
    mac = signing.current().mac(_PURPOSE, body.encode("utf-8"))
    return f'{_HEAD.decode()}{_seal(mac)}",{body[1:]}'


def loads(raw: bytes | str) -> dict[str, Any]:
    """Parse a sealed request dict; :class:`RefusedPayload` for anything else."""
    data = raw.encode("utf-8", "surrogateescape") if isinstance(raw, str) else bytes(raw)
    if len(data) > MAX_ENTRY_BYTES:
        raise RefusedPayload(f"queue entry of {len(data)} bytes is larger than {MAX_ENTRY_BYTES} (not read)")
    if not data.lstrip().startswith(b"{"):
        raise RefusedPayload(f"queue entry is {_describe(data)}")
    end = next(
        (len(_HEAD) + n for n in (_SEAL, signing.MAC_LEN) if data[len(_HEAD) + n : len(_HEAD) + n + 2] == b'",'), 0
    )
    mac = _as_hex(data[len(_HEAD) : end]) if end and data.startswith(_HEAD) else None
    body = b"{" + data[end + 2 :]
    if mac is None or not signing.current().check(_PURPOSE, body, mac):
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
