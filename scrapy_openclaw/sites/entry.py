"""One domain's memory: what a crawl learned about it, as validated data (no code on load)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scrapy_openclaw.health.registry import DomainState
    from scrapy_openclaw.metrics.figures import DomainFigures

_MAX_RATE = 1e6  # req/s: anything above is no limit a site sets
_MAX_SECONDS = 86400.0


@dataclass(frozen=True)
class SiteEntry:
    """What the crawls so far learned about one domain."""

    limit: float | None = None  # req/s the site takes (the measured limit); None: never measured
    burst: int = 0  # the largest burst the site has proved it allows; 0: not known
    latency: float | None = None  # seconds: the download latency baseline (kept to show, never seeded)
    crawl_delay: float = 0.0  # robots.txt Crawl-delay in force (seconds; 0: none)
    bans: bool = False  # it answered a ban or challenge page
    signals: dict[str, int] = field(default_factory=dict)  # "429", "503", "retry_after": answers seen
    declared: float | None = None  # req/s the site last said in its RateLimit headers; None: never said
    seen_at: float = 0.0  # UNIX time of the last crawl that met it
    crawls: int = 0  # crawls that met it

    @property
    def signal(self) -> str:
        """How the site says "too fast": "429", "503" or "none", and whether with Retry-After;
        first, the limit it says in its headers, if it does (``says 10/s, 429 with Retry-After``)."""
        kinds = [s for s in ("429", "503") if self.signals.get(s)]
        ra = " with Retry-After" if self.signals.get("retry_after") else ""
        refusals = "/".join(kinds) + ra if kinds else "none"
        if self.declared is None:
            return refusals
        says = f"says {self.declared:g}/s"
        return says if not kinds else f"{says}, {refusals}"

    def to_data(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_data(cls, data: Any, where: str) -> SiteEntry:
        """An entry from stored data; ValueError naming *where* and the field for anything else."""
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected an object")
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
        limit = _number(data.get("limit"), where, "limit", 0.0, _MAX_RATE, optional=True)
        latency = _number(data.get("latency"), where, "latency", 0.0, _MAX_SECONDS, optional=True)
        declared = _number(data.get("declared"), where, "declared", 0.0, _MAX_RATE, optional=True)
        signals = data.get("signals", {})
        if not isinstance(signals, dict) or not all(
            k in ("429", "503", "retry_after") and _is_count(v) for k, v in signals.items()
        ):
            raise ValueError(f"{where}: field 'signals': expected counts of 429, 503, retry_after")
        bans = data.get("bans", False)
        if not isinstance(bans, bool):
            raise ValueError(f"{where}: field 'bans': expected true or false")
        return cls(
            limit=limit,
            burst=int(_number(data.get("burst", 0), where, "burst", 0, 10**6, integer=True) or 0),
            latency=latency,
            crawl_delay=float(_number(data.get("crawl_delay", 0.0), where, "crawl_delay", 0.0, _MAX_SECONDS) or 0.0),
            bans=bans,
            signals=dict(signals),
            declared=declared,
            seen_at=float(_number(data.get("seen_at", 0.0), where, "seen_at", 0.0, 1e11) or 0.0),
            crawls=int(_number(data.get("crawls", 0), where, "crawls", 0, 10**9, integer=True) or 0),
        )


def rebased(entry: SiteEntry, saved: SiteEntry | None, stored: SiteEntry | None) -> SiteEntry:
    """*entry* to write over *stored* (what the store holds now), when this process last wrote
    *saved* (or read it at open): its counts add what it saw since then, so workers of one
    crawl (or two crawls) saving the same domain add up instead of the last overwriting the
    others'; the rest is this process's newest reading."""
    if stored is None:
        return entry
    base = saved.signals if saved is not None else {}
    signals = dict(stored.signals)
    for name, n in entry.signals.items():
        signals[name] = signals.get(name, 0) + max(0, n - base.get(name, 0))
    crawls = max(stored.crawls, entry.crawls)  # (workers of one crawl are one crawl)
    return SiteEntry(**{**entry.to_data(), "signals": signals, "crawls": crawls, "bans": entry.bans or stored.bans})


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 10**12


def _number(
    value: Any, where: str, name: str, low: float, high: float, *, optional: bool = False, integer: bool = False
) -> float | None:
    if value is None and optional:
        return None
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value) or not low <= value <= high:
        raise ValueError(f"{where}: field {name!r}: {value!r} is not a number from {low:g} to {high:g}")
    return value


def learned(
    state: DomainState | None,
    figures: DomainFigures | None,
    *,
    banned: bool,
    before: SiteEntry | None,
    now: float,
    resumed: float | None = None,
) -> SiteEntry:
    """This crawl's entry for a domain, over what earlier crawls knew (*before*): a limit this
    crawl did not measure (it never reached it, only guessed it from an outage, or still holds
    the one memory *resumed* it at) stays the earlier one; the counts of its signals add up."""
    before = before or SiteEntry()
    limit, burst = before.limit, before.burst
    measured = state is not None and state.limit_measured and state.limit is not None and state.limit != resumed
    if state is not None and measured and state.limit is not None and math.isfinite(state.limit):
        limit, burst = round(float(state.limit), 3), state.burst_cap or burst
    signals = dict(before.signals)
    if figures is not None:
        for name, n in (
            ("429", figures.statuses.get(429, 0)),
            ("503", figures.statuses.get(503, 0)),
            ("retry_after", figures.retry_after_received),
        ):
            if n:
                signals[name] = signals.get(name, 0) + int(n)
    declared = before.declared
    if state is not None and state.declared > 0:
        declared = round(float(state.declared), 3)
    latency = before.latency
    if state is not None and state.latency is not None and math.isfinite(state.latency):
        latency = round(float(state.latency), 4)
    return SiteEntry(
        limit=limit,
        burst=burst,
        latency=latency,
        crawl_delay=float(state.crawl_delay) if state is not None else before.crawl_delay,
        bans=before.bans or banned,
        signals=signals,
        declared=declared,
        seen_at=now,
        crawls=before.crawls + 1,
    )
