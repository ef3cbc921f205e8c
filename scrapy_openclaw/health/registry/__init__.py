"""The HealthRegistry: the one owner of per-domain state (docs/health.md is the manual).

The health middleware writes it, the queue asks it whether a domain may send,
metrics read ``state()`` and the checkpoint saves ``snapshot()``; nobody else
keeps a copy. The arithmetic lives in the functions beside it (see the class).
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from collections.abc import Callable, Container
from typing import TYPE_CHECKING, Any

from scrapy.utils.misc import build_from_crawler, load_object

from scrapy_openclaw.exceptions import OpenClawConfigError
from scrapy_openclaw.health.registry import eviction, snapshots
from scrapy_openclaw.health.registry.core import blocked_until, catch_up, open_circuit
from scrapy_openclaw.health.registry.defaults import scrapy_limits
from scrapy_openclaw.health.registry.limitfit import NOTE_ANSWER, LimitHistories, measures_limit, sent_at
from scrapy_openclaw.health.registry.pacing import (
    burst_of,
    concurrency_of,
    count_delivered,
    declare,
    decrease,
    increase,
    observe_latency,
    rate_of,
    seed,
)
from scrapy_openclaw.health.registry.record import DomainState, _Domain
from scrapy_openclaw.health.registry.recording import count_failure, hold_after_failure, refilled_at
from scrapy_openclaw.health.registry.refusals import keep_pace, pace_sample
from scrapy_openclaw.health.registry.remembered import Remembered
from scrapy_openclaw.health.registry.tuning import (
    _PROBE_RECHECK,
    _RATE_HEALTH_FLOOR,
    _SHARE_FAST,
    _SHARE_SLOW,
    _WAKE_RISE,
    CLOSED,
    DOMAIN,
    HALF_OPEN,
    OPEN,
    PAGE,
    SNAPSHOT_VERSION,
)
from scrapy_openclaw.health.registry.verdicts import (
    _accounted,
    _give_up_limit,
    _penalty,
    _rate_signal,
    _verdict,
    affects_health,
)
from scrapy_openclaw.policy import HealthPolicy, PolicySet
from scrapy_openclaw.runtime import shared
from scrapy_openclaw.settings import OpenClawSettings

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from scrapy_openclaw.errors import Classification
    from scrapy_openclaw.health.lag import CrawlerLag

__all__ = [
    "CLOSED",
    "DOMAIN",
    "HALF_OPEN",
    "OPEN",
    "PAGE",
    "SNAPSHOT_VERSION",
    "DomainState",
    "HealthRegistry",
    "affects_health",
    "health_registry_class",
    "scrapy_limits",
]


class HealthRegistry:
    """Per-domain health, rate, circuit and holds for one crawl.

    Each domain (a download-slot key, normally the hostname) has a health score,
    a rate with a token bucket, a circuit breaker, a latency average and a
    Retry-After hold. All times are UNIX seconds, so a snapshot keeps its meaning
    in another process. The class holds the records and answers for them; the
    arithmetic is in :mod:`.core` (a record brought up to date, the circuit
    opened), :mod:`.pacing` (the rate), :mod:`.verdicts` (whose trouble a failure
    is), :mod:`.recording`, :mod:`.limitfit`, :mod:`.eviction`, :mod:`.snapshots`;
    :mod:`.tuning` holds the constants the Lua port is sent as declared there.
    """

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
        self.histories = LimitHistories()  # answers and 429s per domain, for the limit fit
        self._uniform = uniform or random.uniform  # the cool-down jitter's random source (tests pin it)
        self._given_up: set[str] = set()  # domains past give_up_after: given up for good
        self.remembered = Remembered()  # what an earlier crawl learned (site memory), used when first seen
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

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> HealthRegistry:
        return cls(PolicySet.for_crawler(crawler), **scrapy_limits(crawler))

    @classmethod
    def for_crawler(cls, crawler: Crawler) -> HealthRegistry:
        """The registry of this crawl, of the class ``OPENCLAW_HEALTH_REGISTRY_CLASS`` names."""

        def build() -> HealthRegistry:
            path = OpenClawSettings.for_crawler(crawler).health_registry_class
            return build_from_crawler(health_registry_class(path), crawler)  # never any other callable

        return shared(crawler, "health", build)

    def policy(self, domain: str) -> HealthPolicy:
        return self._policies.for_domain(domain).health

    def own_stall(self, since: float, until: float) -> float:
        """Seconds between *since* and *until* the crawler itself stalled (its readings of
        the sites in that span are late by up to this much)."""
        return 0.0 if self.crawler_lag is None else self.crawler_lag.stalled(since, until)

    def _get(self, domain: str, now: float | None = None) -> tuple[_Domain, HealthPolicy]:
        """The domain's record brought up to *now* (made on first sight, from site memory if it has one)."""
        now = time.time() if now is None else now
        p = self.policy(domain)
        d = self._domains.get(domain)
        if d is None:
            d = self._domains[domain] = _Domain(p, now)
            remembered = self.remembered.get(domain)
            if remembered is not None:
                seed(d, p, now, *remembered)
            return d, p
        catch_up(d, p, now)
        return d, p

    # --- reading --------------------------------------------------------------

    def domains(self) -> list[str]:
        return list(self._domains)

    def state(self, domain: str, now: float | None = None) -> DomainState:
        d, p = self._get(domain, now)
        return snapshots.state_of(domain, d, p, self.reported_rate_cap, self.default_concurrency)

    def concurrency(self, domain: str, slot_concurrency: int | None = None) -> int:
        """Concurrent downloads the domain may have: its cap (the policy's
        ``base_concurrency``, the slot's own concurrency) scaled by health."""
        d, p = self._get(domain)
        return concurrency_of(d, p, slot_concurrency, self.default_concurrency)

    def slot_limits(self, domain: str, slot_concurrency: int) -> tuple[int, float]:
        """:meth:`concurrency` and :meth:`blocked_until` in one read: what the health middleware
        sets on the domain's download slot after each response."""
        d, p = self._get(domain)
        return concurrency_of(d, p, slot_concurrency, self.default_concurrency), blocked_until(d)

    def blocked_until(self, domain: str, now: float | None = None) -> float:
        """When the domain's hold or open circuit ends (``<= now``: not blocked).

        Unlike :meth:`ready_at` this ignores tokens and the half-open probe:
        it is the time before which *nothing* may reach the domain.
        """
        d, _ = self._get(domain, now)
        return blocked_until(d)

    def down_for(self, domain: str, now: float | None = None) -> float:
        """Seconds since the circuit opened without closing since (0.0 while it is closed)."""
        now = time.time() if now is None else now
        d, _ = self._get(domain, now)
        if d.circuit == CLOSED or not d.down_since:
            return 0.0
        return max(0.0, now - d.down_since)

    def given_up(self, domain: str, now: float | None = None) -> bool:
        """Whether *domain* has been down too long (then for good): ``give_up_after``
        seconds, or ``unreachable_give_up`` for a domain that never answered."""
        if domain in self._given_up:
            return True
        d = self._domains.get(domain)
        if d is not None and d.ctl_down:
            return True
        if d is None or d.circuit == CLOSED:
            return False  # the common case, without bringing the record up to date
        limit = _give_up_limit(d, self.policy(domain))
        if limit is None or self.down_for(domain, now) < limit:
            return False
        self._given_up.add(domain)
        return True

    def ready_at(self, domain: str, now: float | None = None) -> float:
        """The earliest UNIX time a request to *domain* may be sent (*now* if it may go now)."""
        now = time.time() if now is None else now
        d, p = self._get(domain, now)
        ready = max(now, blocked_until(d))
        if d.circuit == HALF_OPEN and d.probe_at:
            ready = max(ready, now + _PROBE_RECHECK)
        if d.tokens < 1.0:
            ready = max(ready, now + (1.0 - d.tokens) / rate_of(d, p))
        return ready

    def judge(
        self,
        domain: str,
        classification: Classification | None,
        *,
        retry_after: float | None = None,
        failed_before: float | None = None,
        now: float | None = None,
    ) -> str | None:
        """Whose trouble a failure is: ``"domain"``, ``"page"``, or None (says nothing).

        *failed_before* is when this URL last failed (a retry's previous
        attempt), if it did: a retry failing is the page's trouble unless its
        domain had trouble of its own (a domain verdict) since.
        """
        d, _ = self._get(domain, now)
        return _verdict(d, classification, retry_after, failed_before)[0]

    # --- recording (the health middleware's writes) --------------------------

    def record_success(self, domain: str, latency: float | None, now: float | None = None) -> str | None:
        """Count a successful request; ``"closed"`` if it closed the circuit (a probe came back).

        Recording returns the circuit transition it caused itself, so that a
        component sharing the state with others (several workers on one Redis)
        reports each opening and closing once, where it happened.
        """
        now = time.time() if now is None else now
        d, p = self._get(domain, now)
        d.requests += 1
        d.successes += 1
        d.consecutive_failures = 0
        count_delivered(d, now)
        if pace_sample(d, now, False, rate_of(d, p), sent_at(now, latency)):
            keep_pace(d, now, p.initial_rate)
            self._wake(domain)  # (parked at the slow pace: the queue looks at it again now)
        self.histories.note(domain, d.born, sent_at(now, latency), NOTE_ANSWER)
        d.answered_at = d.last_success = now
        d.health = min(100.0, d.health + p.success_reward)
        d.share_fast -= _SHARE_FAST * d.share_fast
        d.share_slow -= _SHARE_SLOW * d.share_slow
        congested = observe_latency(d, p, self.site_latency(latency, now))
        closed = d.circuit == HALF_OPEN
        if closed:  # the learned limit stays: the domain resumes at it
            d.circuit, d.probe_at, d.down_since = CLOSED, 0.0, 0.0
        if congested:
            if decrease(d, p, now, rate_bound=True):  # latency above its baseline
                self.cuts_by_cause["latency"] += 1
        else:
            paced = d.rate
            increase(d, p, now)
            if d.rate > _WAKE_RISE * paced:  # (a block ended: parked at its slow pace, the queue looks again)
                self._wake(domain)
        return CLOSED if closed else None

    def site_latency(self, latency: float | None, now: float) -> float | None:
        """*latency* less the time the crawler itself stalled while it ran: the site's part."""
        if latency is None or not math.isfinite(latency) or latency <= 0:
            return latency
        return max(0.0, latency - self.own_stall(now - latency, now))

    def record_failure(
        self,
        domain: str,
        classification: Classification,
        now: float | None = None,
        retry_after: float | None = None,
        failed_before: float | None = None,
        latency: float | None = None,
    ) -> str | None:
        """Count a failed request; *retry_after* is the server's wait in seconds, if it sent one,
        *latency* the answer's download latency (when the request was sent, for the limit fit).

        Only a domain signal (see :meth:`judge`) costs health, pace or the
        circuit, and only one the failure itself shows (see ``verdicts._accounted``).
        Returns ``"open"`` if this failure opened the circuit (or reopened it
        after a failed probe).
        """
        now = time.time() if now is None else now
        d, p = self._get(domain, now)
        note = count_failure(d, classification, retry_after, now)
        if note:  # (an answer also feeds the limit fit)
            self.histories.note(domain, d.born, sent_at(now, latency), note)
        rate_signal = _rate_signal(classification, retry_after)
        domain_signal, in_share = _accounted(d, classification, retry_after, failed_before)
        if rate_signal and pace_sample(d, now, True, rate_of(d, p), sent_at(now, latency)):
            keep_pace(d, now, p.initial_rate)  # (judged pace-independent by this very refusal)
            self._wake(domain)
            domain_signal = False
        if in_share:
            d.share_fast += _SHARE_FAST * (1.0 - d.share_fast)
            d.share_slow += _SHARE_SLOW * (1.0 - d.share_slow)
        if not domain_signal:
            if d.circuit == HALF_OPEN:
                d.probe_at = 0.0  # a page's own failure proves nothing: let another request probe
            return None
        d.troubled_at = now
        if not rate_signal:  # (failures in a row that open the circuit are sickness, not "slower")
            d.consecutive_failures += 1
        penalty, congestion = _penalty(classification, p)
        # A congestion signal costs its penalty once per event (when it also cuts the rate); a
        # failed probe or a late answer costs nothing while down: the growing cool-down is the penalty.
        measured = measures_limit(classification.status, retry_after)
        history = self.histories.get(domain) if measured else None
        fresh = congestion and decrease(
            d,
            p,
            now,
            measured=measured,
            history=history,
            sent=sent_at(now, latency),
            refilled_at=refilled_at(p, now, retry_after),
        )
        if fresh:
            self.cuts_by_cause[str(classification.status or classification.reason)] += 1
        closed = d.circuit == CLOSED
        if closed and (fresh or not congestion):
            floor = min(d.health, max(_RATE_HEALTH_FLOOR, p.circuit_floor)) if rate_signal else 0.0
            health = max(floor, d.health - penalty)
            if rate_signal:
                d.rate_cost = min(100.0, d.rate_cost + d.health - health)
            d.health = health
        hold_after_failure(d, p, classification, retry_after, now, closed=closed)
        if d.circuit == HALF_OPEN or (
            d.circuit == CLOSED
            and not rate_signal  # the site answered: slower, not sick
            and (d.health < p.circuit_floor or d.consecutive_failures >= p.circuit_failures)
        ):
            open_circuit(d, p, now, self._uniform)
            return OPEN
        return None

    # --- admitting ------------------------------------------------------------

    def try_acquire(self, domain: str, now: float | None = None, *, token: bool = True) -> bool:
        """Take a token (and, when half-open, the single probe) if the domain may send now.

        ``token=False`` checks only the hold and the circuit (and still takes
        the probe): for callers that pace by other means, such as the
        download slot's delay.
        """
        now = time.time() if now is None else now
        d, _ = self._get(domain, now)
        probe_out = d.circuit == HALF_OPEN and d.probe_at
        if blocked_until(d) > now or probe_out or (token and d.tokens < 1.0):
            return False
        if token:
            d.tokens -= 1.0
        if d.circuit == HALF_OPEN:
            d.probe_at = now
        return True

    def refund(self, domain: str, now: float | None = None) -> None:
        """Give back the token of a request the site never got (the HTTP cache answered it):
        a cached re-run is not paced by a rate meant for the site. A domain the refund makes
        ready again is woken (``readiness_epoch``)."""
        d, p = self._get(domain, now)
        was_ready = d.tokens >= 1.0
        d.tokens = min(float(burst_of(d, p)), d.tokens + 1.0)
        if not was_ready and d.tokens >= 1.0:
            self._wake(domain)

    def hold(self, domain: str, until: float) -> None:
        """Send nothing to *domain* before *until* (UNIX time); holds only ever extend."""
        d, _ = self._get(domain)
        d.hold_until = max(d.hold_until, until)

    def _wake(self, domain: str | None) -> None:
        """*domain* (None: every one) may be ready sooner than a queue parked it for: the
        queues look again (``readiness_epoch``)."""
        self.readiness_epoch += 1

    def control(self, domain: str, now: float | None = None, **changes: float) -> None:
        """Apply operator overrides (see scrapy_openclaw.control): ``ctl_hold``, ``ctl_rate``,
        ``ctl_concurrency``, ``ctl_down`` (0: cleared). Ending a give-up also forgives the
        outage so far: ``give_up_after`` counts again from *now*."""
        now = time.time() if now is None else now
        d, _ = self._get(domain, now)
        for name, value in changes.items():
            if name not in ("ctl_hold", "ctl_rate", "ctl_concurrency", "ctl_down"):
                raise ValueError(f"unknown override {name!r}")
            setattr(d, name, int(value) if name in ("ctl_concurrency", "ctl_down") else float(value))
        self._wake(domain)
        if changes.get("ctl_down", 1) == 0:
            self._given_up.discard(domain)
            if d.down_since:
                d.down_since = now

    def overrides(self, domain: str) -> dict[str, Any]:
        """The operator overrides in force for *domain* (None: not set)."""
        return snapshots.overrides_of(self._domains.get(domain))

    def declare_limit(self, domain: str, pace: float, now: float | None = None) -> None:
        """Pace *domain* just under the limit its RateLimit headers declare (*pace* req/s; 0:
        none any more) from now on, up or down (see :func:`.pacing.declare`). A used-up quota
        is waited out with :meth:`hold`."""
        now = time.time() if now is None else now
        d, p = self._get(domain, now)
        declare(d, p, now, pace)
        self._wake(domain)

    def declared_pace(self, domain: str) -> float:
        """The pace *domain* last declared (req/s; 0: none), as this process knows it."""
        d = self._domains.get(domain)
        return d.declared if d is not None else 0.0

    def set_crawl_delay(self, domain: str, seconds: float, *, owed: int = 0) -> None:
        """Space requests to *domain* at least *seconds* apart (robots.txt Crawl-delay; 0: none).

        It is learned from the robots.txt request just sent: the next request waits a full delay,
        and *owed* more for the pages already past the queue (waiting for robots.txt; the
        download slot spaces those).
        """
        d, _ = self._get(domain)
        d.crawl_delay = max(0.0, float(seconds))
        if d.crawl_delay > 0:
            d.tokens = min(d.tokens, 0.0) - max(0, int(owed))

    # --- memory and checkpoints ------------------------------------------------

    def evict_idle(self, now: float | None = None, keep: Container[str] = ()) -> list[str]:
        """Forget the idle domains whose state need not outlive idleness; their names.

        Idle: not in *keep* (the caller's domains with requests pending or in
        flight) and nothing heard from it for ``idle_ttl`` seconds (see
        :func:`.eviction.idle_domains` for what is never forgotten). A
        forgotten domain that comes back starts fresh.
        """
        if self.idle_ttl <= 0:
            return []
        now = time.time() if now is None else now
        gone = eviction.idle_domains(self._domains, now, self.idle_ttl, keep, self._given_up)
        for name in gone:
            del self._domains[name]
        compact = len(gone) > len(self._domains)
        if compact:  # a dict never shrinks by itself
            self._domains = dict(self._domains)
        self.histories.forget(gone, compact=compact)
        self.evicted += len(gone)
        return gone

    def bytes_per_domain(self, sample: int = 50) -> float:
        """An estimate of the memory one known domain costs here (its record and fit history)."""
        return eviction.bytes_per_domain(self._domains, self.histories.by_domain, sample)

    def snapshot(self) -> dict[str, Any]:
        """Every domain's state as JSON-safe data (for checkpoints)."""
        return snapshots.snapshot_of(self._domains)

    def restore(self, data: Any) -> None:
        """Replace the state with a :meth:`snapshot`; bad data raises ValueError naming the spot."""
        self._domains = snapshots.domains_from(data, self.policy)
        self.histories.clear()  # (not in snapshots: a fit starts again from the next answers)
        self._wake(None)


def health_registry_class(path: Any) -> type[HealthRegistry]:
    """The class ``OPENCLAW_HEALTH_REGISTRY_CLASS`` names; a config error unless it is a HealthRegistry."""
    try:
        cls = load_object(path)
    except (ImportError, NameError, ValueError, AttributeError, TypeError) as exc:
        raise OpenClawConfigError(f"setting OPENCLAW_HEALTH_REGISTRY_CLASS={path!r}: cannot load it: {exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, HealthRegistry)):
        raise OpenClawConfigError(
            f"setting OPENCLAW_HEALTH_REGISTRY_CLASS={path!r}: must name a subclass of "
            "scrapy_openclaw.health.HealthRegistry"
        )
    return cls
