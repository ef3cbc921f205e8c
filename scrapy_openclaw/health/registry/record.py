"""A domain's state: the mutable record the registry keeps, and the read-only view it hands out.

The record's ``__slots__`` are also the snapshot's fields; the tables after it
say which types :meth:`HealthRegistry.restore` accepts for each of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy_openclaw.health.registry.tuning import _BURST_SECONDS, CLOSED

if TYPE_CHECKING:
    from scrapy_openclaw.policy import HealthPolicy


def effective_rate(state: Any) -> float:
    """The pace the controller allows a domain, ``inf`` when it cannot bind: above what the
    domain's concurrency reaches at its latency (concurrency / latency), as in plain Scrapy.
    What the log table, ``/metrics`` and the ``final_rate`` stats show."""
    rate = float(state.rate)
    latency = state.latency
    if isinstance(latency, (int, float)) and latency > 0 and rate * latency > max(1, state.concurrency):
        return math.inf
    return rate


@dataclass(frozen=True)
class DomainState:
    """A read-only snapshot of one domain, for the queue, metrics and logs."""

    domain: str
    health: float  # 0..100
    rate: float  # req/s allowed now; math.inf while nothing paces the domain
    tokens: float
    burst: int
    concurrency: int
    circuit: str  # "closed" | "open" | "half_open"
    latency: float | None  # EWMA of download latency, seconds
    hold_until: float  # UNIX time; 0 when not held
    consecutive_failures: int
    requests: int
    successes: int
    failures: int
    limit: float | None = None  # the learned limit (req/s); None: no congestion seen
    crawl_delay: float = 0.0  # robots.txt Crawl-delay in force (seconds; 0: none)
    blocked_seconds: float = 0.0  # time spent held or with the circuit open, so far
    circuit_seconds: float = 0.0  # of it, with the circuit open (its cool-downs)
    retry_after_holds: int = 0  # Retry-After answers the domain was held for (not judged pace-independent)
    refusals_flat: float = 0.0  # share of refusals judged pace-independent (0: they are a rate signal)
    limit_measured: bool = False  # the limit was measured (a 429 or latency), not guessed from an outage
    burst_cap: int = 0  # the largest burst the site has proved it allows (0: not known)
    declared: float = 0.0  # the pace the site declares in its RateLimit headers (req/s; 0: none)


class _Domain:
    """Mutable per-domain record; only the registry touches it."""

    __slots__ = (
        "health",
        "rate",
        "tokens",
        "threshold",
        "updated",
        "last_decrease",
        "circuit",
        "opened_at",
        "probe_at",
        "latency",
        "best_latency",
        "hold_until",
        "consecutive_failures",
        "requests",
        "successes",
        "failures",
        "cooldown",
        "opens",
        "down_since",
        "answered_at",
        "last_success",
        "share_fast",
        "share_slow",
        "win_start",
        "win_ok",
        "delivered",
        "crawl_delay",
        "troubled_at",
        "cuts",
        "born",
        "blocked_seconds",
        "circuit_seconds",
        "retry_after_holds",
        "burst_cap",
        "declared",
        "cut_below",
        "cut_refused",
        "fall_from",
        # pace-independent refusals (refusals.py): the open pace interval, the reference one,
        # and the refused share judged pace-independent (0: refusals are a rate signal)
        "iv_start",
        "iv_ok",
        "iv_refused",
        "iv_cut",
        "iv_pace",
        "iv_clean",
        "iv_first_refused",
        "iv_last_ok",
        "ref_share",
        "ref_pace",
        "ref_ok",
        "refusals_flat",
        # the health rate signals took (at most 100): given back if they prove pace-independent
        "rate_cost",
        # operator overrides (scrapy_openclaw.control): a hold (UNIX time), a rate ceiling
        # (req/s), a concurrency (0: none of them) and a give-up (1/0)
        "ctl_hold",
        "ctl_rate",
        "ctl_concurrency",
        "ctl_down",
    )

    def __init__(self, policy: HealthPolicy, now: float):
        self.health = 100.0
        self.rate = policy.initial_rate
        self.tokens = float(max(1, min(policy.burst, int(policy.initial_rate * _BURST_SECONDS))))
        self.threshold: float | None = None  # the learned limit (cubic's W_max); None: slow start
        self.updated = now
        self.last_decrease = 0.0
        self.circuit = CLOSED
        self.opened_at = 0.0
        self.probe_at = 0.0  # when the half-open probe was handed out; 0: none out
        self.latency: float | None = None
        self.best_latency: float | None = None
        self.hold_until = 0.0
        self.consecutive_failures = 0  # domain failures in a row
        self.requests = 0
        self.successes = 0
        self.failures = 0
        self.cooldown = policy.circuit_cooldown  # of the current (or last) opening, jitter included
        self.opens = 0  # openings in a row not yet forgiven: the cool-down is doubled this often
        self.down_since = 0.0  # when the opening that began the current outage happened; 0: closed
        self.answered_at = 0.0  # last HTTP answer of any status; 0: the domain never answered
        self.last_success = 0.0
        self.share_fast = 0.0  # 5xx share of recent answers (see _SHARE_*)
        self.share_slow = 0.0
        self.win_start = now  # the open window of the delivered-rate estimate ...
        self.win_ok = 0  # ... and the successes in it
        self.delivered: float | None = None  # successes/s the domain delivered (EWMA of windows)
        self.crawl_delay = 0.0
        self.troubled_at = 0.0  # the last domain failure; 0: none
        # 0: slow start; 1: cut, limit guessed; 2: a 429 or latency measured it (cubic plateau);
        # 3 (_RESUMED): started at a limit site memory remembered, until its first cut
        self.cuts = 0
        self.born = now  # when the domain was first seen: slow start doubles at most this fast from it
        self.blocked_seconds = 0.0  # time spent held (Retry-After) or with the circuit open
        self.circuit_seconds = 0.0  # of it, with the circuit open
        self.retry_after_holds = 0  # Retry-After answers that held the domain
        self.burst_cap = 0  # the largest burst the site has proved it allows (the limit fit); 0: not known
        self.declared = 0.0  # the pace the site's RateLimit headers declare (req/s; 0: none declared)
        self.cut_below = 0  # 1: the last cut came at no more than the learned limit (pacing.fell)
        self.cut_refused = 0  # refusals since the last cut of requests sent after it (pacing.decrease)
        # the fit-history bin where the hold after a cut under the learned limit ended: where a
        # fall's evidence begins, from a refilled bucket (0: none; pacing.begin_after_fall)
        self.fall_from = 0
        self.iv_start = now
        self.iv_ok = 0
        self.iv_refused = 0
        self.iv_cut = 0.0  # the first cut, while the interval waits for the answers to slow start's requests
        self.iv_pace = 0.0  # ... and the pace slow start allowed them
        self.iv_clean = 0  # 1: the last interval closed clean (the next with refusals straddles a change)
        # when the open interval's first refused request and its last successful one were sent (0: none)
        self.iv_first_refused = 0.0
        self.iv_last_ok = 0.0
        self.ref_share = 0.0
        self.ref_pace = 0.0
        self.ref_ok = 0.0
        self.refusals_flat = 0.0
        self.rate_cost = 0.0
        self.ctl_hold = 0.0
        self.ctl_rate = 0.0
        self.ctl_concurrency = 0
        self.ctl_down = 0


# Field types in a snapshot: how restore() validates what it reads.
_FIELD_TYPES: dict[str, tuple[type, ...]] = {name: (int, float) for name in _Domain.__slots__ if name != "circuit"}
_OPTIONAL = (int, float, type(None))
_FIELD_TYPES.update(circuit=(str,), threshold=_OPTIONAL, latency=_OPTIONAL, best_latency=_OPTIONAL, delivered=_OPTIONAL)
_COUNTERS = (
    "consecutive_failures",
    "requests",
    "successes",
    "failures",
    "opens",
    "win_ok",
    "cuts",
    "burst_cap",
    "retry_after_holds",
    "fall_from",
    "iv_ok",
    "iv_refused",
)
_OBSOLETE = frozenset({"last_increase"})  # written by 0.1 snapshots; ignored on restore
