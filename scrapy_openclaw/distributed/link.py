"""One Redis thread and one shared view of "is Redis reachable" for a crawl's distributed components.

During a crawl every Redis call of the queue, the health registry and the control
channel runs on one thread of its own, in order, so a slow, paused or unreachable
Redis never stalls the reactor; outside a crawl (tests, the CLI) calls run inline.
One outage is seen, backed off from and ended once for every component.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from scrapy.utils.asyncio import call_later

from scrapy_openclaw.runtime import shared
from scrapy_openclaw.settings import OpenClawSettings

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

STATS = "openclaw/distributed"
_MIN_BACKOFF = 0.1
_MAX_BACKOFF = 5.0


class RedisLink:
    """Outage state shared by the queue and the health registry of one crawler.

    :meth:`submit` is FIFO, so a page's acknowledgement never overtakes the pushes of its
    links; results come back to the reactor thread. The first failure opens a backoff
    window (0.1 s doubling to 5 s) during which no component calls Redis; the first
    successful call after it closes the outage once for everyone. *clock*: a zero-argument callable returning seconds (the backoff windows'
    and the outage's time; tests pass a fake one).
    """

    def __init__(self, crawler: Crawler, *, clock: Callable[[], float] = time.time):
        self.crawler = crawler
        self.clock = clock
        self.stats = crawler.stats
        self.max_outage = OpenClawSettings.for_crawler(crawler).distributed_max_outage
        self.down_since: float | None = None
        self._retry_at = 0.0
        self._backoff = 0.0
        self._executor: ThreadPoolExecutor | None = None
        self._to_reactor: Any = None
        self._scripts: deque[tuple[Any, list[Any], list[Any], Any]] = deque()  # (see submit_script)
        self._flush_queued = False
        #: seconds a script call may wait for a queue round to carry it (see submit_script; the
        #: queue sets it while its rounds take such calls); 0: each goes at once
        self.ride_wait = 0.0
        self._ride_timer: Any = None
        self._same: dict[int, bool] = {}  # id(a health script's client) -> it talks to the queue's Redis

    @classmethod
    def for_crawler(cls, crawler: Crawler, *, clock: Callable[[], float] = time.time) -> RedisLink:
        """The crawler's link (*clock*: used by the first caller, who creates it)."""
        return shared(crawler, "distributed_link", lambda: cls(crawler, clock=clock))

    def ok(self) -> bool:
        """Whether a Redis call may be tried now (not inside a backoff window)."""
        return self.clock() >= self._retry_at

    def within_outage(self) -> bool:
        """Redis is up, or has been down for less than ``OPENCLAW_DISTRIBUTED_MAX_OUTAGE``."""
        return self.down_since is None or self.clock() - self.down_since < self.max_outage

    def failed(self, exc: Exception) -> None:
        now = self.clock()
        if self.down_since is None:
            self.down_since = now
            logger.warning(
                "Redis unreachable (%(error)s); buffering writes and retrying",
                {"error": exc},
                extra={"spider": self.crawler.spider},
            )
        self.stats.inc_value(f"{STATS}/redis_errors")
        self._backoff = min(_MAX_BACKOFF, max(_MIN_BACKOFF, self._backoff * 2))
        self._retry_at = now + self._backoff

    def recovered(self) -> None:
        if self.down_since is not None:
            logger.info(
                "Redis is back after %(s).1fs",
                {"s": self.clock() - self.down_since},
                extra={"spider": self.crawler.spider},
            )
            self.stats.inc_value(f"{STATS}/reconnects")
        self.down_since, self._backoff, self._retry_at = None, 0.0, 0.0

    def reset_backoff(self) -> None:
        """Allow one more attempt at once (a clean close flushing what it buffered)."""
        self._retry_at = 0.0

    # --- the Redis thread ----------------------------------------------------------

    @property
    def background(self) -> bool:
        """Whether Redis calls run on the Redis thread (during a crawl)."""
        return self._executor is not None

    def start_background(self) -> None:
        """From now on :meth:`submit` runs calls on the Redis thread (call on the reactor thread)."""
        if self._executor is not None:
            return
        if "twisted.internet.reactor" in sys.modules:
            from twisted.internet import reactor

            self._to_reactor = reactor.callFromThread
        else:  # Scrapy without a Twisted reactor: the asyncio loop
            import asyncio

            self._to_reactor = asyncio.get_event_loop().call_soon_threadsafe
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="openclaw-redis")

    def to_reactor(self, fn: Any, *args: Any) -> None:
        """``fn(*args)`` on the reactor thread, from any thread (during a crawl)."""
        self._to_reactor(fn, *args)

    def submit(self, fn: Any, *args: Any, callback: Any = None, errback: Any = None, raw: bool = False) -> None:
        """``fn(*args)`` on the Redis thread (inline outside a crawl); ``callback(result)`` or
        ``errback(exc)`` (a RedisError) on the reactor thread, with the outage bookkeeping
        (*raw*: the callback does its own, *fn* reporting errors in its result)."""
        if self._executor is None:
            self._deliver(_capture(fn, args), callback, errback, raw)
            return
        future = self._executor.submit(_capture, fn, args)
        future.add_done_callback(lambda f: self._to_reactor(self._deliver, f.result(), callback, errback, raw))

    def submit_script(
        self, script: Any, keys: list[Any], args: list[Any], *, callback: Any = None, urgent: bool = False
    ) -> None:
        """A script call whose order against other calls does not matter (a health record): the
        ones submitted while the Redis thread is busy, or within ``ride_wait``, go together;
        an *urgent* one (what the other workers must learn soon: a hold, a penalty) goes at once,
        with those waiting."""
        if self._executor is None:
            self.submit(lambda: script(keys=keys, args=args), callback=callback)
            return
        self._scripts.append((script, keys, args, callback))
        if self.ride_wait > 0 and not urgent:  # the queue's next round takes it (one round trip, and a domain's
            # records of that round as one call); after ride_wait it goes on its own
            if self._ride_timer is None:
                self._ride_timer = call_later(self.ride_wait, self._ride_over)
            return
        self.flush_scripts()

    def _ride_over(self) -> None:
        self._ride_timer = None
        self.flush_scripts()

    def flush_scripts(self) -> None:
        """The reactor thread: send the script calls still waiting (those no round took)."""
        if self._ride_timer is not None:
            self._ride_timer.cancel()
            self._ride_timer = None
        if self._executor is None or not self._scripts or self._flush_queued:
            return
        self._flush_queued = True
        self._executor.submit(self._flush_scripts)

    def _flush_scripts(self) -> None:
        """The Redis thread: every script call queued so far, in one pipeline."""
        self._flush_queued = False  # (before draining: what comes after is flushed by the next one)
        calls = []
        while self._scripts:
            calls.append(self._scripts.popleft())
        if not calls:
            return
        calls = merged(calls)
        outcomes = _capture(_pipelined, (calls,))
        if not outcomes[0]:  # the pipeline itself failed: one failure to tell
            self._to_reactor(self._deliver, outcomes, None, None, False)
            return
        for (_, _, _, callback), outcome in zip(calls, outcomes[1]):
            self._to_reactor(self._deliver, outcome, callback, None, False)

    def take_scripts(self, server: Any) -> list[tuple[Any, list[Any], list[Any], Any]]:
        """The Redis thread: the script calls waiting for their pipeline that run on *server*, for a
        queue round to carry in its own pipeline (one round trip less); their replies go back
        through :meth:`deliver_scripts`. The others stay for their own flush."""
        taken: list[tuple[Any, list[Any], list[Any], Any]] = []
        left: list[tuple[Any, list[Any], list[Any], Any]] = []
        while self._scripts:
            call = self._scripts.popleft()
            client = call[0].registered_client
            if id(client) not in self._same:  # (asked once per client: the answer is for the crawl)
                self._same[id(client)] = same_server(client, server)
            (taken if self._same[id(client)] else left).append(call)
        self._scripts.extendleft(reversed(left))
        return merged(taken)

    def deliver_scripts(
        self, calls: list[tuple[Any, list[Any], list[Any], Any]], outcomes: list[tuple[bool, Any]]
    ) -> None:
        """The Redis thread: each taken call's ``(ok, reply or exception)`` to its callback, on the reactor thread."""
        for (_, _, _, callback), outcome in zip(calls, outcomes):
            self._to_reactor(self._deliver, outcome, callback, None, False)

    def _deliver(self, outcome: tuple[bool, Any], callback: Any, errback: Any, raw: bool = False) -> None:
        from redis.exceptions import RedisError

        ok, value = outcome
        if ok:
            if not raw:
                self.recovered()
            if callback is not None:
                callback(value)
            return
        if not isinstance(value, RedisError):
            logger.error("Redis call failed: %(error)r", {"error": value}, exc_info=value)
            return
        self.failed(value)
        if errback is not None:
            errback(value)

    def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` with the outage bookkeeping; RedisError propagates."""
        from redis.exceptions import RedisError

        try:
            result = fn(*args, **kwargs)
        except RedisError as exc:
            self.failed(exc)
            raise
        self.recovered()
        return result


def merged(calls: list[tuple[Any, list[Any], list[Any], Any]]) -> list[tuple[Any, list[Any], list[Any], Any]]:
    """The calls, with the records of one domain that follow each other (a script marked
    ``openclaw_merges``: its ARGV takes several records in a row) as one call: one read and one
    write of the domain's state instead of one each. Every callback gets the one reply."""
    out: list[tuple[Any, list[Any], list[Any], list[Any]]] = []
    open_at: dict[Any, int] = {}  # the first key -> the merged call still open for more records
    for script, keys, args, callback in calls:
        key = keys[0] if keys else None
        i = open_at.get(key)
        if i is not None and out[i][0] is script:
            out[i][2].extend(args)
            out[i][3].append(callback)
            continue
        out.append((script, keys, list(args), [callback]))
        if getattr(script, "openclaw_merges", False):
            open_at[key] = len(out) - 1
        else:
            open_at.pop(key, None)  # (another change of that state: the records after it wait for it)
    return [(s, k, a, _fan_out(cbs)) for s, k, a, cbs in out]


def _fan_out(callbacks: list[Any]) -> Any:
    live = [cb for cb in callbacks if cb is not None]
    if len(live) <= 1:
        return live[0] if live else None
    return lambda value: [cb(value) for cb in live]


def same_server(a: Any, b: Any) -> bool:
    """Whether two redis-py clients talk to the same Redis (or the same cluster): one pipeline may
    carry both's calls. Unsure is no."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if hasattr(a, "get_nodes"):  # RedisCluster
        try:
            return {n.name for n in a.get_nodes()} == {n.name for n in b.get_nodes()}
        except Exception:  # (no node known yet)
            return False
    pool_a, pool_b = getattr(a, "connection_pool", None), getattr(b, "connection_pool", None)
    if pool_a is None or pool_b is None or type(pool_a) is not type(pool_b):
        return False
    if getattr(pool_a, "service_name", None) != getattr(pool_b, "service_name", None):  # (Sentinel)
        return False
    where = ("host", "port", "db", "path", "username")
    kw_a, kw_b = pool_a.connection_kwargs, pool_b.connection_kwargs
    return all(kw_a.get(k) == kw_b.get(k) for k in where)


def _pipelined(calls: list[tuple[Any, list[Any], list[Any], Any]]) -> list[tuple[bool, Any]]:
    """Run redis-py ``Script`` calls (of one client) in one pipeline per node."""
    from scrapy_openclaw.distributed.connection import run_scripts

    return run_scripts(calls[0][0].registered_client, [(s, k, a) for s, k, a, _ in calls])


def _capture(fn: Any, args: Any) -> tuple[bool, Any]:
    """(True, result) or (False, the exception): the Redis thread never raises."""
    try:
        return True, fn(*args)
    except Exception as exc:  # delivered to the reactor thread, which decides
        return False, exc
