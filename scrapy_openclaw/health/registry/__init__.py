"""The HealthRegistry: the one owner of per-domain state.

Each domain (a Scrapy download-slot key, normally the hostname) has a health
score, a request rate with a token bucket, a circuit breaker, a latency
average and a Retry-After hold. The DomainHealthMiddleware writes it
(``record_success`` / ``record_failure``), the queue asks it whether a domain
may send (``ready_at`` / ``try_acquire``), metrics read ``state()`` and the
checkpoint saves ``snapshot()``. Nobody else keeps a copy of domain state.

A domain is judged by domain signals only (:meth:`HealthRegistry.judge`):
429, Retry-After, connection failures and timeouts, and 5xx answers whose
share of the domain's recent answers rises clearly above its own baseline
(a 503 window). A URL that fails again while its siblings succeeded since
is the page's trouble: it is retried briefly and dead-lettered, and the
domain keeps its pace. docs/health.md is the manual; here:

- **Pace.** No fixed ceiling by default: slow start grows the rate by half
  per success, so a healthy domain is soon bounded only by concurrency, as in
  plain Scrapy. The first congestion signal (429/503, a timeout, latency
  rising above its baseline) sets the learned limit from the rate the site
  actually delivered; later ones cut by ``rate_decrease``. Between them the
  rate follows a cubic (TCP CUBIC): back to the limit quickly, flat near it,
  then probing past it ever faster, which finds limits from 2 to 200 req/s
  without the burst a doubling causes. ``base_rate``, robots.txt Crawl-delay
  and ``min_rate`` bound it.
- **Circuit** (outlier ejection, as Envoy does it): opens below
  ``circuit_floor`` health or after ``circuit_failures`` domain failures in
  a row; a half-open probe closes it. Cool-downs double per opening in a row
  (with jitter), up to ``circuit_cooldown_max``; time spent healthy forgives.
  Holds and cool-downs keep the learned limit, so the domain resumes at it.
- **Give up**: a domain whose circuit has not closed for ``give_up_after``
  seconds (``unreachable_give_up`` if it never answered at all) is given up
  for the crawl: its requests become dead letters.
- **Forget** (:meth:`HealthRegistry.evict_idle`): a domain with nothing
  pending or in flight and nothing heard for ``OPENCLAW_HEALTH_IDLE_TTL`` is
  dropped (and so left out of checkpoints), unless it is held, its circuit is
  not closed, it is given up, under an operator override or has a Crawl-delay.
  A learned limit is not kept past that: after that long quiet it is stale,
  and a returning domain re-learns it from slow start.

All times are UNIX seconds, so a snapshot stays meaningful in another process.

The registry's parts: :mod:`.core` (the records, brought up to date when
read), :mod:`.pacing` (the rate arithmetic), :mod:`.recording`,
:mod:`.verdicts` (whose trouble a failure is), :mod:`.eviction`,
:mod:`.snapshots`, :mod:`.record` (the record and its read-only view) and
:mod:`.tuning` (the constants, which the Lua port is sent as they are
declared there).
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

from scrapy.utils.misc import build_from_crawler, load_object

from scrapy_openclaw.exceptions import OpenClawConfigError
from scrapy_openclaw.health.registry.eviction import _DICT_SLOT as _DICT_SLOT
from scrapy_openclaw.health.registry.eviction import _Eviction
from scrapy_openclaw.health.registry.eviction import _sampled_bytes as _sampled_bytes
from scrapy_openclaw.health.registry.pacing import _count_delivered as _count_delivered
from scrapy_openclaw.health.registry.pacing import _delivered as _delivered
from scrapy_openclaw.health.registry.record import _COUNTERS as _COUNTERS
from scrapy_openclaw.health.registry.record import _FIELD_TYPES as _FIELD_TYPES
from scrapy_openclaw.health.registry.record import _OBSOLETE as _OBSOLETE
from scrapy_openclaw.health.registry.record import _OPTIONAL as _OPTIONAL
from scrapy_openclaw.health.registry.record import DomainState
from scrapy_openclaw.health.registry.record import _Domain as _Domain
from scrapy_openclaw.health.registry.recording import _Recording
from scrapy_openclaw.health.registry.snapshots import _Snapshots
from scrapy_openclaw.health.registry.tuning import (
    _MAX_RATE,
    _PROBE_RECHECK,
    _SEED_MARGIN,
    CLOSED,
    DOMAIN,
    HALF_OPEN,
    OPEN,
    PAGE,
    SNAPSHOT_VERSION,
)
from scrapy_openclaw.health.registry.verdicts import _accounted as _accounted
from scrapy_openclaw.health.registry.verdicts import _asks_to_slow_down as _asks_to_slow_down
from scrapy_openclaw.health.registry.verdicts import _clustering as _clustering
from scrapy_openclaw.health.registry.verdicts import _give_up_limit, _verdict, affects_health
from scrapy_openclaw.health.registry.verdicts import _penalty as _penalty
from scrapy_openclaw.health.registry.verdicts import _rate_signal as _rate_signal
from scrapy_openclaw.policy import PolicySet
from scrapy_openclaw.runtime import shared
from scrapy_openclaw.settings import OpenClawSettings

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from scrapy_openclaw.errors import Classification

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


class HealthRegistry(_Recording, _Eviction, _Snapshots):
    """Per-domain health, rate, circuit and holds for one crawl (see the module doc)."""

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

    # --- reading --------------------------------------------------------------

    def domains(self) -> list[str]:
        return list(self._domains)

    def state(self, domain: str, now: float | None = None) -> DomainState:
        d, p = self._get(domain, now)
        rate = min(self._rate(d, p), self.reported_rate_cap)
        return DomainState(
            domain=domain,
            health=d.health,
            rate=math.inf if rate >= _MAX_RATE else rate,
            tokens=d.tokens,
            burst=self._burst(d, p),
            concurrency=self._concurrency(d, p, None),
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
        )

    def concurrency(self, domain: str, slot_concurrency: int | None = None) -> int:
        """Concurrent downloads the domain may have: its cap (the policy's
        ``base_concurrency``, the slot's own concurrency) scaled by health."""
        d, p = self._get(domain)
        return self._concurrency(d, p, slot_concurrency)

    def slot_limits(self, domain: str, slot_concurrency: int) -> tuple[int, float]:
        """:meth:`concurrency` and :meth:`blocked_until` in one read: what the health middleware
        sets on the domain's download slot after each response."""
        d, p = self._get(domain)
        return self._concurrency(d, p, slot_concurrency), self._blocked_until(d)

    def blocked_until(self, domain: str, now: float | None = None) -> float:
        """When the domain's hold or open circuit ends (``<= now``: not blocked).

        Unlike :meth:`ready_at` this ignores tokens and the half-open probe:
        it is the time before which *nothing* may reach the domain.
        """
        d, _ = self._get(domain, now)
        return self._blocked_until(d)

    @staticmethod
    def _blocked_until(d: _Domain) -> float:
        return max(d.hold_until, d.opened_at + d.cooldown if d.circuit == OPEN else 0.0, d.ctl_hold)

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
        ready = max(now, self._blocked_until(d))
        if d.circuit == HALF_OPEN and d.probe_at:
            ready = max(ready, now + _PROBE_RECHECK)
        if d.tokens < 1.0:
            ready = max(ready, now + (1.0 - d.tokens) / self._rate(d, p))
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
        if self._blocked_until(d) > now or probe_out or (token and d.tokens < 1.0):
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
        d.tokens = min(float(self._burst(d, p)), d.tokens + 1.0)
        if not was_ready and d.tokens >= 1.0:
            self.readiness_epoch += 1

    def hold(self, domain: str, until: float) -> None:
        """Send nothing to *domain* before *until* (UNIX time); holds only ever extend."""
        d, _ = self._get(domain)
        d.hold_until = max(d.hold_until, until)

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
        self.readiness_epoch += 1
        if changes.get("ctl_down", 1) == 0:
            self._given_up.discard(domain)
            if d.down_since:
                d.down_since = now

    def overrides(self, domain: str) -> dict[str, Any]:
        """The operator overrides in force for *domain* (None: not set)."""
        d = self._domains.get(domain)
        if d is None:
            return {"hold_until": None, "rate": None, "concurrency": None, "given_up": False}
        return {
            "hold_until": d.ctl_hold or None,
            "rate": d.ctl_rate or None,
            "concurrency": int(d.ctl_concurrency) or None,
            "given_up": bool(d.ctl_down),
        }

    def remember(self, domain: str, *, limit: float | None, burst: int = 0, crawl_delay: float = 0.0) -> None:
        """Start *domain*, when first seen, at what an earlier crawl learned (site memory): at its
        *limit* on the cubic's plateau instead of slow start, bursts no bigger than *burst*,
        spaced by *crawl_delay* before its robots.txt is back. A domain already seen keeps its state."""
        self._seeds[domain] = (limit, int(burst), float(crawl_delay))

    def resumed_limit(self, domain: str) -> float | None:
        """The limit site memory started *domain* at (its remembered one x ``_SEED_MARGIN``),
        None without one: a domain whose limit still equals it was not measured again."""
        seed = self._seeds.get(domain)
        return None if seed is None or seed[0] is None else min(float(seed[0]) * _SEED_MARGIN, _MAX_RATE)

    def remembered_crawl_delay(self, domain: str) -> float:
        """The Crawl-delay site memory started *domain* with (0.0: none)."""
        seed = self._seeds.get(domain)
        return seed[2] if seed is not None else 0.0

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


def scrapy_limits(crawler: Crawler) -> dict[str, Any]:
    """The registry's defaults from the project's Scrapy settings: the per-domain
    (or per-IP) concurrency, and the rate ``DOWNLOAD_DELAY`` allows."""
    settings = crawler.settings
    per_ip = int(settings["CONCURRENT_REQUESTS_PER_IP"] or 0)  # ([]: getint warns that it is deprecated)
    delay = settings.getfloat("DOWNLOAD_DELAY")
    return {
        "default_concurrency": per_ip or settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN"),
        "reported_rate_cap": 1.0 / delay if delay > 0 else math.inf,
        "idle_ttl": OpenClawSettings.for_crawler(crawler).health_idle_ttl,
    }


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
