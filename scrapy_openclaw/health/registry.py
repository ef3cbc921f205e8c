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
domain keeps its pace. The README's health section is the manual; here:

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
"""

from __future__ import annotations

import math
import random
import sys
import time
from collections.abc import Callable, Container
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy.utils.misc import build_from_crawler

from scrapy_openclaw.errors import ErrorClass
from scrapy_openclaw.policy import HealthPolicy, PolicySet
from scrapy_openclaw.runtime import shared
from scrapy_openclaw.settings import OpenClawSettings, health_registry_class, read_setting

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from scrapy_openclaw.errors import Classification

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"
#: Verdicts of :meth:`HealthRegistry.judge`.
DOMAIN = "domain"
PAGE = "page"

SNAPSHOT_VERSION = 1
_LATENCY_ALPHA = 0.2  # weight of a new sample in the latency EWMA
_BASELINE_DRIFT = 0.01  # how fast the best-latency baseline follows a lasting change
_LATENCY_SLACK = 0.05  # seconds; latency noise below this is never congestion
_MIN_DECREASE_GAP = 1.0  # seconds between two multiplicative decreases (or one RTT if longer)
_SLOW_START_GAIN = 0.5  # slow start: the rate grows by this share with every success ...
_SLOW_START_DOUBLING = 0.1  # ... but doubles at most once per this many seconds (from initial_rate)
_PROBE_GROWTH = 1.5  # after the first cut the rate grows by this factor per second ...
_MAX_PROBE_SECONDS = 30.0  # ... (a bound for the exponent)
_CUT_FLOOR = 0.5  # a cut after the first keeps at least this share of the rate (a guard against a bad window)
_MAX_RATE = 100000.0  # req/s; at this rate pacing has stopped mattering ("unpaced")
_BURST_SECONDS = 0.25  # the token bucket holds at most this much time's worth of requests
_WINDOW = 1.0  # seconds; the delivered-rate estimate is the last such window and the open one
_STALE_WINDOW = 5.0  # a window longer than this (an idle domain) says nothing about its rate
# 5xx share of recent fresh answers: a fast and a slow EWMA (about the last 5 and 50);
# a 5xx is a domain signal when the fast share reaches the trigger and exceeds the
# slow baseline by the margin (failures clustering while successes stop). A 503
# window trips it at its 6th failure; one broken page in five, on about 4% of
# 100-page crawls (a run of bad luck), and then for one failure.
_SHARE_FAST = 0.2
_SHARE_SLOW = 0.02
_SHARE_TRIGGER = 0.7
_SHARE_MARGIN = 0.25
_PROBE_RECHECK = 1.0  # seconds; how soon to ask again while a half-open probe is out
# A half-open probe that has not reported back after this long (and after the
# cool-down) was lost on the way (e.g. dropped by another middleware): allow another.
_PROBE_LOST_AFTER = 30.0
_MAX_DOUBLINGS = 32  # 2**32 x any cool-down is far past any cap


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
        self.cuts = 0  # 0: slow start; 1: cut, limit guessed; 2: a second 429 measured it (cubic plateau)
        self.born = now  # when the domain was first seen: slow start doubles at most this fast from it
        self.blocked_seconds = 0.0  # time spent held (Retry-After) or with the circuit open
        self.ctl_hold = 0.0
        self.ctl_rate = 0.0
        self.ctl_concurrency = 0
        self.ctl_down = 0


# Field types in a snapshot: how restore() validates what it reads.
_FIELD_TYPES: dict[str, tuple[type, ...]] = {name: (int, float) for name in _Domain.__slots__ if name != "circuit"}
_OPTIONAL = (int, float, type(None))
_FIELD_TYPES.update(circuit=(str,), threshold=_OPTIONAL, latency=_OPTIONAL, best_latency=_OPTIONAL, delivered=_OPTIONAL)
_COUNTERS = ("consecutive_failures", "requests", "successes", "failures", "opens", "win_ok", "cuts")
_OBSOLETE = frozenset({"last_increase"})  # written by 0.1 snapshots; ignored on restore


def affects_health(classification: Classification | None) -> bool:
    """Whether an outcome can say something about the domain's health.

    A 404 or 403 is the server answering normally about one page; only
    network failures, retryable statuses and 5xx may count against a domain
    (and :meth:`HealthRegistry.judge` decides whether they do).
    """
    if classification is None:
        return False
    if classification.error_class in (ErrorClass.NETWORK, ErrorClass.PROTOCOL_RETRYABLE, ErrorClass.BLOCKED):
        return True
    return (classification.status or 0) >= 500


class HealthRegistry:
    """Per-domain health, rate, circuit and holds for one crawl (see the module doc)."""

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
        self._uniform = uniform or random.uniform  # the cool-down jitter's random source (tests pin it)
        self._given_up: set[str] = set()  # domains past give_up_after: given up for good
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

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> HealthRegistry:
        return cls(PolicySet.for_crawler(crawler), **scrapy_limits(crawler.settings))

    @classmethod
    def for_crawler(cls, crawler: Crawler) -> HealthRegistry:
        """The registry of this crawl, of the class ``OPENCLAW_HEALTH_REGISTRY_CLASS`` names."""

        def build() -> HealthRegistry:
            path = OpenClawSettings.for_crawler(crawler).health_registry_class
            return build_from_crawler(health_registry_class(path), crawler)  # never any other callable

        return shared(crawler, "health", build)

    def policy(self, domain: str) -> HealthPolicy:
        return self._policies.for_domain(domain).health

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
        )

    def concurrency(self, domain: str, slot_concurrency: int | None = None) -> int:
        """Concurrent downloads the domain may have: its cap (the policy's
        ``base_concurrency``, the slot's own concurrency) scaled by health."""
        d, p = self._get(domain)
        return self._concurrency(d, p, slot_concurrency)

    def blocked_until(self, domain: str, now: float | None = None) -> float:
        """When the domain's hold or open circuit ends (``<= now``: not blocked).

        Unlike :meth:`ready_at` this ignores tokens and the half-open probe:
        it is the time before which *nothing* may reach the domain.
        """
        d, _ = self._get(domain, now)
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
        ready = max(now, self.blocked_until(domain, now))
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
        if self.blocked_until(domain, now) > now or probe_out or (token and d.tokens < 1.0):
            return False
        if token:
            d.tokens -= 1.0
        if d.circuit == HALF_OPEN:
            d.probe_at = now
        return True

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

    def set_crawl_delay(self, domain: str, seconds: float) -> None:
        """Space requests to *domain* at least *seconds* apart (robots.txt Crawl-delay; 0: none).

        It is learned from the robots.txt request just sent: the next request waits a full delay.
        """
        d, _ = self._get(domain)
        d.crawl_delay = max(0.0, float(seconds))
        if d.crawl_delay > 0:
            d.tokens = min(d.tokens, 0.0)

    # --- recording ------------------------------------------------------------

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
        _count_delivered(d, now)
        d.answered_at = d.last_success = now
        d.health = min(100.0, d.health + p.success_reward)
        d.share_fast -= _SHARE_FAST * d.share_fast
        d.share_slow -= _SHARE_SLOW * d.share_slow
        congested = self._observe_latency(d, p, latency)
        closed = d.circuit == HALF_OPEN
        if closed:  # the learned limit stays: the domain resumes at it
            d.circuit, d.probe_at, d.down_since = CLOSED, 0.0, 0.0
        if congested:
            self._decrease(d, p, now)
        else:
            self._increase(d, p, now)
        return CLOSED if closed else None

    def record_failure(
        self,
        domain: str,
        classification: Classification,
        now: float | None = None,
        retry_after: float | None = None,
        failed_before: float | None = None,
    ) -> str | None:
        """Count a failed request; *retry_after* is the server's wait in seconds, if it sent one.

        Only a domain signal (see :meth:`judge`) costs health, pace or the
        circuit, and only one the failure itself shows (see :func:`_accounted`).
        Returns ``"open"`` if this failure opened the circuit (or reopened it
        after a failed probe).
        """
        now = time.time() if now is None else now
        d, p = self._get(domain, now)
        d.requests += 1
        d.failures += 1
        if classification.status is not None:
            d.answered_at = now
        domain_signal, in_share = _accounted(d, classification, retry_after, failed_before)
        if in_share:
            d.share_fast += _SHARE_FAST * (1.0 - d.share_fast)
            d.share_slow += _SHARE_SLOW * (1.0 - d.share_slow)
        if not domain_signal:
            if d.circuit == HALF_OPEN:
                d.probe_at = 0.0  # a page's own failure proves nothing: let another request probe
            return None
        d.troubled_at = now
        d.consecutive_failures += 1
        penalty, congestion = _penalty(classification, p)
        # A congestion signal costs its penalty once per event (when it also cuts
        # the rate). While the circuit is open or half-open the domain is known
        # to be down: a failed probe or a late answer costs no health and no hold
        # of its own; the growing cool-down is the penalty.
        fresh = congestion and self._decrease(d, p, now, measured=classification.status == 429)
        closed = d.circuit == CLOSED
        if closed and (fresh or not congestion):
            d.health = max(0.0, d.health - penalty)
        if retry_after is not None:
            d.hold_until = max(d.hold_until, now + min(max(retry_after, 0.0), p.retry_after_cap))
        elif classification.is_throttle and closed:
            d.hold_until = max(d.hold_until, now + 1.0 / self._rate(d, p))
        if d.circuit == HALF_OPEN or (
            d.circuit == CLOSED and (d.health < p.circuit_floor or d.consecutive_failures >= p.circuit_failures)
        ):
            self._open(d, p, now)
            return OPEN
        return None

    # --- forgetting -----------------------------------------------------------

    def evict_idle(self, now: float | None = None, keep: Container[str] = ()) -> list[str]:
        """Forget the idle domains whose state need not outlive idleness; their names.

        Idle: not in *keep* (the caller's domains with requests pending or in
        flight) and nothing heard from it (an answer, a failure, first sight)
        for ``idle_ttl`` seconds. Never forgotten: a hold or an open or
        half-open circuit (until it ends), a give-up, an operator override, a
        Crawl-delay (robots.txt is read once per crawl). A forgotten domain
        that comes back starts fresh.
        """
        if self.idle_ttl <= 0:
            return []
        now = time.time() if now is None else now
        cutoff = now - self.idle_ttl
        gone = [
            name
            for name, d in self._domains.items()
            if max(d.born, d.answered_at, d.troubled_at) < cutoff
            and name not in keep
            and not self._outlives_idleness(name, d, now)
        ]
        for name in gone:
            del self._domains[name]
        if len(gone) > len(self._domains):  # a dict never shrinks by itself
            self._domains = dict(self._domains)
        self.evicted += len(gone)
        return gone

    def _outlives_idleness(self, name: str, d: _Domain, now: float) -> bool:
        return bool(
            d.circuit != CLOSED
            or d.hold_until > now
            or d.ctl_hold > now
            or d.ctl_down
            or d.ctl_rate > 0
            or d.ctl_concurrency > 0
            or d.crawl_delay > 0
            or name in self._given_up
        )

    def bytes_per_domain(self, sample: int = 50) -> float:
        """An estimate (``sys.getsizeof`` of a few records, their fields and dict entries) of the
        memory one known domain costs here; 0.0 with none known."""
        return _sampled_bytes(self._domains, sample)

    # --- persistence ----------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Every domain's state as JSON-safe data (for checkpoints)."""
        return {
            "version": SNAPSHOT_VERSION,
            "domains": {
                name: {field: getattr(d, field) for field in _Domain.__slots__} for name, d in self._domains.items()
            },
        }

    def restore(self, data: Any) -> None:
        """Replace the state with a :meth:`snapshot`; bad data raises ValueError naming the spot."""
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
        restored = {}
        for name, fields in domains.items():
            restored[name] = self._restore_domain(name, fields)
        self._domains = restored
        self.readiness_epoch += 1

    def _restore_domain(self, name: Any, fields: Any) -> _Domain:
        where = f"health snapshot: domain {name!r}"
        if not isinstance(name, str) or not isinstance(fields, dict):
            raise ValueError(f"{where}: expected a string domain mapped to a dict of fields")
        d = _Domain(self.policy(name), time.time())
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
        d.cooldown = max(0.0, float(d.cooldown))
        d.rate = min(max(float(d.rate), 0.0), _MAX_RATE)
        return d

    # --- internals ------------------------------------------------------------

    def _get(self, domain: str, now: float | None = None) -> tuple[_Domain, HealthPolicy]:
        """The domain's record brought up to *now*: recovery, cooldown, refilled tokens."""
        now = time.time() if now is None else now
        p = self.policy(domain)
        d = self._domains.get(domain)
        if d is None:
            d = self._domains[domain] = _Domain(p, now)
            return d, p
        elapsed = now - d.updated
        if elapsed > 0:
            # a hold or an opening starts at an update, so [updated, now] covers any part of it since
            blocked_end = max(d.hold_until, d.opened_at + d.cooldown if d.circuit == OPEN else 0.0)
            d.blocked_seconds += max(0.0, min(now, blocked_end) - d.updated)
            d.health = min(100.0, d.health + p.recovery_per_minute * elapsed / 60.0)
            d.tokens = min(float(self._burst(d, p)), d.tokens + elapsed * self._rate(d, p))
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

    @staticmethod
    def _ceiling(d: _Domain, p: HealthPolicy) -> float:
        """The opt-in ceilings: ``base_rate`` (scaled by health) and Crawl-delay."""
        ceiling = _MAX_RATE if p.base_rate is None else max(p.min_rate, p.base_rate * d.health / 100.0)
        if d.ctl_rate > 0:  # the operator's ceiling
            ceiling = min(ceiling, d.ctl_rate)
        return min(ceiling, 1.0 / d.crawl_delay) if d.crawl_delay > 0 else ceiling

    def _rate(self, d: _Domain, p: HealthPolicy) -> float:
        return min(max(d.rate, p.min_rate), self._ceiling(d, p))

    def _burst(self, d: _Domain, p: HealthPolicy) -> int:
        """Tokens the bucket holds: ``burst``, but no more than a quarter second's
        worth (a paused domain resumes at its pace, not with a burst), and one
        under a Crawl-delay."""
        if d.crawl_delay > 0:
            return 1
        return max(1, min(p.burst, int(self._rate(d, p) * _BURST_SECONDS)))

    def _concurrency(self, d: _Domain, p: HealthPolicy, slot_concurrency: int | None) -> int:
        if d.circuit != CLOSED:
            return 1
        cap = slot_concurrency if slot_concurrency is not None else self.default_concurrency
        if p.base_concurrency is not None:
            cap = min(cap, p.base_concurrency)
        if d.ctl_concurrency > 0:  # the operator's concurrency replaces the cap
            cap = int(d.ctl_concurrency)
        return max(1, round(cap * d.health / 100.0))

    def _increase(self, d: _Domain, p: HealthPolicy, now: float) -> None:
        """Slow start (by half per success) until the first congestion; after it, growth by
        half per second (its limit was a guess: what the first second delivered) until a
        second 429 measures the limit; then the cubic, whose plateau near the limit
        (``rate_probe`` small) keeps a hard limit's 429s to one per ten seconds or fewer.
        Latency, 503s and timeouts never start the plateau: they say the site struggled
        then, not where a limit is, so the pace probes back up at half per second."""
        since = max(0.0, now - max(d.last_decrease, min(d.hold_until, now)))  # (held time is no probing)
        if d.cuts == 0:
            doublings = min(max(0.0, now - d.born) / _SLOW_START_DOUBLING, 60.0)
            grown = min(d.rate * (1.0 + _SLOW_START_GAIN), p.initial_rate * 2.0**doublings)
        elif d.cuts == 1 and d.threshold is not None:
            grown = max(d.rate, d.threshold * p.rate_decrease * _PROBE_GROWTH ** min(since, _MAX_PROBE_SECONDS))
        else:
            flat_at = ((1.0 - p.rate_decrease) / p.rate_probe) ** (1.0 / 3.0)
            grown = max(d.rate, d.threshold * (1.0 + p.rate_probe * (since - flat_at) ** 3))
        d.rate = min(grown, self._ceiling(d, p), _MAX_RATE)

    def _decrease(self, d: _Domain, p: HealthPolicy, now: float, measured: bool = False) -> bool:
        """Cut the rate for a congestion event; False (nothing done) within one of the last.

        The limit learned is the rate the domain delivered lately (its 2xx
        over the last second or two), when that is lower than the rate: past
        a limit, only the answers say where it is. After the first cut that
        holds for a 429 (*measured*: "too many requests", so what got through
        is the limit), at no less than ``_CUT_FLOOR`` x the rate; other
        signals (503, timeouts, latency) say the site struggles, not how
        much it takes, and keep ``rate_decrease`` x the rate, so an outage's
        empty windows cannot ratchet the pace down.
        """
        if now - d.last_decrease < max(_MIN_DECREASE_GAP, d.latency or 0.0):
            return False
        before = self._rate(d, p)
        delivered = _delivered(d, now)
        if delivered > 0:
            floor = 0.0 if d.cuts == 0 else before * (_CUT_FLOOR if measured else p.rate_decrease)
            before = min(before, max(delivered, floor))
        d.cuts = min(d.cuts + 1, 2) if measured else max(d.cuts, 1)  # (see _increase)
        d.threshold = before
        d.rate = max(p.min_rate, before * p.rate_decrease)
        d.tokens = min(d.tokens, float(self._burst(d, p)))
        d.last_decrease = now
        return True

    @staticmethod
    def _observe_latency(d: _Domain, p: HealthPolicy, latency: float | None) -> bool:
        """Fold a sample into the EWMA; True when it says the domain is congested."""
        if latency is None or not math.isfinite(latency) or latency < 0:
            return False
        d.latency = latency if d.latency is None else d.latency + _LATENCY_ALPHA * (latency - d.latency)
        if d.best_latency is None or d.latency < d.best_latency:
            d.best_latency = d.latency
            return False
        d.best_latency += _BASELINE_DRIFT * (d.latency - d.best_latency)
        return d.latency > p.latency_factor * d.best_latency + _LATENCY_SLACK


def scrapy_limits(settings: Any) -> dict[str, Any]:
    """The registry's defaults from the project's Scrapy settings: the per-domain
    (or per-IP) concurrency, and the rate ``DOWNLOAD_DELAY`` allows."""
    per_ip = int(settings["CONCURRENT_REQUESTS_PER_IP"] or 0)  # ([]: getint warns that it is deprecated)
    delay = settings.getfloat("DOWNLOAD_DELAY")
    return {
        "default_concurrency": per_ip or settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN"),
        "reported_rate_cap": 1.0 / delay if delay > 0 else math.inf,
        "idle_ttl": read_setting(settings, "OPENCLAW_HEALTH_IDLE_TTL"),
    }


def _sampled_bytes(mapping: dict[str, Any], sample: int) -> float:
    """Mean ``sys.getsizeof`` of a few values (an object with ``__slots__`` and its field
    values, each object counted once) plus their key and dict slot."""
    if not mapping:
        return 0.0
    total, seen = 0, set()
    for n, (key, value) in enumerate(mapping.items()):
        if n >= sample:
            break
        total += sys.getsizeof(key) + sys.getsizeof(value) + _DICT_SLOT
        for field in getattr(type(value), "__slots__", ()):
            item = getattr(value, field, None)
            if id(item) not in seen:  # (shared values, None and small ints once)
                seen.add(id(item))
                total += sys.getsizeof(item)
    return total / min(sample, len(mapping))


_DICT_SLOT = 40  # bytes a dict spends per entry (hash, key, value pointers + index, at 2/3 load)


def _verdict(
    d: _Domain, c: Classification | None, retry_after: float | None, failed_before: float | None
) -> tuple[str | None, bool]:
    """(whose trouble the failure is, whether it counts in the domain's 5xx share)."""
    if not affects_health(c):
        return None, False
    assert c is not None
    if _asks_to_slow_down(c, retry_after):
        return DOMAIN, False  # the server itself asks us to slow down (a ban page: to stop)
    if failed_before is not None:  # a retry: whatever its domain went through since says it
        return (DOMAIN if d.troubled_at > failed_before else PAGE), False
    if c.status is None:
        return DOMAIN, False  # a connection failure or timeout
    fast = d.share_fast + _SHARE_FAST * (1.0 - d.share_fast)
    slow = d.share_slow + _SHARE_SLOW * (1.0 - d.share_slow)
    return (DOMAIN if _clustering(fast, slow) else PAGE), True


def _accounted(
    d: _Domain, c: Classification, retry_after: float | None, failed_before: float | None
) -> tuple[bool, bool]:
    """(whether the failure counts against the domain, whether it counts in the 5xx share).

    A retry judged the domain's only because its domain was in trouble since
    the URL last failed (see :func:`_verdict`) gets the domain's retry
    schedule, but it is no new evidence: counted, the retries of broken pages
    after one real domain signal would each renew the trouble and keep its
    circuit opening (a crawl whose last pending requests are broken pages
    stalled on doubling cool-downs).
    """
    verdict, in_share = _verdict(d, c, retry_after, failed_before)
    inferred = failed_before is not None and not _asks_to_slow_down(c, retry_after)
    return verdict == DOMAIN and not inferred, in_share


def _asks_to_slow_down(c: Classification, retry_after: float | None) -> bool:
    """A 429, a Retry-After or a ban page: the server's own word, whatever the URL's history."""
    return c.status == 429 or retry_after is not None or c.error_class == ErrorClass.BLOCKED


def _clustering(fast: float, slow: float) -> bool:
    """Whether 5xx answers cluster: their recent share is high and clearly above the baseline."""
    return fast >= _SHARE_TRIGGER and fast - slow >= _SHARE_MARGIN


def _give_up_limit(d: _Domain, p: HealthPolicy) -> float | None:
    if not d.answered_at and p.unreachable_give_up is not None:
        return p.unreachable_give_up
    return p.give_up_after


def _count_delivered(d: _Domain, now: float) -> None:
    """Count a success in the delivered-rate window; close the window once it is long enough.

    Holds stay in the windows: what a site delivers over time, its pauses
    included, is what its limit allows (measured right after a pause, the
    server's refilled burst would make it look larger).
    """
    d.win_ok += 1
    span = now - d.win_start
    if span < _WINDOW:
        return
    if span <= _STALE_WINDOW:
        d.delivered = d.win_ok / span
    d.win_start, d.win_ok = now, 0


def _delivered(d: _Domain, now: float) -> float:
    """Successes per second the domain delivered lately: the last closed window
    (about ``_WINDOW`` long) and the open one (0.0: nothing to go by)."""
    span = now - d.win_start
    if span < 0:
        return 0.0
    if d.delivered is None:
        return d.win_ok / max(span, _WINDOW)
    return (d.delivered * _WINDOW + d.win_ok) / (_WINDOW + span)


def _penalty(c: Classification, p: HealthPolicy) -> tuple[float, bool]:
    """(health penalty, whether it is a congestion signal) for a domain failure."""
    if c.error_class == ErrorClass.BLOCKED:
        return p.blocked_penalty, True
    if c.is_throttle:
        return p.throttle_penalty, True
    if c.is_timeout:
        return p.timeout_penalty, True
    if c.error_class == ErrorClass.NETWORK:
        return p.connection_penalty, False
    return p.server_error_penalty, False
