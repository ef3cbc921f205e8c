"""Requests as plain JSON data, never pickle.

Everything we store or send between processes (checkpoint journal, dead
letters, the Redis queue) goes through :func:`request_to_data` and
:func:`request_from_data`. Values JSON lacks (bytes, tuples, sets, dates,
Decimals, Items, dataclasses, non-str keys) become tagged objects (see
:func:`encode_value`); callbacks are stored by name and resolve only to methods of the spider.
Loading never imports a module, and builds no class but Item subclasses and dataclasses
already imported. What is read back is untrusted
(Redis, DLQ and checkpoint files): :func:`request_from_data` refuses schemes,
callbacks and meta keys a stored request must not have (see :func:`check_stored`).

The parts: :mod:`.request_data` (a request as data and back), :mod:`.encoding`
and :mod:`.decoding` (values), :mod:`.tags` (the tagged-object format) and
:mod:`.rules` (what a stored request may be). Every name is importable from here.
"""

from __future__ import annotations

import json
from typing import Any

from scrapy_openclaw.exceptions import RefusedRequest as RefusedRequest  # (re-exported)
from scrapy_openclaw.exceptions import SerializationError as SerializationError
from scrapy_openclaw.serialization.decoding import _DECODERS as _DECODERS
from scrapy_openclaw.serialization.decoding import decode_value
from scrapy_openclaw.serialization.encoding import encode_value
from scrapy_openclaw.serialization.request_data import FORMAT_VERSION, request_from_data, request_to_data
from scrapy_openclaw.serialization.rules import FRAMEWORK_CALLBACKS, SPIDER_HOOKS, StoredRequestRules

__all__ = [
    "FORMAT_VERSION",
    "FRAMEWORK_CALLBACKS",
    "SPIDER_HOOKS",
    "RefusedRequest",
    "SerializationError",
    "StoredRequestRules",
    "decode_value",
    "dumps",
    "encode_value",
    "request_from_data",
    "request_to_data",
]


def dumps(data: Any) -> str:
    """Compact, deterministic JSON for storage."""
    return json.dumps(data, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
