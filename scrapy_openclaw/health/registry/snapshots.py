"""A domain's record as data: the read-only view the registry hands out, and the JSON-safe
snapshot for checkpoints and back (restoring validates every field).

A bad or foreign snapshot raises ValueError naming the spot rather than
crawling on made-up state.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from scrapy_openclaw.health.registry.pacing import burst_of, concurrency_of, rate_of
from scrapy_openclaw.health.registry.record import _COUNTERS, _FIELD_TYPES, _OBSOLETE, DomainState, _Domain
from scrapy_openclaw.health.registry.tuning import _MAX_DOUBLINGS, _MAX_RATE, CLOSED, HALF_OPEN, OPEN, SNAPSHOT_VERSION

if TYPE_CHECKING:
    from scrapy_openclaw.policy import HealthPolicy


def state_of(domain: str, d: _Domain, p: HealthPolicy, rate_cap: float, default_concurrency: int) -> DomainState:
    """*d*'s read-only view; its rate is at most *rate_cap* (what DOWNLOAD_DELAY allows)."""
    rate = min(rate_of(d, p), rate_cap)
    return DomainState(
        domain=domain,
        health=d.health,
        rate=math.inf if rate >= _MAX_RATE else rate,
        tokens=d.tokens,
        burst=burst_of(d, p),
        concurrency=concurrency_of(d, p, None, default_concurrency),
        circuit=d.circuit,
        latency=d.latency,
        hold_until=d.hold_until,
        consecutive_failures=d.consecutive_failures,
        requests=d.requests,
        successes=d.successes,
        failures=d.failures,
        limit=d.threshold,
        crawl_delay=d.crawl_delay,
        blocked_seconds=d.blocked_seconds,
        circuit_seconds=d.circuit_seconds,
        retry_after_holds=d.retry_after_holds,
        refusals_flat=d.refusals_flat,
        limit_measured=d.cuts >= 2 and d.threshold is not None,
        burst_cap=d.burst_cap,
        declared=d.declared,
    )


def overrides_of(d: _Domain | None) -> dict[str, Any]:
    """The operator overrides in force on *d* (None: not set; *d* None: an unknown domain)."""
    if d is None:
        return {"hold_until": None, "rate": None, "concurrency": None, "given_up": False}
    return {
        "hold_until": d.ctl_hold or None,
        "rate": d.ctl_rate or None,
        "concurrency": int(d.ctl_concurrency) or None,
        "given_up": bool(d.ctl_down),
    }


def snapshot_of(domains: dict[str, _Domain]) -> dict[str, Any]:
    """Every domain's state as JSON-safe data (for checkpoints)."""
    return {
        "version": SNAPSHOT_VERSION,
        "domains": {name: {field: getattr(d, field) for field in _Domain.__slots__} for name, d in domains.items()},
    }


def domains_from(data: Any, policy_of: Callable[[str], HealthPolicy]) -> dict[str, _Domain]:
    """The records a :func:`snapshot_of` holds; bad data raises ValueError naming the spot."""
    if not isinstance(data, dict):
        raise ValueError(f"health snapshot: expected a dict, got {type(data).__name__}")
    if data.get("version") != SNAPSHOT_VERSION:
        raise ValueError(
            f"health snapshot: unsupported version {data.get('version')!r} "
            f"(this scrapy-openclaw reads version {SNAPSHOT_VERSION})"
        )
    domains = data.get("domains")
    if not isinstance(domains, dict):
        raise ValueError("health snapshot: 'domains' must be a mapping of domain to state")
    return {name: domain_from(name, fields, policy_of) for name, fields in domains.items()}


def domain_from(name: Any, fields: Any, policy_of: Callable[[str], HealthPolicy]) -> _Domain:
    """One domain's record from its snapshot fields, every field checked."""
    where = f"health snapshot: domain {name!r}"
    if not isinstance(name, str) or not isinstance(fields, dict):
        raise ValueError(f"{where}: expected a string domain mapped to a dict of fields")
    d = _Domain(policy_of(name), time.time())
    for field, value in fields.items():
        if field in _OBSOLETE:
            continue
        types = _FIELD_TYPES.get(field)
        if types is None:
            raise ValueError(f"{where}: unknown field {field!r}")
        bad_type = not isinstance(value, types) or (isinstance(value, bool) and bool not in types)
        if bad_type or (isinstance(value, float) and not math.isfinite(value)):
            raise ValueError(f"{where}: field {field!r}: bad value {value!r}")
        if field == "circuit" and value not in (CLOSED, OPEN, HALF_OPEN):
            raise ValueError(f"{where}: field 'circuit': {value!r} is not closed/open/half_open")
        setattr(d, field, int(value) if field in _COUNTERS else value)
    d.health = min(100.0, max(0.0, float(d.health)))
    d.opens = min(max(0, d.opens), _MAX_DOUBLINGS)
    d.burst_cap = max(0, d.burst_cap)  # (0: none; a negative one would pin the bucket at one token)
    d.cooldown = max(0.0, float(d.cooldown))
    d.rate = min(max(float(d.rate), 0.0), _MAX_RATE)
    d.declared = min(max(float(d.declared), 0.0), _MAX_RATE)
    return d
