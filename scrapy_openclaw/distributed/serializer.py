"""JSON for scrapy-redis's ``SCHEDULER_SERIALIZER`` hook: requests as data, never pickle.

scrapy-redis's default serializer is pickle, so anyone who can write to the
queue key can run code on every worker. This module has the ``loads`` /
``dumps`` pair scrapy-redis expects, but ``loads`` accepts only a JSON object
that looks like a serialised request, and refuses a pickle (or anything else)
with :class:`RefusedPayload` before any byte of it is interpreted. The queue
moves refused entries aside; they are never executed.
"""

from __future__ import annotations

import json
from typing import Any

from scrapy_openclaw.exceptions import RefusedPayload as RefusedPayload  # (re-exported)
from scrapy_openclaw.serialization import dumps as _json_dumps

__all__ = ["RefusedPayload", "dumps", "loads"]

_PICKLE_PROTO = 0x80  # protocol 2+ pickles start with PROTO (0x80)
#: A request body beyond this is not something a crawl queues (Redis's own limit is 512 MB).
MAX_ENTRY_BYTES = 64 * 1024 * 1024


def _describe(raw: bytes) -> str:
    if raw[:1] == bytes([_PICKLE_PROTO]) or raw[:1] in (b"(", b"c", b"]", b"}", b"S", b"I"):
        return "a pickle payload (refused: unpickling would run code)"
    return f"not a JSON request ({raw[:40]!r})"


def dumps(obj: Any) -> str:
    """Compact JSON of a request dict (from ``request_to_data``)."""
    return _json_dumps(obj)


def loads(raw: bytes | str) -> dict[str, Any]:
    """Parse a stored request dict; :class:`RefusedPayload` for anything else."""
    data = raw.encode("utf-8", "surrogateescape") if isinstance(raw, str) else bytes(raw)
    if not data.lstrip().startswith(b"{"):
        raise RefusedPayload(f"queue entry is {_describe(data)}")
    if len(data) > MAX_ENTRY_BYTES:
        raise RefusedPayload(f"queue entry of {len(data)} bytes is larger than {MAX_ENTRY_BYTES}")
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise RefusedPayload(f"queue entry is not valid JSON: {exc}") from None
    except RecursionError:
        raise RefusedPayload("queue entry is JSON nested too deeply") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("url"), str):
        raise RefusedPayload("queue entry is JSON but not a serialised request (no 'url')")
    return obj
