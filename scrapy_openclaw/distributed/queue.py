"""A leased deadline queue in Redis: scrapy-redis's queue interface, no lost requests.

scrapy-redis pops destructively, so a worker killed mid-crawl loses every
request it had popped. Here a pop *leases* the entry: an atomic Lua script
moves it to an in-flight set scored by the lease expiry, with this worker's
id. The worker extends its leases on a heartbeat and acknowledges a request
when the engine has finished it (its callback or errback output pushed and
its items through the pipelines; see ``middleware.py``), or atomically with
the push of its retry / redirect copy. Any live worker
re-queues leases that expired (dead worker). A late acknowledgement after a
re-queue removes the entry if nobody leased it again, and is a no-op if
someone did, so nothing is fetched twice by our own doing.

Ordering is the local :class:`~scrapy_openclaw.pqueues.DeadlinePriorityQueue`'s:
requests are kept per domain; a pop takes the best effective priority among
the domains that may send now (priority, deadline aging
``e(t) = max(p, p + B + (t - D)·B/W)``, expired deadlines first or dropped as
dead letters; ties round-robin), and not-before times wait in a separate
sorted set until due. When the health registry lives in Redis, the pop also
takes the domain's token in the same script, so the combined rate of all
workers to a domain stays within its limit (one round trip per request); a
held or throttled domain steps aside in the domain index until it is ready,
so it never stalls the others (see ``lua.py`` for the keys).

An item that fails in a pipeline (its store was down) hands its request back
for another fetch, at most ``OPENCLAW_DISTRIBUTED_MAX_RELEASES`` times; after
that the request becomes a dead letter (reason ``item_failed``) instead of
looping forever.

Resume: the Redis keys *are* the checkpoint. When every worker stops (or is
killed), pending entries stay in the ready/delayed sets and leased ones in the
in-flight set; the next workers to start with the same ``REDIS_URL`` and spider
name re-queue expired leases and continue (``SCHEDULER_PERSIST`` is on).

Redis errors never lose a request: pushes and acknowledgements are kept in
memory and retried with backoff; pops return nothing until Redis is back.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from redis.exceptions import RedisError
from scrapy.utils.asyncio import call_later, create_looping_call
from scrapy.utils.misc import load_object

from scrapy_openclaw import meta as M
from scrapy_openclaw.delay import not_before, request_class, wake_engine
from scrapy_openclaw.distributed import lua
from scrapy_openclaw.distributed import serializer as json_serializer
from scrapy_openclaw.distributed.link import RedisLink
from scrapy_openclaw.runtime import crawl_id, shared
from scrapy_openclaw.serialization import RefusedRequest, SerializationError, request_from_data, request_to_data
from scrapy_openclaw.settings import DEFAULTS

if TYPE_CHECKING:
    from scrapy import Request, Spider

logger = logging.getLogger(__name__)

LEASE = M.LEASE  # the meta key holding the id of the queue entry a request was leased as
STATS = "openclaw/distributed"
_RUNTIME_KEY = "distributed_queue"


def active_queue(crawler: Any) -> LeasedDeadlineQueue | None:
    """The crawler's leased queue, once the scheduler has opened it."""
    from scrapy_openclaw.runtime import peek

    return peek(crawler, _RUNTIME_KEY)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _setting(settings: Any, name: str, getter: str) -> Any:
    return getattr(settings, getter)(name, DEFAULTS[name])


