"""Read the limit a site declares in its answers (``RateLimit``, ``RateLimit-Policy``, ``X-RateLimit-*``).

A site that says its limit need not be crossed to be found: the health
controller paces a domain just under the limit it declares, at once, both ways
(a raised limit is used from the next answer, a lowered one before the first
refusal), and holds a domain whose quota is used up until it resets.

The formats in use today, all read:

- ``RateLimit-Policy: "default";q=100;w=60`` and ``RateLimit: "default";r=50;t=30``
  (draft-ietf-httpapi-ratelimit-headers-08 and later: quota ``q`` per window ``w``
  seconds; ``r`` left, ``t`` seconds until the quota resets);
- ``RateLimit: limit=100, remaining=50, reset=30`` (draft 07);
- ``RateLimit-Limit``, ``RateLimit-Remaining``, ``RateLimit-Reset`` and
  ``RateLimit-Policy: 100;w=60`` (drafts 00-06; the limit may list policies:
  ``10, 10;w=1, 1000;w=3600``);
- ``X-RateLimit-Limit``, ``X-RateLimit-Remaining``, ``X-RateLimit-Reset`` (seconds,
  or a UNIX time as GitHub sends it) and ``X-RateLimit-Reset-After``.

Only a quota over a window of at most :data:`PACE_WINDOW_MAX` seconds is a pace; a
longer one (1,000 a day) is a budget: spent as fast as the site takes it, and
waited out once it is used up. A paced quota used up (a bucket at its edge) only
makes the next request wait for its turn at the pace, and a quota without a pace
back within the whole second its reset is rounded to is not waited for. Like Retry-After, a bad value is logged
(condensed per domain) and ignored; nothing here raises.
"""

from __future__ import annotations

import logging
import math
import re
import time
from dataclasses import dataclass
from typing import Any

from scrapy_openclaw._condensed import CondensedWarnings
from scrapy_openclaw.retry_after import _ref

logger = logging.getLogger(__name__)
_warnings = CondensedWarnings(logger, every=60.0)

#: seconds; a quota over a longer window is a budget, not a pace
PACE_WINDOW_MAX = 60.0
#: a reset larger than this is a UNIX time (GitHub's ``X-RateLimit-Reset``), not seconds
_EPOCH = 1e9
_HEADERS = (
    b"RateLimit",
    b"RateLimit-Policy",
    b"RateLimit-Limit",
    b"RateLimit-Remaining",
    b"RateLimit-Reset",
    b"X-RateLimit-Limit",
    b"X-RateLimit-Remaining",
    b"X-RateLimit-Reset",
    b"X-RateLimit-Reset-After",
)
#: the names as Scrapy's ``Headers`` keys them (title-cased bytes)
_NAMES = frozenset(name.title() for name in _HEADERS)
# a list member: a token or a quoted string, then ;key=value parameters (values maybe quoted)
_MEMBER = re.compile(
    r'\s*("(?:[^"\\]|\\.)*"|[^;,"]*)((?:\s*;\s*[\w.*-]+(?:=(?:"(?:[^"\\]|\\.)*"|[^;,"]*))?)*)\s*(?:,|$)'
)
_PARAM = re.compile(r';\s*([\w.*-]+)(?:=("(?:[^"\\]|\\.)*"|[^;,"]*))?')


@dataclass(frozen=True)
class Declared:
    """What one answer declares: the pace the site takes (req/s: its tightest quota per
    window of at most :data:`PACE_WINDOW_MAX`; None: no such quota), and, when none of its
    quota is left, how long to wait (seconds; None: quota left, or nothing to wait out)."""

    pace: float | None
    exhausted_for: float | None


def read_declared(
    headers: Any, *, cap: float, now: float | None = None, domain: str = "", response: Any = None
) -> Declared | None:
    """The limit *headers* (a Scrapy ``Headers``) declare; None when they declare none.

    *cap* bounds the wait of a used-up quota, as ``retry_after_cap`` bounds a Retry-After.
    """
    if _NAMES.isdisjoint(headers):  # (one pass over the answer's few keys: most answers say nothing)
        return None
    now = time.time() if now is None else now
    reader = _Reader(headers, now, domain, _ref(response))
    pace, window = reader.pace()
    wait = reader.exhausted_for()
    if wait is not None and wait < 0:
        wait = None  # reset already: the quota is back
    elif wait is not None:
        wait = min(wait, float(cap))
        if pace is not None and window is not None and wait <= window:
            # a paced quota at its edge (a bucket, a short window): the next request waits for
            # its turn at the pace, not for the reset a whole-second ``t`` rounds up to
            wait = min(wait, 1.0 / pace)
        elif pace is None and wait <= 1.0:
            # back within the second a whole-second reset rounds to: nothing to wait out (a
            # bucket refills long before; a 1 s window's next answer says 429 and Retry-After)
            wait = None
    if pace is None and wait is None:
        return None
    return Declared(pace=pace, exhausted_for=wait)


