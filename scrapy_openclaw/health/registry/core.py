"""A domain record's clock: brought up to date when read, and the circuit opened on failure.

Recovery, cool-down and tokens are never updated by a timer: every read of a
record (:func:`catch_up`) accounts for the time since its last update.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy_openclaw.health.registry.pacing import burst_of, rate_of
from scrapy_openclaw.health.registry.tuning import _MAX_DOUBLINGS, _PROBE_LOST_AFTER, CLOSED, HALF_OPEN, OPEN

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy_openclaw.health.registry.record import _Domain
    from scrapy_openclaw.policy import HealthPolicy


def blocked_until(d: _Domain) -> float:
    """When *d*'s hold, open circuit or operator hold ends: nothing may reach it before."""
    return max(d.hold_until, d.opened_at + d.cooldown if d.circuit == OPEN else 0.0, d.ctl_hold)


def catch_up(d: _Domain, p: HealthPolicy, now: float) -> None:
    """Bring *d* up to *now*: blocked time, health recovery, refilled tokens, open -> half-open."""
    elapsed = now - d.updated
    if elapsed > 0:
        # a hold (the site's or the operator's) or an opening starts at an update, so
        # [updated, now] covers any part of it since
        open_end = d.opened_at + d.cooldown if d.circuit == OPEN else 0.0
        blocked_end = max(d.hold_until, open_end, d.ctl_hold)
        d.blocked_seconds += max(0.0, min(now, blocked_end) - d.updated)
        d.circuit_seconds += max(0.0, min(now, open_end) - d.updated)
        d.health = min(100.0, d.health + p.recovery_per_minute * elapsed / 60.0)
        # no tokens saved up while the circuit is open: its probe, then the pace (a hold
        # saves at most the burst: a quarter second's worth, no more than the site took)
        unblocked = now - max(d.updated, min(now, open_end))
        d.tokens = min(float(burst_of(d, p)), d.tokens + unblocked * rate_of(d, p))
        d.updated = now
    if d.circuit == OPEN and now >= d.opened_at + d.cooldown:
        d.circuit, d.probe_at = HALF_OPEN, 0.0
    elif d.circuit == HALF_OPEN and d.probe_at and now - d.probe_at > max(d.cooldown, _PROBE_LOST_AFTER):
        d.probe_at = 0.0  # the probe never reported back (dropped elsewhere): allow another


def open_circuit(d: _Domain, p: HealthPolicy, now: float, uniform: Callable[[float, float], float]) -> None:
    """Open the circuit for a cool-down that doubles with each opening not yet forgiven.

    The time spent closed since the last cool-down ended forgives one
    doubling per ``circuit_cooldown`` (a failed probe reopens at once:
    nothing forgiven). A circuit that was never opened has nothing to forgive.
    *uniform* draws the jitter.
    """
    if d.circuit == CLOSED:
        d.down_since = now  # an outage begins
    if d.circuit == CLOSED and d.opens:
        healthy = max(0.0, now - (d.opened_at + d.cooldown))
        d.opens = max(0, d.opens - int(healthy / p.circuit_cooldown))
    cap = max(p.circuit_cooldown_max, p.circuit_cooldown)
    base = min(cap, p.circuit_cooldown * 2.0 ** min(d.opens, _MAX_DOUBLINGS))
    jitter = p.circuit_jitter
    d.cooldown = base * uniform(1.0 - jitter, 1.0 + jitter) if jitter else base
    d.opens = min(d.opens + 1, _MAX_DOUBLINGS)
    d.circuit, d.opened_at, d.probe_at = OPEN, now, 0.0
    d.tokens = 1.0  # the probe's, and no more: nothing is saved up while open (see catch_up)