class LeasedDeadlineQueue:
    """scrapy-redis queue (``SCHEDULER_QUEUE_CLASS``) with leases and deadline order."""

    #: tells scrapy_openclaw.delay that not-before times are kept here.
    handles_not_before = True

    def __init__(self, server: Any, spider: Spider, key: str, serializer: Any = None):
        serializer = serializer or json_serializer
        for name in ("loads", "dumps"):
            if not hasattr(serializer, name):
                raise TypeError(f"serializer does not implement {name!r}: {serializer}")
        self.server = server
        self.spider = spider
        self.key = key % {"spider": spider.name}
        self.serializer = serializer
        self.crawler = spider.crawler
        settings = self.crawler.settings
        self.stats = self.crawler.stats
        self.lease = _setting(settings, "OPENCLAW_DISTRIBUTED_LEASE", "getfloat")
        self.heartbeat = _setting(settings, "OPENCLAW_DISTRIBUTED_HEARTBEAT", "getfloat") or self.lease / 3
        self.scan = _setting(settings, "OPENCLAW_DISTRIBUTED_SCAN", "getint")
        self.max_releases = _setting(settings, "OPENCLAW_DISTRIBUTED_MAX_RELEASES", "getint")
        self.boost = _setting(settings, "OPENCLAW_QUEUE_AGING_BOOST", "getfloat")
        self.worker = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.held: dict[str, float] = {}  # lease id -> time leased
        self._pending_push: list[tuple[Any, ...]] = []  # Lua args waiting for Redis
        self._pending_ack: set[str] = set()
        self.link = RedisLink.for_crawler(self.crawler)
        self._last_beat = 0.0
        self._wake_timer: Any = None
        self._wake_at = float("inf")
        self._seq = 0
        self._encoded: tuple[Request, str] | None = None  # the last encode(), for the push after it
        self._push = server.register_script(lua.PUSH)
        self._pop = server.register_script(lua.POP)
        self._ack = server.register_script(lua.ACK)
        self._beat = server.register_script(lua.HEARTBEAT)
        self._release = server.register_script(lua.RELEASE)
        self._reject = server.register_script(lua.REJECT)
        self._counts = server.register_script(lua.COUNTS)
        self.registry = self._health_registry()
        shared(self.crawler, _RUNTIME_KEY, lambda: self)
        self._loop = create_looping_call(self._tick)
        self._loop.start(min(0.5, self.heartbeat), now=False)

    # --- collaborators --------------------------------------------------------

    def _health_registry(self) -> Any:
        """The Redis health registry whose token buckets the pop script takes from."""
        settings = self.crawler.settings
        if not settings.getbool("OPENCLAW_HEALTH_ENABLED", True):
            return None
        try:
            from scrapy_openclaw.health import HealthRegistry

            registry = HealthRegistry.for_crawler(self.crawler)
        except ImportError:
            path = settings.get("OPENCLAW_HEALTH_REGISTRY_CLASS")
            registry = load_object(path).for_crawler(self.crawler) if path else None
        return registry if getattr(registry, "redis_prefix", None) else None

    def _policy(self, domain: str) -> Any:
        from scrapy_openclaw.policy import PolicySet

        return PolicySet.for_crawler(self.crawler).for_domain(domain)

    # --- scrapy-redis queue interface ----------------------------------------

    def _next_id(self) -> str:
        # time-ordered ids: equal priorities pop FIFO (Redis orders equal scores by member)
        self._seq += 1
        return f"{time.time():017.6f}-{self.worker[-6:]}-{self._seq:x}"

    def encode(self, request: Request) -> str:
        """The queue entry for *request*; :class:`SerializationError` (URL and key) if it cannot be stored.

        The scheduler calls it before the duplicate filter, so a request that
        cannot be stored is refused without being marked as seen. It writes the
        policy's default deadline into meta (the entry carries it), nothing else.
        """
        domain = urlparse(request.url).hostname or ""
        if request.meta.get(M.DEADLINE) is None:
            policy = self._policy(domain).deadline
            seconds = policy.classes.get(request_class(request, self.stats), policy.default)
            if seconds is not None:
                request.meta[M.DEADLINE] = time.time() + float(seconds)
        lease = request.meta.pop(LEASE, None)  # the entry never carries a lease
        try:
            payload = self.serializer.dumps(request_to_data(request, self.spider, compact=True))
            self._encoded = (request, payload)  # push() takes it from here: one encoding per request
            return payload
        except (TypeError, ValueError) as exc:  # a custom SCHEDULER_SERIALIZER's own refusal
            if isinstance(exc, SerializationError):
                raise
            raise SerializationError(f"request {request.url}: {type(exc).__name__}: {exc}") from None
        finally:
            if lease is not None:
                request.meta[LEASE] = lease

    def drop_lease(self, request: Request) -> None:
        """A refused retry or redirect copy: acknowledge the page it was leased as (it is finished)."""
        lease = request.meta.pop(LEASE, None)
        if lease is not None and self.held.pop(lease, None) is not None:
            self._send_ack(lease)

    def push(self, request: Request, dupe: tuple[str, str] | None = None) -> bool:
        """Queue *request*; False only when *dupe* (dupefilter key, fingerprint) was already seen.

        With *dupe* the fingerprint is marked in the same Lua step as the push
        (see ``lua.PUSH``), so a worker killed in between cannot leave a page
        marked as seen but never queued. While Redis is down the push is kept in
        memory and the check happens when it is flushed. A request that cannot
        be stored raises :class:`SerializationError` before anything is marked
        (the scheduler calls :meth:`encode` first; its result is reused here).
        """
        encoded = self._encoded
        payload = encoded[1] if encoded is not None and encoded[0] is request else self.encode(request)
        self._encoded = None
        now = time.time()
        lease = request.meta.pop(LEASE, None)
        ack_id = lease if lease is not None and self.held.pop(lease, None) is not None else ""
        domain = urlparse(request.url).hostname or ""
        policy = self._policy(domain).deadline
        deadline = request.meta.get(M.DEADLINE)
        info = json_serializer.dumps({
            "p": request.priority, "d": float(deadline or 0), "w": float(policy.aging_window),
            "x": policy.expired, "dom": domain,
        })
        if self.registry is not None and domain:
            try:
                self.registry.ensure(domain)
            except RedisError:
                pass  # retried with the next push; the pop just does not gate meanwhile
        nb = not_before(request, self.stats, now=now)
        args = (self.key, self.boost, self._next_id(), payload, info, nb, now, ack_id, self.worker,
                *(dupe or ()))
        queued = self._call_push(args)
        if queued is None:
            self._pending_push.append(args)
        elif not queued:
            return False
        self.stats.inc_value(f"{STATS}/pushed")
        if nb > now:
            self._wake(nb)
        return True

    def pop(self, timeout: float = 0) -> Request | None:
        if not self._redis_ok():
            return None
        self._flush()
        registry = self.registry
        for _ in range(16):  # bounded: refused entries are skipped, not retried forever
            now = time.time()
            try:
                res = self.link.call(self._pop, args=[
                    self.key, self.boost, now, now + self.lease, self.worker, self.scan,
                    getattr(registry, "redis_prefix", "") or "",
                ])
            except RedisError:
                return None
            status, extra, payload, requeued, dropped, states = res
            status = _text(status)
            if int(requeued):
                self._requeued(int(requeued))
            for raw in dropped:
                self._dead_letter(raw, reason="deadline_expired", error_class="deadline")
            if registry is not None:
                for i in range(0, len(states), 2):
                    registry.refresh(_text(states[i]), states[i + 1])
            if status == "wait":
                self._wake(float(_text(extra)))
                return None
            if status != "ok":
                return None
            entry_id = _text(extra)
            try:
                request = self._decode(payload)
            except SerializationError as exc:
                self._refuse(entry_id, exc)  # at once: a refused entry must not keep its lease
                continue
            request.meta[LEASE] = entry_id
            self.held[entry_id] = now
            self.stats.inc_value(f"{STATS}/leased")
            return request
        return None

    def __len__(self) -> int:
        """Everything not yet finished by anyone, minus what this worker is processing.

        Other workers' leases count (their results may add work), ours do not
        (Scrapy tracks those as in-progress itself), so a worker with a leaked
        lease cannot keep itself open forever.
        """
        buffered = len(self._pending_push)
        if not self._redis_ok():
            return buffered + (1 if self.link.within_outage() else 0)
        try:
            ready, delayed, inflight = (int(n) for n in self.link.call(self._counts, args=[self.key]))
        except RedisError:
            return buffered + (1 if self.link.within_outage() else 0)
        return max(0, ready + delayed + inflight - len(self.held)) + buffered

    def clear(self) -> None:
        suffixes = ("", ":domains", ":served", ":seq", ":count", ":delayed", ":inflight", ":owner",
                    ":data", ":info", ":released")
        self.server.delete(*(self.key + s for s in suffixes))
        for part in (":q:", ":a:", ":e:"):
            keys = list(self.server.scan_iter(match=self.key + part + "*", count=500))
            if keys:
                self.server.delete(*keys)

    # --- leases -----------------------------------------------------------------

    def ack(self, lease_id: str | None) -> None:
        """The request leased as *lease_id* is finished (idempotent)."""
        if lease_id is None or self.held.pop(lease_id, None) is None:
            return
        self.stats.inc_value(f"{STATS}/acked")
        self._send_ack(lease_id)

    def release(self, lease_id: str | None) -> None:
        """Put the leased request back at once: it was not finished (e.g. its item was not stored).

        Counted per entry: past ``OPENCLAW_DISTRIBUTED_MAX_RELEASES`` the request
        becomes a dead letter instead of being fetched again and again.
        """
        if lease_id is None or self.held.pop(lease_id, None) is None:
            return
        self.stats.inc_value(f"{STATS}/released")
        if not self._redis_ok():
            return  # the lease expires and is re-queued then
        try:
            _, dead = self.link.call(self._release, args=[self.key, self.boost, self.worker,
                                                          self.max_releases, lease_id])
        except RedisError:
            return
        for raw in dead:
            self._dead_letter(raw, reason="item_failed", error_class="item")

    def _send_ack(self, lease_id: str) -> None:
        self._pending_ack.add(lease_id)
        if self._redis_ok():
            self._flush()

    def close(self, reason: str) -> None:
        """Stop the heartbeat; hand leftover leases back (or drop leaks on a clean finish)."""
        if self._loop.running:
            self._loop.stop()
        if self._wake_timer is not None:
            self._wake_timer.cancel()
            self._wake_timer = None
        self.link.reset_backoff()
        self._flush()
        ids = list(self.held)
        if not ids:
            return
        try:
            if reason == "finished":  # everything was processed; these were never acked
                self._ack(args=[self.key, self.boost, self.worker, *ids])
            else:
                n, _ = self._release(args=[self.key, self.boost, self.worker, -1, *ids])
                logger.info("Returned %(n)d leased requests to the Redis queue", {"n": n},
                            extra={"spider": self.spider})
            self.held.clear()
        except RedisError as exc:
            logger.warning(
                "Could not return %(n)d leases to Redis (%(error)s); they expire in %(lease)ss",
                {"n": len(ids), "error": exc, "lease": self.lease}, extra={"spider": self.spider},
            )

    def _tick(self) -> None:
        """Every poll interval: retry buffered writes, heartbeat, let the engine look for work."""
        now = time.time()
        if self._redis_ok():
            self._flush()
            if now - self._last_beat >= self.heartbeat and self._redis_ok():
                self._last_beat = now
                try:
                    _, requeued = self.link.call(self._beat, args=[
                        self.key, self.boost, self.worker, now, now + self.lease, *self.held])
                except RedisError:
                    pass
                else:
                    if int(requeued):
                        self._requeued(int(requeued))
        self._wake_engine()  # work pushed by other workers

    def _requeued(self, n: int) -> None:
        self.stats.inc_value(f"{STATS}/lease_expired", n)
        logger.info("Re-queued %(n)d requests whose lease expired (a worker died?)", {"n": n},
                    extra={"spider": self.spider})

    # --- refused and expired entries -------------------------------------------

    def _decode(self, payload: Any) -> Request:
        """The request of a queue entry; :class:`SerializationError` for anything else.

        Entries are untrusted (anyone who can write to Redis): whatever the
        serializer or the rebuild raises is a refusal, never an exception that
        would leave the entry leased until its lease expires.
        """
        try:
            return request_from_data(self.serializer.loads(payload), self.spider)
        except SerializationError:
            raise
        except Exception as exc:  # a custom SCHEDULER_SERIALIZER may raise anything
            raise SerializationError(f"undecodable queue entry: {type(exc).__name__}: {exc}") from None

    def _refuse(self, entry_id: str, exc: Exception) -> None:
        """Move a refused entry aside at once; a refused request (scheme, callback, meta) is a dead letter too."""
        logger.error(
            "Refused a Redis queue entry of %(key)s (moved to %(key)s:rejected, not executed): %(error)s",
            {"key": self.key, "error": exc}, extra={"spider": self.spider},
        )
        self.stats.inc_value(f"{STATS}/rejected")
        try:
            self.link.call(self._reject, args=[self.key, self.boost, entry_id, self.worker, str(exc)[:500]])
        except RedisError:
            pass  # the lease expires and the next pop refuses it again
        if isinstance(exc, RefusedRequest):
            self._refused_dead_letter(exc)

    def _refused_dead_letter(self, exc: RefusedRequest) -> None:
        """A record of the refused request for the operator; it holds no request, so it is never replayed."""
        from scrapy_openclaw import signals as openclaw_signals
        from scrapy_openclaw.deadletter import DeadLetter

        letter = DeadLetter(
            url=exc.url, domain=urlparse(exc.url).hostname or "", error_class="refused",
            reason=f"stored_{exc.kind}", spider=self.spider.name, crawl_id=crawl_id(self.crawler),
            exception_type=type(exc).__name__, exception_message=str(exc)[:2000],
        )
        self.crawler.signals.send_catch_log(
            signal=openclaw_signals.dead_letter, dead_letter=letter, spider=self.spider
        )

    def _dead_letter(self, payload: Any, *, reason: str, error_class: str) -> None:
        """A request removed from the queue for good (deadline passed, items kept failing)."""
        from scrapy_openclaw import signals as openclaw_signals
        from scrapy_openclaw.deadletter import for_request

        try:
            request = self._decode(payload)
        except SerializationError as exc:
            logger.error("Dropped a Redis queue entry (%(reason)s) that does not decode: %(error)s",
                         {"reason": reason, "error": exc}, extra={"spider": self.spider})
            return
        request.meta.pop(LEASE, None)
        self.stats.inc_value(f"{STATS}/dead_letters/{reason}")
        if reason == "deadline_expired":
            self.stats.inc_value(f"{STATS}/deadline_dropped")
        logger.warning("Giving up on %(request)s: %(reason)s", {"request": request, "reason": reason},
                       extra={"spider": self.spider})
        letter = for_request(request, spider=self.spider, crawl_id=crawl_id(self.crawler),
                             error_class=error_class, reason=reason)
        self.crawler.signals.send_catch_log(
            signal=openclaw_signals.dead_letter, dead_letter=letter, spider=self.spider
        )

    # --- Redis outages -----------------------------------------------------------

    def _call_push(self, args: tuple[Any, ...]) -> bool | None:
        """True: queued; False: already in the dupefilter; None: Redis unreachable."""
        if not self._redis_ok():
            return None
        try:
            return bool(int(self.link.call(self._push, args=list(args))))
        except RedisError:
            return None

    def _flush(self) -> None:
        while self._pending_push:
            queued = self._call_push(self._pending_push[0])
            if queued is None:
                return
            self._pending_push.pop(0)
            if not queued:  # a buffered push whose fingerprint another worker marked meanwhile
                self.stats.inc_value(f"{STATS}/filtered_on_flush")
        if self._pending_ack and self._redis_ok():
            ids = list(self._pending_ack)
            try:
                self.link.call(self._ack, args=[self.key, self.boost, self.worker, *ids])
            except RedisError:
                return
            self._pending_ack.difference_update(ids)

    def _redis_ok(self) -> bool:
        return self.link.ok()

    def _wake(self, at: float) -> None:
        """Wake the engine at *at* (a delayed entry or a domain token becomes due)."""
        if self._wake_timer is not None and self._wake_at <= at:
            return
        if self._wake_timer is not None:
            self._wake_timer.cancel()
        self._wake_at = at
        self._wake_timer = call_later(max(0.0, at - time.time()) + 0.001, self._woken)

    def _woken(self) -> None:
        self._wake_timer, self._wake_at = None, float("inf")
        self._wake_engine()

    def _wake_engine(self) -> None:
        if self.crawler.crawling:  # Crawler.engine raises before the crawl starts (Scrapy >= 2.19)
            wake_engine(self.crawler)
