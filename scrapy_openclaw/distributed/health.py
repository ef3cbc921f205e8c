"""The HealthRegistry in Redis: one token bucket and health score per domain for all workers.

With a per-process registry, N workers send N times a domain's rate and a 429
seen by one worker slows only that worker. Here each domain's state is one
Redis hash, updated by Lua scripts (atomic, one round trip each), so the
*combined* send rate stays within the domain's current limit and every
penalty, Retry-After hold or open circuit applies to all workers at once.

The leased queue's pop script takes the token in the same round trip as the
pop (``redis_prefix`` tells it where the buckets are), so a request costs one
round trip to be handed out and one to record its outcome.

The policy math (AIMD on the rate, score penalties and recovery, circuit) is
the :class:`~scrapy_openclaw.policy.HealthPolicy`'s knobs applied in Lua.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from scrapy_openclaw import signals as openclaw_signals
from scrapy_openclaw.distributed import lua
from scrapy_openclaw.runtime import shared

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from scrapy_openclaw.errors import Classification

logger = logging.getLogger(__name__)

_RUNTIME_KEY = "health"  # the same slot HealthRegistry.for_crawler uses

_INIT = r"""
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'rate', ARGV[1], 'burst', ARGV[2], 'tokens', ARGV[2], 'ts', ARGV[3],
    'health', 100, 'hts', ARGV[3], 'circuit', 'closed', 'hold', 0, 'requests', 0, 'successes', 0,
    'failures', 0, 'cf', 0, 'last_inc', ARGV[3], 'last_dec', 0)
end
redis.call('SADD', KEYS[2], ARGV[4])
return 1
"""

# KEYS: domain hash. ARGV: now, success(1/0), latency(-1 none), penalty, congestion(1/0),
# hold_until, base_rate, min_rate, rate_increase, rate_decrease, reward, recovery_per_minute,
# circuit_floor, circuit_failures, circuit_cooldown. Returns the circuit event ('' none).
_RECORD = r"""
local k = KEYS[1]
local now, ok = tonumber(ARGV[1]), ARGV[2] == '1'
local h = redis.call('HMGET', k, 'rate', 'health', 'hts', 'circuit', 'cf', 'latency', 'last_inc', 'last_dec', 'hold')
local rate, health = tonumber(h[1]) or tonumber(ARGV[7]), tonumber(h[2]) or 100
local hts, circuit, cf = tonumber(h[3]) or now, h[4] or 'closed', tonumber(h[5]) or 0
local lat, last_inc, last_dec, hold = tonumber(h[6]), tonumber(h[7]) or now, tonumber(h[8]) or 0, tonumber(h[9]) or 0
health = math.min(100, health + tonumber(ARGV[12]) * math.max(0, now - hts) / 60)
local event = ''
redis.call('HINCRBY', k, 'requests', 1)
if ok then
  redis.call('HINCRBY', k, 'successes', 1)
  health = math.min(100, health + tonumber(ARGV[11]))
  cf = 0
  local l = tonumber(ARGV[3])
  if l >= 0 then
    if lat then lat = 0.8 * lat + 0.2 * l else lat = l end
    redis.call('HSET', k, 'latency', tostring(lat))
  end
  rate = math.min(tonumber(ARGV[7]), rate + tonumber(ARGV[9]) * math.min(1, math.max(0, now - last_inc)))
  last_inc = now
  if circuit == 'half_open' then circuit = 'closed'; event = 'closed' end
else
  redis.call('HINCRBY', k, 'failures', 1)
  cf = cf + 1
  health = math.max(0, health - tonumber(ARGV[4]))
  if ARGV[5] == '1' and now - last_dec >= 1 and tonumber(ARGV[4]) > 0 then
    rate = math.max(tonumber(ARGV[8]), rate * tonumber(ARGV[10]))
    last_dec = now
    redis.call('HSET', k, 'tokens', 0, 'ts', now)
  end
  last_inc = now
  local until_ = tonumber(ARGV[6])
  if until_ > hold then hold = until_ end
  if circuit == 'half_open' or (circuit == 'closed' and tonumber(ARGV[4]) > 0 and
      (health < tonumber(ARGV[13]) or cf >= tonumber(ARGV[14]))) then
    circuit = 'open'; event = 'opened'
    redis.call('HSET', k, 'open_until', tostring(now + tonumber(ARGV[15])), 'probe', 0)
  end
end
rate = math.min(rate, math.max(tonumber(ARGV[8]), tonumber(ARGV[7]) * health / 100))
redis.call('HSET', k, 'rate', tostring(rate), 'health', tostring(health), 'hts', tostring(now),
  'circuit', circuit, 'cf', cf, 'last_inc', tostring(last_inc), 'last_dec', tostring(last_dec),
  'hold', tostring(hold))