def summarise_warnings(**kwargs: Any) -> int:
    """Log the warnings counted but not yet logged (at close); how many lines."""
    return _warnings.summarise(**kwargs)


class _Reader:
    """One answer's headers, read field by field; a value that does not parse is warned about once."""

    def __init__(self, headers: Any, now: float, domain: str, answer: Any):
        self.headers, self.now, self.domain, self.answer = headers, now, domain, answer

    def text(self, name: str) -> str | None:
        """The field's value; several lines of one field joined as one list (RFC 9110 5.3)."""
        values = self.headers.getlist(name)
        if not values:
            return None
        return ", ".join(
            v.decode("latin-1", errors="replace").strip() if isinstance(v, bytes) else str(v) for v in values
        )

    def pace(self) -> tuple[float | None, float | None]:
        """The tightest quota per window over every policy the answer lists, and the shortest
        such window (seconds); (None, None) when it lists none."""
        policies: list[tuple[float, float]] = []
        for name in ("RateLimit-Policy", "RateLimit-Limit", "X-RateLimit-Limit"):
            text = self.text(name)
            for item, params in self.members(name, text):
                quota = params["q"] if "q" in params else item  # (draft 08 on: a named policy's q)
                window = params.get("w")
                if window is None:
                    continue  # a limit without its window (a draft's bare limit, X-RateLimit-Limit): no pace
                q, w = self.number(name, quota), self.number(name, window)
                if q is not None and w is not None and q > 0 and 0 < w <= PACE_WINDOW_MAX:
                    policies.append((q, w))
        if not policies:
            return None, None
        return min(q / w for q, w in policies), min(w for _, w in policies)

    def exhausted_for(self) -> float | None:
        """Seconds until the quota resets, when an answer says none is left."""
        waits = []
        rate_limit = self.text("RateLimit")
        members = self.members("RateLimit", rate_limit)
        if members and all("=" in item and not item.startswith('"') for item, _ in members):  # draft 07
            fields = dict(item.split("=", 1) for item, _ in members)
            waits.append(self.wait("RateLimit", fields.get("remaining"), fields.get("reset")))
        else:  # draft 08 on: one member per policy
            waits += [self.wait("RateLimit", params.get("r"), params.get("t")) for _, params in members]
        for prefix in ("RateLimit-", "X-RateLimit-"):
            remaining = self.text(prefix + "Remaining")
            reset = self.text(prefix + "Reset")
            if prefix == "X-RateLimit-" and reset is None:
                reset = self.text("X-RateLimit-Reset-After")
            waits.append(self.wait(prefix + "Remaining", remaining, reset))
        found = [w for w in waits if w is not None]
        return max(found) if found else None

    def wait(self, name: str, remaining: str | None, reset: str | None) -> float | None:
        if remaining is None:
            return None
        left = self.number(name, remaining.strip())
        if left is None or left > 0:
            return None
        seconds = self.number(name, (reset or "").strip()) if reset is not None else None
        if seconds is None:
            return None  # used up, but not said until when: the 429 that follows will say
        return seconds - self.now if seconds > _EPOCH else seconds

    def members(self, name: str, text: str | None) -> list[tuple[str, dict[str, str]]]:
        """A structured list's members: (the item, its parameters), quotes kept on the item."""
        if not text:
            return []
        found: list[tuple[str, dict[str, str]]] = []
        pos = 0
        while pos < len(text):
            match = _MEMBER.match(text, pos)
            if match is None or match.end() == pos:
                self.warn(name, text, "cannot be read as a list of policies")
                return found
            item = match.group(1).strip()
            params = {k.lower(): v.strip().strip('"') for k, v in _PARAM.findall(match.group(2)) if v is not None}
            if item or params:
                found.append((item, params))
            pos = match.end()
        return found

    def number(self, name: str, value: str | None) -> float | None:
        if value is None:
            return None
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not math.isfinite(number) or number < 0:
            self.warn(name, value, "is not a number of 0 or more")
            return None
        return number

    def warn(self, name: str, value: str, why: str) -> None:
        args = {"name": name, "value": value[:80], "domain": self.domain or "?", "why": why}
        message = "Ignoring malformed %(name)s header from %(domain)s: %(value)r %(why)s"
        if self.domain:
            _warnings.warn(("malformed", self.domain, name), message, args, same=self.answer)
        else:
            logger.warning(message, args)
