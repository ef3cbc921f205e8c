"""Parse the Retry-After header (seconds or HTTP-date), tolerating garbage.

Shared by the health middleware (holds the domain) and the retry middleware
(delays the retry). Servers send odd values; a bad one is logged and ignored,
an absurd one is capped, and nothing here ever raises. A server can send a
different bad value on every answer: the warnings are condensed per domain and
kind (the first logged, the rest counted into the next one a minute later, or
into :func:`summarise_warnings` at close).
"""

from __future__ import annotations

import logging
import math
import time
import weakref
from email.utils import parsedate_to_datetime
from typing import Any

from scrapy_openclaw._condensed import CondensedWarnings

logger = logging.getLogger(__name__)
_warnings = CondensedWarnings(logger, every=60.0)


def parse_retry_after(
    value: bytes | str | None, *, cap: float, now: float | None = None, domain: str = "", response: Any = None
) -> float | None:
    """Seconds to wait from *now*, within ``[0, cap]``; None when absent or unusable.

    *domain* (the answering site) names the site in the warnings and condenses them per site;
    *response* (the answer) makes several readers of one answer count as one warning.
    """
    answer = _ref(response)
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
    site = {"value": value[:80], "domain": domain or "?"}
    if seconds is None or math.isnan(seconds):
        _warn("malformed", domain, "Ignoring malformed Retry-After header %(value)r from %(domain)s", site, answer)
        return None
    if seconds < 0:
        _warn("past", domain, "Retry-After %(value)r from %(domain)s is in the past; using 0", site, answer)
        return 0.0
    if seconds > cap:
        _warn(
            "cap",
            domain,
            "Retry-After %(value)r from %(domain)s exceeds the cap; waiting %(cap)ss instead",
            {**site, "cap": cap},
            answer,
        )
        return float(cap)
    return seconds


def _ref(response: Any) -> Any:
    """A weak reference to the answer (equal to another one only while that answer lives)."""
    try:
        return weakref.ref(response) if response is not None else None
    except TypeError:
        return None


def _warn(kind: str, domain: str, message: str, args: dict[str, Any], answer: Any) -> None:
    if domain:
        _warnings.warn((kind, domain), message, args, same=answer)
    else:  # (a caller that does not say whose answer it is: nothing to condense by)
        logger.warning(message, args)


def summarise_warnings(**kwargs: Any) -> int:
    """Log the Retry-After warnings counted but not yet logged (at close); how many lines."""
    return _warnings.summarise(**kwargs)


def _from_http_date(text: str, now: float) -> float | None:
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when is None or when.tzinfo is None:
        return None
    return when.timestamp() - now
