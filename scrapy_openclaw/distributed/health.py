"""The HealthRegistry in Redis: one token bucket and health score per domain for all workers.

With a registry per process, N workers send N times a domain's rate and a 429
slows only the worker that saw it. Here each domain's state is one Redis hash
changed only by Lua scripts, so the combined rate stays within the domain's
limit and every penalty, hold or open circuit applies to all workers at once.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import math
import time
from collections.abc import Callable, Container
from typing import TYPE_CHECKING, Any, TypeVar, cast

import msgpack
from redis.exceptions import RedisError
from scrapy.utils.misc import build_from_crawler

from scrapy_openclaw._condensed import CondensedWarnings
from scrapy_openclaw.distributed import lua
from scrapy_openclaw.distributed import shards as sharding
from scrapy_openclaw.distributed.connection import reply_text
from scrapy_openclaw.distributed.fields import read_state, shown, typed_fields, unpack_state
from scrapy_openclaw.distributed.link import RedisLink
from scrapy_openclaw.health.registry import HealthRegistry, scrapy_limits, tuning
from scrapy_openclaw.health.registry.limitfit import NOTE_ANSWER, NoHistories, measures_limit, note_kind, sent_at
from scrapy_openclaw.health.registry.snapshots import domain_from
from scrapy_openclaw.health.registry.verdicts import _accounted, _penalty, _rate_signal
from scrapy_openclaw.policy import PolicySet
from scrapy_openclaw.runtime import shared

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from scrapy_openclaw.errors import Classification
    from scrapy_openclaw.policy import HealthPolicy

logger = logging.getLogger(__name__)
_T = TypeVar("_T")
#: woken domains kept for the queue at most (more are still woken locally, and served at the
#: time their shard's index says)
_MAX_WOKEN = 10_000


def _typed(fields: dict[str, Any]) -> dict[str, Any]:
    """A record's entries -> the field types of a local registry snapshot (bad fields left out)."""
    return typed_fields(fields, lambda name, value: None)


def policy_id(policy_json: str) -> str:
    """The ``"_id"`` :meth:`RedisHealthRegistry.policy_json` begins with (``health.lua``'s ``pid``)."""
    return policy_json[len('{"_id":"') :].split('"', 1)[0]


