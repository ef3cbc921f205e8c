"""The HealthRegistry: the one owner of per-domain state.

Each domain (a Scrapy download-slot key, normally the hostname) has a health
score, an AIMD-controlled request rate with a token bucket, a circuit breaker,
a latency average and a Retry-After hold. The DomainHealthMiddleware writes it
(``record_success`` / ``record_failure``), the queue asks it whether a domain
may send (``ready_at`` / ``try_acquire``), metrics read ``state()`` and the
checkpoint saves ``snapshot()``. Nobody else keeps a copy of domain state.

How the numbers move (knobs in :class:`scrapy_openclaw.policy.HealthPolicy`):

- **Health** (0..100, starts at 100) rises by ``success_reward`` per success,
  falls by a penalty per failure (throttle, timeout, connection, server
  error) and recovers by ``recovery_per_minute`` as time passes. Congestion
  failures (429/503, timeouts) cost their penalty once per congestion
  event, like the rate cut below: when a 503 window begins, the eight
  requests in flight all fail within a round trip, and that is one signal,
  not eight (counted eight times it would leave a flapping site at zero
  health, crawled at the floor rate, after every window).
- **Rate** (AIMD, as TCP does it): on congestion (429/503, a timeout,
  latency above ``latency_factor`` x the best latency seen) it is
  multiplied by ``rate_decrease``, at most once per second (or per round
  trip), so one burst of 429s counts once. On success it grows by
  ``rate_increase`` req/s per second elapsed; below the slow-start
  threshold it doubles per second instead. The threshold is unset until the
  first congestion (so a crawl finds its pace quickly), then sits halfway
  between the rate before and after the last decrease: half of a cut is
  regained at once, the rest is probed for additively. The rate always
  stays within ``[min_rate, max(min_rate, base_rate x health/100)]``.
- **Circuit** (outlier ejection, as Envoy does it): opens below
  ``circuit_floor`` health or after ``circuit_failures`` failures in a row;
  after a cool-down, half-open lets a single probe through, whose outcome
  closes it or opens it again. The cool-down starts short
  (``circuit_cooldown``), doubles with every opening that follows another
  one without a healthy spell in between (a failed probe, or a relapse right
  after closing), up to ``circuit_cooldown_max``, with ``circuit_jitter``
  (+-) so probes of many domains do not line up. Each ``circuit_cooldown``
  spent closed forgives one doubling. So a site that flaps for a few seconds
  (a 503 window is not a ban) is probed again within seconds and found as
  soon as it is back, while one that stays down is probed ever more rarely,
  never less than once per ``circuit_cooldown_max``. Requests meanwhile wait
  in the scheduler; they are not sent, so they spend no retry attempts.
- **Hold**: ``Retry-After`` (capped at ``retry_after_cap``) holds the whole
  domain; a 429/503 without one holds it for one request interval.
- **Give up**: a domain whose circuit has not closed for ``give_up_after``
  seconds (counted from the opening that began the outage) is given up for
  the rest of the crawl (:meth:`HealthRegistry.given_up`): its requests are
  turned into dead letters instead of waiting for probes once a minute,
  which could keep a crawl open for days.

All times are UNIX seconds (``time.time()``), so a snapshot stays meaningful
when a crawl resumes in another process.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from scrapy.utils.misc import build_from_crawler, load_object

from scrapy_openclaw.errors import ErrorClass
from scrapy_openclaw.policy import HealthPolicy, PolicySet
from scrapy_openclaw.runtime import shared
from scrapy_openclaw.settings import DEFAULTS

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from scrapy_openclaw.errors import Classification

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"

SNAPSHOT_VERSION = 1
_LATENCY_ALPHA = 0.2  # weight of a new sample in the latency EWMA
_BASELINE_DRIFT = 0.01  # how fast the best-latency baseline follows a lasting change
_LATENCY_SLACK = 0.05  # seconds; latency noise below this is never congestion
_MIN_DECREASE_GAP = 1.0  # seconds between two multiplicative decreases (or one RTT if longer)
_MAX_INCREASE_STEP = 1.0  # seconds of success credited to one additive increase at most
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
    rate: float  # req/s allowed now
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


class _Domain:
    """Mutable per-domain record; only the registry touches it."""

    __slots__ = (
        "health", "rate", "tokens", "threshold", "updated", "last_increase", "last_decrease",
        "circuit", "opened_at", "probe_at", "latency", "best_latency", "hold_until",
        "consecutive_failures", "requests", "successes", "failures", "cooldown", "opens",
        "down_since",
    )

    def __init__(self, policy: HealthPolicy, now: float):
        self.health = 100.0
        self.rate = min(policy.initial_rate, policy.base_rate)
        self.tokens = float(policy.burst)
        self.threshold: float | None = None  # slow-start threshold, req/s; None: no congestion yet
        self.updated = now
        self.last_increase = now
        self.last_decrease = 0.0
        self.circuit = CLOSED
        self.opened_at = 0.0
        self.probe_at = 0.0  # when the half-open probe was handed out; 0: none out
        self.latency: float | None = None
        self.best_latency: float | None = None
        self.hold_until = 0.0
        self.consecutive_failures = 0
        self.requests = 0
        self.successes = 0
        self.failures = 0
        self.cooldown = policy.circuit_cooldown  # of the current (or last) opening, jitter included
        self.opens = 0  # openings in a row not yet forgiven: the cool-down is doubled this often
        self.down_since = 0.0  # when the opening that began the current outage happened; 0: closed


# Field types in a snapshot: how restore() validates what it reads.
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    name: (int, float) for name in _Domain.__slots__ if name != "circuit"
}
_OPTIONAL = (int, float, type(None))
_FIELD_TYPES.update(circuit=(str,), threshold=_OPTIONAL, latency=_OPTIONAL, best_latency=_OPTIONAL)
_COUNTERS = ("consecutive_failures", "requests", "successes", "failures", "opens")


def affects_health(classification: Classification | None) -> bool:
    """Whether an outcome says something about the domain's health.

    A 404 or 403 is the server answering normally about one page; only
    network failures, retryable statuses and 5xx count against a domain.
    """
    if classification is None:
        return False
    if classification.error_class in (ErrorClass.NETWORK, ErrorClass.PROTOCOL_RETRYABLE):
        return True
    return (classification.status or 0) >= 500


class HealthRegistry:
    """Per-domain health, rate, circuit and holds for one crawl (see the module doc)."""

    def __init__(self, policies: PolicySet | None = None, *, uniform: Callable[[float, float], float] | None = None):
        self._policies = policies or PolicySet({}, [])
        self._domains: dict[str, _Domain] = {}
        self._uniform = uniform or random.uniform  # the cool-down jitter's random source (tests pin it)
        self._given_up: set[str] = set()  # domains past give_up_after: given up for good

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> HealthRegistry:
        return cls(PolicySet.for_crawler(crawler))

    @classmethod
    def for_crawler(cls, crawler: Crawler) -> HealthRegistry:
        """The registry of this crawl, of the class ``OPENCLAW_HEALTH_REGISTRY_CLASS`` names."""

        def build() -> HealthRegistry:
            path = crawler.settings.get(
                "OPENCLAW_HEALTH_REGISTRY_CLASS", DEFAULTS["OPENCLAW_HEALTH_REGISTRY_CLASS"]
            )
            return build_from_crawler(load_object(path), crawler)

        return shared(crawler, "health", build)

    def policy(self, domain: str) -> HealthPolicy:
        return self._policies.for_domain(domain).health

    # --- reading --------------------------------------------------------------

    def domains(self) -> list[str]:
        return list(self._domains)

    def state(self, domain: str, now: float | None = None) -> DomainState:
        d, p = self._get(domain, now)
        return DomainState(
            domain=domain,
            health=d.health,
            rate=self._rate(d, p),
            tokens=d.tokens,
            burst=p.burst,
            concurrency=self._concurrency(d, p),
            circuit=d.circuit,
            latency=d.latency,
            hold_until=d.hold_until,
            consecutive_failures=d.consecutive_failures,
            requests=d.requests,
            successes=d.successes,
            failures=d.failures,
        )

    def concurrency(self, domain: str) -> int:
        d, p = self._get(domain)
        return self._concurrency(d, p)

    def blocked_until(self, domain: str, now: float | None = None) -> float:
        """When the domain's hold or open circuit ends (``<= now``: not blocked).

        Unlike :meth:`ready_at` this ignores tokens and the half-open probe:
        it is the time before which *nothing* may reach the domain.
        """
        d, _ = self._get(domain, now)
        return max(d.hold_until, d.opened_at + d.cooldown if d.circuit == OPEN else 0.0)

    def down_for(self, domain: str, now: float | None = None) -> float:
        """Seconds since the circuit opened without closing since (0.0 while it is closed)."""
        now = time.time() if now is None else now
        d, _ = self._get(domain, now)
        if d.circuit == CLOSED or not d.down_since:
            return 0.0
        return max(0.0, now - d.down_since)

    def given_up(self, domain: str, now: float | None = None) -> bool:
        """Whether *domain* has been down for ``give_up_after`` seconds (then for good)."""
        if domain in self._given_up:
            return True
        d = self._domains.get(domain)
        if d is None or d.circuit == CLOSED:
            return False  # the common case, without bringing the record up to date
        limit = self.policy(domain).give_up_after
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
        d.health = min(100.0, d.health + p.success_reward)
        congested = self._observe_latency(d, p, latency)
        closed = d.circuit == HALF_OPEN
        if closed:
            d.circuit, d.probe_at, d.threshold, d.down_since = CLOSED, 0.0, None, 0.0  # find the pace again
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
    ) -> str | None:
        """Count a failed request; *retry_after* is the server's wait in seconds, if it sent one.

        Returns ``"open"`` if this failure opened the circuit (or reopened it after a failed probe).
        """
        now = time.time() if now is None else now
        d, p = self._get(domain, now)
        d.requests += 1
        d.failures += 1
        if not affects_health(classification):
            return None
        d.consecutive_failures += 1
        penalty, congestion = _penalty(classification, p)
        # A congestion signal costs its penalty once per event (when it also cuts
        # the rate). While the circuit is open or half-open the domain is known
        # to be down: a failed probe or a late answer costs no health and no hold
        # of its own; the growing cool-down is the penalty.
        fresh = congestion and self._decrease(d, p, now)
        closed = d.circuit == CLOSED
        if closed and (fresh or not congestion):
            d.health = max(0.0, d.health - penalty)
        d.rate = min(d.rate, self._ceiling(d, p))
        if retry_after is not None:
            d.hold_until = max(d.hold_until, now + min(max(retry_after, 0.0), p.retry_after_cap))
        elif classification.is_throttle and closed:
            d.hold_until = max(d.hold_until, now + 1.0 / self._rate(d, p))
        if d.circuit == HALF_OPEN or (
            d.circuit == CLOSED
            and (d.health < p.circuit_floor or d.consecutive_failures >= p.circuit_failures)
        ):
            self._open(d, p, now)
            return OPEN
        return None

    # --- persistence ----------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Every domain's state as JSON-safe data (for checkpoints)."""
        return {
            "version": SNAPSHOT_VERSION,
            "domains": {
                name: {field: getattr(d, field) for field in _Domain.__slots__}
                for name, d in self._domains.items()
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

    def _restore_domain(self, name: Any, fields: Any) -> _Domain:
        where = f"health snapshot: domain {name!r}"
        if not isinstance(name, str) or not isinstance(fields, dict):
            raise ValueError(f"{where}: expected a string domain mapped to a dict of fields")
        d = _Domain(self.policy(name), time.time())
        for field, value in fields.items():
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
            d.health = min(100.0, d.health + p.recovery_per_minute * elapsed / 60.0)
            d.tokens = min(float(p.burst), d.tokens + elapsed * self._rate(d, p))
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
        return max(p.min_rate, p.base_rate * d.health / 100.0)

    def _rate(self, d: _Domain, p: HealthPolicy) -> float:
        return min(max(d.rate, p.min_rate), self._ceiling(d, p))

    @staticmethod
    def _concurrency(d: _Domain, p: HealthPolicy) -> int:
        if d.circuit != CLOSED:
            return 1
        return max(1, round(p.base_concurrency * d.health / 100.0))

    def _increase(self, d: _Domain, p: HealthPolicy, now: float) -> None:
        step = min(max(now - d.last_increase, 0.0), _MAX_INCREASE_STEP)
        d.last_increase = now
        if d.threshold is None:
            grown = d.rate * (1.0 + step)
        elif d.rate < d.threshold:
            grown = min(d.rate * (1.0 + step), d.threshold)
        else:
            grown = d.rate + p.rate_increase * step
        d.rate = min(grown, self._ceiling(d, p))

    def _decrease(self, d: _Domain, p: HealthPolicy, now: float) -> bool:
        """Cut the rate for a congestion event; False (nothing done) within one of the last."""
        if now - d.last_decrease < max(_MIN_DECREASE_GAP, d.latency or 0.0):
            return False
        before = min(d.rate, self._ceiling(d, p))
        d.rate = max(p.min_rate, before * p.rate_decrease)
        d.threshold = (before + d.rate) / 2.0
        d.last_decrease = d.last_increase = now
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


def _penalty(c: Classification, p: HealthPolicy) -> tuple[float, bool]:
    """(health penalty, whether it is a congestion signal) for a harmful outcome."""
    if c.is_throttle:
        return p.throttle_penalty, True
    if c.is_timeout:
        return p.timeout_penalty, True
    if c.error_class == ErrorClass.NETWORK:
        return p.connection_penalty, False
    return p.server_error_penalty, False
