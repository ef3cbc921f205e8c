"""Queue entries that leave the leased queue other than by being crawled.

Redis entries are untrusted: one that is not sealed or does not decode is moved
aside to its shard's ``:rejected`` hash, never executed and never left leased. A
refused request, a deadline dropped under ``expired: drop`` and a request whose
items kept failing become dead letters, by the ``dead_letter`` signal as locally.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy_openclaw import meta as M
from scrapy_openclaw.distributed.serializer import UnsealedPayload
from scrapy_openclaw.serialization import RefusedRequest, SerializationError, request_from_data
from scrapy_openclaw.settings import crawl_id

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

    from scrapy_openclaw.distributed.shards import ShardKeys

logger = logging.getLogger(__name__)

STATS = "openclaw/distributed"


class QueueEntries:
    """The leased queue's handling of refused and dead entries (a mixin of ``LeasedDeadlineQueue``)."""

    # (set by LeasedDeadlineQueue.__init__)
    crawler: Crawler
    spider: Spider
    stats: StatsCollector
    serializer: Any
    key: str
    shards: ShardKeys
    held: dict[str, str]
    _pending_reject: list[tuple[str, str]]

    if TYPE_CHECKING:  # (LeasedDeadlineQueue's)

        def push(self, request: Request, dupe: tuple[str, str] | None = None, on_dupe: Any = None) -> bool: ...

        def _kick(self, *, pops: bool = False, counts: bool = False) -> None: ...

    def _decode(self, payload: Any) -> Request:
        """The request of a queue entry; :class:`SerializationError` for anything else.

        Whatever the serializer or the rebuild raises is a refusal, never an
        exception that would leave the entry leased until its lease expires.
        """
        try:
            return request_from_data(self.serializer.loads(payload), self.spider)
        except SerializationError:
            raise
        except Exception as exc:  # a custom SCHEDULER_SERIALIZER may raise anything
            raise SerializationError(f"undecodable queue entry: {type(exc).__name__}: {exc}") from None

    def _refuse(self, lease: str, exc: Exception) -> None:
        """Move a refused entry aside at once; a refused request (scheme, callback, meta) is a dead letter too."""
        logger.error(
            "Refused a Redis queue entry of %(key)s (moved to its shard's :rejected, not executed): %(error)s",
            {"key": self.key, "error": exc},
            extra={"spider": self.spider},
        )
        self.stats.inc_value(f"{STATS}/rejected")
        if isinstance(exc, UnsealedPayload):
            self.stats.inc_value(f"{STATS}/refused")
        self.held.pop(lease, None)
        self._pending_reject.append((lease, str(exc)[:500]))  # (if lost, the lease expires and it is refused again)
        self._kick()
        if isinstance(exc, RefusedRequest):
            self._refused_dead_letter(exc)

    def _refuse_foreign(self, member: Any) -> None:
        """A member of the plain scrapy-redis key: kept in ``:rejected`` (never executed) when it
        is not one of our JSON requests, queued like any other request when it is."""
        try:
            request = self._decode(member)
        except SerializationError as exc:
            logger.error(
                "Refused a Redis queue entry of %(key)s (foreign; moved to %(rejected)s, not executed): %(error)s",
                {"key": self.key, "rejected": self.shards.name("rejected", 0), "error": exc},
                extra={"spider": self.spider},
            )
            self.stats.inc_value(f"{STATS}/rejected")
            if isinstance(exc, UnsealedPayload):
                self.stats.inc_value(f"{STATS}/refused")
            if isinstance(exc, RefusedRequest):
                self._refused_dead_letter(exc)
            return
        self.push(request)

    def _refused_dead_letter(self, exc: RefusedRequest) -> None:
        """A record of the refused request for the operator; it holds no request, so it is never replayed."""
        from scrapy_openclaw import signals as openclaw_signals
        from scrapy_openclaw.deadletter import DeadLetter, domain_of

        letter = DeadLetter(
            url=exc.url,
            domain=domain_of(self.crawler, exc.url),
            error_class="refused",
            reason=f"stored_{exc.kind}",
            spider=self.spider.name,
            crawl_id=crawl_id(self.crawler),
            exception_type=type(exc).__name__,
            exception_message=str(exc)[:2000],
        )
        self.crawler.signals.send_catch_log(signal=openclaw_signals.dead_letter, dead_letter=letter, spider=self.spider)

    def _dead_letter(self, payload: Any, *, reason: str, error_class: str) -> None:
        """A request removed from the queue for good (deadline passed, items kept failing)."""
        from scrapy_openclaw import signals as openclaw_signals
        from scrapy_openclaw.deadletter import for_request

        try:
            request = self._decode(payload)
        except SerializationError as exc:
            logger.error(
                "Dropped a Redis queue entry (%(reason)s) that does not decode: %(error)s",
                {"reason": reason, "error": exc},
                extra={"spider": self.spider},
            )
            return
        request.meta.pop(M.LEASE, None)
        self.stats.inc_value(f"{STATS}/dead_letters/{reason}")
        if reason == "deadline_expired":
            self.stats.inc_value(f"{STATS}/deadline_dropped")
        logger.warning(
            "Giving up on %(request)s: %(reason)s",
            {"request": request, "reason": reason},
            extra={"spider": self.spider},
        )
        letter = for_request(
            request, spider=self.spider, crawl_id=crawl_id(self.crawler), error_class=error_class, reason=reason
        )
        self.crawler.signals.send_catch_log(signal=openclaw_signals.dead_letter, dead_letter=letter, spider=self.spider)

    def _reclaimed(self, n: int, dead: list[str]) -> None:
        self.stats.inc_value(f"{STATS}/leases_reclaimed", n)
        self.stats.inc_value(f"{STATS}/dead_workers", len(dead))
        logger.warning(
            "Worker(s) %(dead)s stopped answering; handed %(n)d of their leased requests back to the queue",
            {"dead": ", ".join(dead), "n": n},
            extra={"spider": self.spider},
        )

    def _requeued(self, n: int) -> None:
        self.stats.inc_value(f"{STATS}/lease_expired", n)
        logger.info(
            "Re-queued %(n)d requests whose lease expired (a worker died?)", {"n": n}, extra={"spider": self.spider}
        )