class RedisHealthRegistry(HealthRegistry):
    """``OPENCLAW_HEALTH_REGISTRY_CLASS`` for distributed mode (the HealthRegistry contract).

    The inherited in-process state is a cache of the Redis hashes; the methods
    that change state run in Redis. *clock* (seconds, default ``time.time``)
    is the "now" handed to the scripts when a caller gives none; the inherited
    cache methods without a ``now`` argument still read the wall clock.

    The rules are the local registry's, rule for rule, ported to Lua in
    :data:`scrapy_openclaw.distributed.lua.HEALTH` (which names, for each rule, the Python
    method it mirrors); the module constants and the domain's ``HealthPolicy`` are handed
    to it as data, and ``tests/test_distributed_parity.py`` runs both on the same events.
    The queue's pop takes the token in its own round trip; recording an outcome is one
    more. During a crawl every change is applied to the cache at once and sent in the
    background, and the reply refreshes the cache, so readers (``state``, ``ready_at``,
    the metrics, the log table) see this worker's latest view, at most one pop or response
    old. While Redis is unreachable the cache takes the writes too, and the worker keeps
    pacing on its own. Each domain's hash lives in the domain's queue shard.
    """

    def __init__(
        self,
        crawler: Crawler,
        server: Any = None,
        *,
        uniform: Callable[[float, float], float] | None = None,
        clock: Callable[[], float] = time.time,
    ):
        from scrapy_openclaw.distributed.connection import client_for_crawler
        from scrapy_openclaw.settings import OpenClawSettings

        super().__init__(PolicySet.for_crawler(crawler), uniform=uniform, **scrapy_limits(crawler))
        self.crawler = crawler
        self.clock = clock
        self.server = server if server is not None else client_for_crawler(crawler)
        self.link = RedisLink.for_crawler(crawler, clock=clock)
        name = crawler.spidercls.name if crawler.spidercls else "openclaw"
        self.spider_name = name
        self.shards = OpenClawSettings.for_crawler(crawler).distributed_shards
        #: marks a registry living in Redis (the queue's pop script gates on it); keys: :meth:`health_key`.
        self.redis_prefix = f"{name}:health:"
        self._ensuring: set[str] = set()
        self._known: set[str] = set()
        # The limit fit's history lives in Redis (``h_note``, beside the hash): this worker's cache
        # keeps none, so a 429's fit runs once, in the script (while Redis is away the local
        # pacing cuts by the 2xx window alone).
        self.histories = NoHistories()
        self._invalid = CondensedWarnings(logger, every=0)  # one warning per domain and field, for the crawl
        self._woken: set[str] = set()  # (see _wake; bounded: a queue that never takes them)
        # By policy, not by domain: every domain without a policy rule shares one entry
        # (a domain's JSON is ~1 KB, and a broad crawl meets millions of domains).
        self._policy_json: dict[HealthPolicy, str] = {}
        self._ensure = self.server.register_script(lua.H_ENSURE)
        self._acquire = self.server.register_script(lua.H_ACQUIRE)
        self._record = self.server.register_script(lua.H_RECORD)
        self._record.openclaw_merges = True  # (a round's records of one domain: one call, see link.merged)
        self._hold = self.server.register_script(lua.H_HOLD)
        self._crawl_delay = self.server.register_script(lua.H_CRAWL_DELAY)
        self._declare = self.server.register_script(lua.H_DECLARE)
        self._control = self.server.register_script(lua.H_CONTROL)

    def _wake(self, domain: str | None) -> None:
        """Also name *domain* for the leased queue, which parks domains in Redis (its shard's
        domain index, until the time the last pop found): its next pop moves it forward."""
        super()._wake(domain)
        if domain is not None and len(self._woken) < _MAX_WOKEN:
            self._woken.add(domain)

    def take_woken(self) -> set[str]:
        """The domains woken since the last call (see :meth:`_wake`)."""
        woken, self._woken = self._woken, set()
        return woken

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> RedisHealthRegistry:
        return cls(crawler)

    @classmethod
    def for_crawler(cls, crawler: Crawler) -> RedisHealthRegistry:
        return shared(crawler, "health", lambda: build_from_crawler(cls, crawler))

    def _key(self, domain: str) -> str:
        return sharding.health_key(self.spider_name, domain, self.shards)

    def health_key(self, domain: str) -> str:
        """The domain's hash, in the domain's queue shard (same hash tag)."""
        return self._key(domain)

    def _keys(self, domain: str) -> list[str]:
        """A health script's KEYS: the domain's hash, its shard's domain index, and its history
        for the limit fit (a list; only recording touches it)."""
        key = self._key(domain)
        return [key, self._domains_key(domain), key + ":fit"]

    def _domains_key(self, domain: str) -> str:
        return sharding.health_domains_key(self.spider_name, sharding.shard_of(domain, self.shards))

    def policy_json(self, domain: str) -> str:
        """The domain's HealthPolicy plus this crawl's two constants, as the Lua side reads them."""
        policy = self.policy(domain)
        cached = self._policy_json.get(policy)
        if cached is None:
            data = dataclasses.asdict(policy)
            data.update(  # (the module constants are in the scripts themselves: lua.HEALTH's K)
                k_retry_poll=_retry_poll(),
                k_key_ttl=self.idle_ttl,  # the record's TTL, refreshed by the scripts that save it
            )
            body = json.dumps(data, sort_keys=True, separators=(",", ":"))
            # Its id first: a script handed the policy its record holds does not decode it again
            digest = hashlib.sha1(body.encode("utf-8")).hexdigest()[:16]
            cached = self._policy_json[policy] = f'{{"_id":"{digest}",{body[1:]}'
        return cached

    # --- the cache ----------------------------------------------------------------

    def refresh(self, domain: str, stored: bytes | dict[str, Any]) -> None:
        """Replace the cached state of *domain* with its record read from Redis (a script's
        reply: the stored value; or its entries)."""
        fields = stored if isinstance(stored, dict) else unpack_state(stored)
        if fields.get("health") in (None, ""):
            return
        cached = self._domains.get(domain)
        invalid: list[str] = []

        def bad(name: str, value: Any) -> None:
            invalid.append(name)
            self._report_invalid(domain, name, value)

        typed = typed_fields(fields, bad)
        for name in invalid:  # this worker's own value stands (a default when it has none)
            if cached is not None and hasattr(cached, name):
                typed[name] = getattr(cached, name)
        try:
            self._domains[domain] = fresh = domain_from(domain, typed, self.policy)
        except (ValueError, OverflowError) as exc:
            logger.warning(
                "Ignoring unreadable health state of %(domain)s in Redis: %(error)s", {"domain": domain, "error": exc}
            )
            return
        if cached is not None and fresh.refusals_flat and not cached.refusals_flat:
            self._wake(domain)  # (found pace-independent in Redis, maybe on another worker's answers)

    def _report_invalid(self, domain: str, name: str, value: Any) -> None:
        self.crawler.stats.inc_value("openclaw/redis/invalid_fields")
        self._invalid.warn(
            (domain, name),
            "Ignoring health field %(field)s=%(value)r of %(domain)s in Redis: not a valid value "
            "(written by something other than a worker?); this worker's own value stands",
            {"field": name, "value": shown(value), "domain": domain},
        )

    def _run(self, script: Any, domain: str, args: list[Any]) -> Any:
        """Run a health script for *domain*; None while Redis is unreachable."""
        if not self.link.ok():
            return None
        try:
            return self.link.call(script, keys=self._keys(domain), args=[*args, domain])
        except RedisError as exc:
            logger.warning(
                "Health state of %(domain)s not shared (Redis: %(error)s); pacing locally",
                {"domain": domain, "error": exc},
            )
            return None

    def ensure(self, domain: str) -> None:
        """Store the domain's policy in Redis (and its initial state, first worker wins)."""
        if domain in self._known or domain in self._ensuring or not self.link.ok():
            return
        keys = [self._key(domain), self._domains_key(domain)]
        args: list[Any] = [self.clock(), self.policy_json(domain), domain]
        seed = self.remembered.get(domain)
        if seed is not None:  # (site memory: applied only if this worker is the first to meet it)
            resumed = self.remembered.resumed_limit(domain)
            args += ["" if resumed is None else resumed, seed.burst, seed.crawl_delay]
        if self.link.background:
            self._ensuring.add(domain)

            def ensured(flat: Any) -> None:
                self._ensuring.discard(domain)
                self._known.add(domain)
                self.refresh(domain, flat)

            self.link.submit(
                lambda: self._ensure(keys=keys, args=args),
                callback=ensured,
                errback=lambda exc: self._ensuring.discard(domain),
            )
            return
        try:
            flat = self.link.call(self._ensure, keys=keys, args=args)
        except RedisError:
            return  # tried again with the next push
        self._known.add(domain)
        self.refresh(domain, flat)

    def _shared(
        self,
        script: Any,
        domain: str,
        args: list[Any],
        *,
        cached: Callable[[], _T],
        on_reply: Callable[[Any], None] | None = None,
        applied: Callable[[Any], _T] | None = None,
        urgent: bool = True,
    ) -> _T:
        """A change to the shared state, and the Redis-outage fallback every change shares.

        During a crawl the script is sent in the background and *cached* (this worker's cache)
        answers now; *on_reply* (default: refresh the cache) gets Redis's reply; only a change
        that is not *urgent* (a success, a page's own failure) waits for the next round. Outside a
        crawl the script runs now and *applied* (default: refresh) turns its reply into the
        answer; *cached* answers when Redis cannot be reached."""
        refresh = functools.partial(self.refresh, domain)
        if self.link.background:
            self._send(script, domain, args, on_reply or refresh, urgent)
            return cached()
        res = self._run(script, domain, args)
        if res is None:
            return cached()
        return (applied or cast("Callable[[Any], _T]", refresh))(res)  # (the default answers None)

    def _send(self, script: Any, domain: str, args: list[Any], on_reply: Any, urgent: bool) -> None:
        """During a crawl: run a health script on the Redis thread; *on_reply* gets its result
        (*urgent*: at once, not with the next round)."""
        if not self.link.ok():
            return
        self.link.submit_script(script, self._keys(domain), [*args, domain], callback=on_reply, urgent=urgent)

    def evict_idle(self, now: float | None = None, keep: Container[str] = ()) -> list[str]:
        """Forget idle domains in this worker's cache, and that they were ensured: a domain seen
        again is ensured and read from Redis anew (its hash there expires on its own, ``k_key_ttl``)."""
        gone = super().evict_idle(now, keep)
        self._known.difference_update(gone)
        return gone

    # --- the contract: changes run in Redis ------------------------------------------

    def try_acquire(self, domain: str, now: float | None = None, *, token: bool = True) -> bool:
        """Take a token (and the half-open probe) in Redis; ``token=False``: hold/circuit only."""
        now = self.clock() if now is None else now
        if self.link.background:  # (the queue's pop takes tokens in Redis; this answers from the cache)
            return super().try_acquire(domain, now, token=token)
        res = self._run(self._acquire, domain, [now, self.policy_json(domain), 1 if token else 0])
        if res is None:
            return super().try_acquire(domain, now, token=token)
        self.refresh(domain, res[1])
        return int(res[0]) == 1

    def record_success(self, domain: str, latency: float | None, now: float | None = None) -> str | None:
        now = self.clock() if now is None else now
        judged = self.site_latency(latency, now)  # (the limit fit below keeps the raw send time)
        sample = "" if judged is None or not math.isfinite(judged) or judged < 0 else repr(float(judged))
        args = [
            now,
            self.policy_json(domain),
            1,
            sample,
            0,
            0,
            0,
            0,
            "",
            1,
            1,
            0,
            NOTE_ANSWER,
            sent_at(now, latency),
            0,
        ]
        return self._shared(
            self._record,
            domain,
            args,
            cached=lambda: super(RedisHealthRegistry, self).record_success(domain, latency, now),
            on_reply=lambda res: self.refresh(domain, res[0]),
            applied=lambda res: self._recorded(domain, res),
            urgent=False,
        )

    def record_failure(
        self,
        domain: str,
        classification: Classification,
        now: float | None = None,
        retry_after: float | None = None,
        failed_before: float | None = None,
        latency: float | None = None,
    ) -> str | None:
        """The verdict (page or domain) is judged here, on this worker's cached view;
        Redis applies it (see the H_RECORD script)."""
        now = self.clock() if now is None else now
        cached, policy = self._get(domain, now)
        domain_signal, in_share = _accounted(cached, classification, retry_after, failed_before)
        penalty, congestion = _penalty(classification, policy) if domain_signal else (0.0, False)
        args = [
            now,
            self.policy_json(domain),
            0,
            "",
            int(domain_signal),
            penalty,
            (2 if measures_limit(classification.status, retry_after) else 1) if congestion else 0,
            int(bool(classification is not None and classification.is_throttle)),
            "" if retry_after is None else repr(float(retry_after)),
            self._jitter(domain),
            int(classification.status is not None),
            int(in_share),
            note_kind(classification.status, retry_after),
            sent_at(now, latency),
            int(_rate_signal(classification, retry_after)),
        ]
        return self._shared(
            self._record,
            domain,
            args,
            cached=lambda: super(RedisHealthRegistry, self).record_failure(
                domain, classification, now, retry_after, failed_before, latency
            ),
            on_reply=lambda res: self.refresh(domain, res[0]),
            applied=lambda res: self._recorded(domain, res),
            urgent=domain_signal,  # (a page's own failure waits for the next round, as a success)
        )

    def _recorded(self, domain: str, res: list[Any]) -> str | None:
        """Cache the new state; the circuit transition this worker's record caused, if any."""
        fields, changed = res
        self.refresh(domain, fields)
        return reply_text(changed) or None

    def _jitter(self, domain: str) -> float:
        """The cool-down jitter factor, should this failure open the circuit (drawn here:
        Lua's random numbers are not random in Redis 6 scripts)."""
        j = self.policy(domain).circuit_jitter
        return self._uniform(1.0 - j, 1.0 + j) if j else 1.0

    def set_crawl_delay(self, domain: str, seconds: float, *, owed: int = 0) -> None:
        args = [self.clock(), self.policy_json(domain), max(0.0, float(seconds)), max(0, int(owed))]
        self._shared(
            self._crawl_delay,
            domain,
            args,
            cached=lambda: super(RedisHealthRegistry, self).set_crawl_delay(domain, seconds, owed=owed),
        )

    def declare_limit(self, domain: str, pace: float, now: float | None = None) -> None:
        now = self.clock() if now is None else now
        args = [now, self.policy_json(domain), repr(max(0.0, float(pace)))]
        self._shared(
            self._declare,
            domain,
            args,
            cached=lambda: super(RedisHealthRegistry, self).declare_limit(domain, pace, now),
        )

    def hold(self, domain: str, until: float) -> None:
        args = [self.clock(), self.policy_json(domain), until]
        self._shared(self._hold, domain, args, cached=lambda: super(RedisHealthRegistry, self).hold(domain, until))

    def control(self, domain: str, now: float | None = None, **changes: float) -> None:
        """Operator overrides, in the shared state: every worker's pop obeys them at once."""
        now = self.clock() if now is None else now
        args: list[Any] = [now, self.policy_json(domain)]
        for name, value in changes.items():
            if name not in ("ctl_hold", "ctl_rate", "ctl_concurrency", "ctl_down"):
                raise ValueError(f"unknown override {name!r}")
            args += [name, repr(float(value))]

        def applied(res: Any) -> None:
            self.refresh(domain, res)
            self._wake(domain)  # (as super().control: the queues look again at what they parked)
            if changes.get("ctl_down", 1) == 0:
                self._given_up.discard(domain)

        self._shared(
            self._control,
            domain,
            args,
            cached=lambda: super(RedisHealthRegistry, self).control(domain, now, **changes),
            applied=applied,
        )

    # --- persistence -----------------------------------------------------------------

    def _redis_domains(self) -> dict[str, dict[str, Any]]:
        names: list[str] = []
        for shard in range(self.shards):
            names += (reply_text(m) for m in self.server.smembers(sharding.health_domains_key(self.spider_name, shard)))
        names.sort()
        out = {}
        for name in names:
            fields = read_state(self.server, self._key(name))
            if fields.get("health") not in (None, ""):
                out[name] = fields
        return out

    def snapshot(self) -> dict[str, Any]:
        """Every domain's shared state, in the local registry's snapshot format (during a
        crawl: this worker's cached view, the reactor never waits on Redis)."""
        if self.link.background:
            return super().snapshot()
        try:
            domains = self._redis_domains()
        except RedisError:
            return super().snapshot()  # this worker's last view
        for name, fields in domains.items():
            self.refresh(name, fields)
        return {"version": tuning.SNAPSHOT_VERSION, "domains": {name: _typed(f) for name, f in domains.items()}}

    def restore(self, data: Any) -> None:
        """Load a snapshot into Redis for domains that have no shared state yet (validated first)."""
        check = HealthRegistry(self._policies)
        check.restore(data)
        for name, fields in check.snapshot()["domains"].items():
            pjson = self.policy_json(name)
            record = {k: v for k, v in fields.items() if v is not None}
            # (as health.lua's h_save stores it: the policy packed on its own)
            record.update(pol=msgpack.packb(json.loads(pjson)), pid=policy_id(pjson))
            if self.server.set(
                self._key(name), msgpack.packb(record, use_bin_type=False), nx=True
            ):  # (Redis's cmsgpack reads no bin type)
                self.server.sadd(self._domains_key(name), name)
            self.refresh(name, fields)


def shared_registry(crawler: Crawler) -> RedisHealthRegistry | None:
    """The crawler's health registry if it lives in Redis (the queue's pop then takes its tokens), else None."""
    from scrapy_openclaw.settings import OpenClawSettings

    if not OpenClawSettings.for_crawler(crawler).health_enabled:
        return None
    registry: Any = HealthRegistry.for_crawler(crawler)  # (the OPENCLAW_HEALTH_REGISTRY_CLASS)
    return registry if getattr(registry, "redis_prefix", None) else None


def _retry_poll() -> float:
    from scrapy_openclaw.pqueues import _RETRY_POLL

    return _RETRY_POLL