if circuit == 'closed' then redis.call('HSET', k, 'probe', 0) end
local out = redis.call('HGETALL', k)
table.insert(out, 1, event)
return out
"""

_TRY_ACQUIRE = lua.TAKE_TOKEN + r"""
local ok, at = take_token(KEYS[1], tonumber(ARGV[1]))
return {ok, tostring(at)}
"""

_HOLD = r"""
local cur = tonumber(redis.call('HGET', KEYS[1], 'hold')) or 0
if tonumber(ARGV[1]) > cur then redis.call('HSET', KEYS[1], 'hold', ARGV[1]) end
return 1
"""


@dataclass(frozen=True)
class _DomainState:
    """Fallback for scrapy_openclaw.health.DomainState (same fields)."""

    domain: str
    health: float
    rate: float
    tokens: float
    burst: int
    concurrency: int
    circuit: str
    latency: float | None
    hold_until: float
    consecutive_failures: int
    requests: int
    successes: int
    failures: int


def _state_class() -> Any:
    try:
        from scrapy_openclaw.health import DomainState
    except ImportError:
        return _DomainState
    return DomainState


def _num(fields: dict[str, str], name: str, default: float = 0.0) -> float:
    try:
        return float(fields.get(name, default))
    except (TypeError, ValueError):
        return default


class RedisHealthRegistry:
    """``OPENCLAW_HEALTH_REGISTRY_CLASS`` for distributed mode (HealthRegistry contract)."""

    def __init__(self, crawler: Crawler, server: Any = None):
        from scrapy_redis.connection import get_redis_from_settings

        from scrapy_openclaw.policy import PolicySet

        self.crawler = crawler
        self.server = server if server is not None else get_redis_from_settings(crawler.settings)
        self.policies = PolicySet.for_crawler(crawler)
        name = crawler.spidercls.name if crawler.spidercls else "openclaw"
        #: prefix of the per-domain hashes, read by the queue's pop script.
        self.redis_prefix = f"{name}:health:d:"
        self.domains_key = f"{name}:health:domains"
        self._known: set[str] = set()
        self._conc: dict[str, tuple[float, int]] = {}
        self._cache: dict[str, tuple[float, dict[str, str]]] = {}
        self._init = self.server.register_script(_INIT)
        self._record = self.server.register_script(_RECORD)
        self._acquire = self.server.register_script(_TRY_ACQUIRE)
        self._hold = self.server.register_script(_HOLD)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> RedisHealthRegistry:
        return cls(crawler)

    @classmethod
    def for_crawler(cls, crawler: Crawler) -> RedisHealthRegistry:
        return shared(crawler, _RUNTIME_KEY, lambda: cls(crawler))

    def _key(self, domain: str) -> str:
        return self.redis_prefix + domain

    def _health_policy(self, domain: str) -> Any:
        return self.policies.for_domain(domain).health

    def ensure(self, domain: str) -> None:
        """Create the domain's shared state once (first worker wins)."""
        if domain in self._known:
            return
        p = self._health_policy(domain)
        try:
            self._init(keys=[self._key(domain), self.domains_key],
                       args=[p.initial_rate, p.burst, time.time(), domain])
        except RedisError:
            return  # Redis is down: tried again next time
        self._known.add(domain)

    # --- the contract -----------------------------------------------------------

    def domains(self) -> list[str]:
        return sorted(m.decode() if isinstance(m, bytes) else m for m in self.server.smembers(self.domains_key))

    def _fields(self, domain: str) -> dict[str, str]:
        try:
            raw = self.server.hgetall(self._key(domain))
        except RedisError:  # Redis is down: the last known state, never an error on the request path
            cached = self._cache.get(domain)
            return dict(cached[1]) if cached else {}
        return {
            (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
            for k, v in raw.items()
        }

    def state(self, domain: str, now: float | None = None) -> Any:
        cached = self._cache.get(domain)
        if cached is not None and time.time() - cached[0] < 0.25:
            f = cached[1]  # fresh from this worker's last update: no extra round trip
        else:
            f = self._fields(domain)
        p = self._health_policy(domain)
        health = _num(f, "health", 100.0)
        latency = f.get("latency")
        return _state_class()(
            domain=domain,
            health=health,
            rate=_num(f, "rate", p.initial_rate),
            tokens=_num(f, "tokens", p.burst),
            burst=int(_num(f, "burst", p.burst)),
            concurrency=self._concurrency_for(p, health, f.get("circuit", "closed")),
            circuit=f.get("circuit", "closed"),
            latency=float(latency) if latency is not None else None,
            hold_until=_num(f, "hold"),
            consecutive_failures=int(_num(f, "cf")),
            requests=int(_num(f, "requests")),
            successes=int(_num(f, "successes")),
            failures=int(_num(f, "failures")),
        )

    @staticmethod
    def _concurrency_for(policy: Any, health: float, circuit: str = "closed") -> int:
        if circuit != "closed":
            return 1
        return max(1, round(policy.base_concurrency * health / 100))

    def concurrency(self, domain: str) -> int:
        """Cached for half a second: the middleware may ask on every request."""
        now = time.time()
        cached = self._conc.get(domain)
        if cached is not None and now - cached[0] < 0.5:
            return cached[1]
        value = self.state(domain).concurrency
        self._conc[domain] = (now, value)
        return value

    def policy(self, domain: str) -> Any:
        return self._health_policy(domain)

    def blocked_until(self, domain: str, now: float | None = None) -> float:
        """When the domain's hold or open circuit ends (ignores tokens)."""
        f = self._fields(domain)
        until = _num(f, "hold")
        if f.get("circuit") == "open":
            until = max(until, _num(f, "open_until"))
        return until

    def ready_at(self, domain: str, now: float | None = None) -> float:
        now = time.time() if now is None else now
        f = self._fields(domain)
        if not f:
            return now
        at = max(now, _num(f, "hold"))
        if f.get("circuit") == "open":
            at = max(at, _num(f, "open_until"))
        rate = _num(f, "rate", 1.0) or 1.0
        tokens = min(_num(f, "burst", 1.0), _num(f, "tokens") + max(0.0, now - _num(f, "ts", now)) * rate)
        if tokens < 1:
            at = max(at, now + (1 - tokens) / rate)
        return at

    def try_acquire(self, domain: str, now: float | None = None, *, token: bool = True) -> bool:
        """Take a token in Redis; ``token=False`` only checks the hold and the circuit."""
        self.ensure(domain)
        now = time.time() if now is None else now
        if not token:
            f = self._fields(domain)
            return _num(f, "hold") <= now and not (
                f.get("circuit") == "open" and _num(f, "open_until") > now
            )
        try:
            ok, _ = self._acquire(keys=[self._key(domain)], args=[now])
        except RedisError:
            return True
        return int(ok) == 1

    def record_success(self, domain: str, latency: float | None, now: float | None = None) -> None:
        self._update(domain, now, success=True, latency=latency)

    def record_failure(
        self, domain: str, classification: Classification, now: float | None = None,
        retry_after: float | None = None,
    ) -> None:
        # the local registry's policy: what counts against a domain, and how much
        from scrapy_openclaw.health.registry import _penalty, affects_health

        p = self._health_policy(domain)
        penalty, congestion = _penalty(classification, p) if affects_health(classification) else (0.0, False)
        now = time.time() if now is None else now
        hold = now + min(max(retry_after, 0.0), p.retry_after_cap) if retry_after is not None else 0.0
        self._update(domain, now, success=False, penalty=penalty, congestion=congestion, hold=hold)

    def hold(self, domain: str, until: float) -> None:
        self.ensure(domain)
        try:
            self._hold(keys=[self._key(domain)], args=[until])
        except RedisError as exc:
            logger.warning("Could not store the hold for %(domain)s in Redis: %(error)s",
                           {"domain": domain, "error": exc})

    def _update(self, domain: str, now: float | None, *, success: bool, latency: float | None = None,
                penalty: float = 0.0, congestion: bool = False, hold: float = 0.0) -> None:
        self.ensure(domain)
        p = self._health_policy(domain)
        now = time.time() if now is None else now
        try:
            result = self._record(keys=[self._key(domain)], args=[
                now, 1 if success else 0, -1 if latency is None else latency, penalty,
                1 if congestion else 0, hold, p.base_rate, p.min_rate, p.rate_increase,
                p.rate_decrease, p.success_reward, p.recovery_per_minute, p.circuit_floor,
                p.circuit_failures, p.circuit_cooldown,
            ])
        except RedisError as exc:  # an outcome not recorded costs pacing accuracy, not data
            logger.warning("Could not record the outcome for %(domain)s in Redis: %(error)s",
                           {"domain": domain, "error": exc})
            return
        items = [x.decode() if isinstance(x, bytes) else x for x in result]
        event = items[0]
        self._cache[domain] = (time.time(), dict(zip(items[1::2], items[2::2])))
        if event:
            signal = openclaw_signals.circuit_opened if event == "opened" else openclaw_signals.circuit_closed
            self.crawler.signals.send_catch_log(
                signal=signal, domain=domain, state=self.state(domain), spider=self.crawler.spider
            )

    def snapshot(self) -> dict[str, Any]:
        return {"version": 1, "domains": {d: self._fields(d) for d in self.domains()}}

    def restore(self, data: dict[str, Any]) -> None:
        """Load a snapshot into Redis for domains that have no shared state yet."""
        for domain, fields in (data.get("domains") or {}).items():
            if fields and not self.server.exists(self._key(domain)):
                self.server.hset(self._key(domain), mapping={k: str(v) for k, v in fields.items()})
                self.server.sadd(self.domains_key, domain)
