"""Requests as plain JSON data, never pickle.

Everything stored or sent between processes (checkpoint, dead letters, the Redis
queue) goes through :func:`request_to_data` and :func:`request_from_data`, which
refuses what a stored request must not hold (docs/stored-requests.md). The parts:
:mod:`.request_data`, :mod:`.encoding`, :mod:`.decoding`, :mod:`.tags`, :mod:`.rules`.
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
