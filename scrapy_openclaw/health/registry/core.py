"""The registry's records and their clock: each domain's record, brought up to date when read.

The base of :class:`HealthRegistry`: its constructor, the domains' policies,
the catch-up a record gets on every read (recovery, cool-down, tokens) and the
opening of a circuit. The other parts (recording, eviction, snapshots) build on it.
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from scrapy_openclaw.health.registry.limitfit import LimitHistory
from scrapy_openclaw.health.registry.pacing import _Pacing
from scrapy_openclaw.health.registry.record import _Domain
from scrapy_openclaw.health.registry.tuning import _MAX_DOUBLINGS, _PROBE_LOST_AFTER, CLOSED, HALF_OPEN, OPEN
from scrapy_openclaw.policy import HealthPolicy, PolicySet

if TYPE_CHECKING:
    from scrapy_openclaw.health.lag import CrawlerLag


class _RegistryCore(_Pacing):
    """The domain records of one crawl and their policies (see :class:`HealthRegistry`)."""

    def __init__(
        self,
        policies: PolicySet | None = None,
        *,
        uniform: Callable[[float, float], float] | None = None,
        default_concurrency: int = 8,
        reported_rate_cap: float = math.inf,
        idle_ttl: float = 0.0,
    ):
        self._policies = policies or PolicySet({}, [])
        self._domains: dict[str, _Domain] = {}
        self._histories: dict[str, LimitHistory] = {}  # answers and 429s per domain, for the limit fit
        self._uniform = uniform or random.uniform  # the cool-down jitter's random source (tests pin it)
        self._given_up: set[str] = set()  # domains past give_up_after: given up for good
        #: domain -> (limit, burst, crawl delay) an earlier crawl learned (site memory), used when first seen
        self._seeds: dict[str, tuple[float | None, int, float]] = {}
        #: bumped when a domain may be ready sooner than ``ready_at`` said (an operator override,
        #: a restore): the queue then looks again at the domains it parked
        self.readiness_epoch = 0
        #: seconds an unused domain's state is kept (OPENCLAW_HEALTH_IDLE_TTL; 0: for ever)
        self.idle_ttl = max(0.0, float(idle_ttl))
        self.evicted = 0  # domains forgotten so far
        #: a domain's concurrency when neither its policy nor its slot says otherwise
        self.default_concurrency = max(1, int(default_concurrency))
        #: the rate DOWNLOAD_DELAY allows: what state() reports at most (Scrapy's slot paces it)
        self.reported_rate_cap = reported_rate_cap
        #: the crawler's own event-loop stalls (set by the health middleware; None: not watched)
        self.crawler_lag: CrawlerLag | None = None
        #: rate cuts by what caused them ("latency", "429", "503", ...), for the stats
        self.cuts_by_cause: Counter[str] = Counter()

    def own_stall(self, since: float, until: float) -> float:
        """Seconds between *since* and *until* the crawler itself stalled (its readings of
        the sites in that span are late by up to this much)."""
        return 0.0 if self.crawler_lag is None else self.crawler_lag.stalled(since, until)

    def policy(self, domain: str) -> HealthPolicy:
        return self._policies.for_domain(domain).health

    def _get(self, domain: str, now: float | None = None) -> tuple[_Domain, HealthPolicy]:
        """The domain's record brought up to *now*: recovery, cooldown, refilled tokens."""
        now = time.time() if now is None else now
        p = self.policy(domain)
        d = self._domains.get(domain)
        if d is None:
            d = self._domains[domain] = _Domain(p, now)
            seed = self._seeds.get(domain)
            if seed is not None:
                self._seed(d, p, now, *seed)
            return d, p
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
            d.tokens = min(float(self._burst(d, p)), d.tokens + unblocked * self._rate(d, p))
            d.updated = now
        if d.circuit == OPEN and now >= d.opened_at + d.cooldown:
            d.circuit, d.probe_at = HALF_OPEN, 0.0
        elif d.circuit == HALF_OPEN and d.probe_at and now - d.probe_at > max(d.cooldown, _PROBE_LOST_AFTER):
            d.probe_at = 0.0  # the probe never reported back (dropped elsewhere): allow another
        return d, p

    def _open(self, d: _Domain, p: HealthPolicy, now: float) -> None:
        """Open the circuit for a cool-down that doubles with each opening not yet forgiven.

        The time spent closed since the last cool-down ended forgives one
        doubling per ``circuit_cooldown`` (a failed probe reopens at once:
        nothing forgiven). A circuit that was never opened has nothing to forgive.
        """
        if d.circuit == CLOSED:
            d.down_since = now  # an outage begins
        if d.circuit == CLOSED and d.opens:
            healthy = max(0.0, now - (d.opened_at + d.cooldown))
            d.opens = max(0, d.opens - int(healthy / p.circuit_cooldown))
        cap = max(p.circuit_cooldown_max, p.circuit_cooldown)
        base = min(cap, p.circuit_cooldown * 2.0 ** min(d.opens, _MAX_DOUBLINGS))
        jitter = p.circuit_jitter
        d.cooldown = base * self._uniform(1.0 - jitter, 1.0 + jitter) if jitter else base
        d.opens = min(d.opens + 1, _MAX_DOUBLINGS)
        d.circuit, d.opened_at, d.probe_at = OPEN, now, 0.0
        d.tokens = 1.0  # the probe's, and no more: nothing is saved up while open (see _get)
