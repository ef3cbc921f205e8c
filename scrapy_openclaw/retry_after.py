"""Parse the Retry-After header (seconds or HTTP-date), tolerating garbage.

Shared by the health middleware (holds the domain) and the retry middleware
(delays the retry). Servers send odd values; a bad one is logged and ignored,
an absurd one is capped, and nothing here ever raises.
"""

from __future__ import annotations

import logging
import math
import time
from email.utils import parsedate_to_datetime

logger = logging.getLogger(__name__)


def parse_retry_after(value: bytes | str | None, *, cap: float, now: float | None = None) -> float | None:
    """Seconds to wait from *now*, within ``[0, cap]``; None when absent or unusable."""
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("latin-1", errors="replace")
    text = value.strip()
    if not text:
        return None
    now = time.time() if now is None else now
    seconds: float | None
    try:
        seconds = float(text)
    except ValueError:
        seconds = _from_http_date(text, now)
    if seconds is None or math.isnan(seconds):
        logger.warning("Ignoring malformed Retry-After header %(value)r", {"value": value[:80]})
        return None
    if seconds < 0:
        logger.warning("Retry-After %(value)r is in the past; using 0", {"value": value[:80]})
        return 0.0
    if seconds > cap:
        logger.warning(
            "Retry-After %(value)r exceeds the cap; waiting %(cap)ss instead",
            {"value": value[:80], "cap": cap},
        )
        return float(cap)
    return seconds


def _from_http_date(text: str, now: float) -> float | None:
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when is None or when.tzinfo is None:
        return None
    return when.timestamp() - now
