"""Downloads under way per domain, as the queue must count them: in the slot, and handed out on the way to it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy_openclaw.runtime import shared
from scrapy_openclaw.scrapy_internals import engine_of, new_slot_concurrency

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler


class HandedOut:
    """Requests popped from a queue and not yet in their download slot, by domain: one per
    crawl (with ``JOBDIR`` Scrapy's memory and disk queues feed the same slots), with the
    size at which the domains nobody looks at again are swept."""

    __slots__ = ("by_domain", "prune_at")

    def __init__(self) -> None:
        self.by_domain: dict[str, set[Request]] = {}
        self.prune_at = 64


class Downloads:
    """How many downloads of a domain are under way, and whether its slot has room for one more.

    Scrapy puts a request in ``slot.active`` only after the downloader
    middlewares, a loop turn after the queue handed it out. Counting only the
    slot, one engine loop could hand one domain every free
    ``CONCURRENT_REQUESTS`` place at once, past the slot's concurrency, and
    each download past the connection pool's ``CONCURRENT_REQUESTS_PER_DOMAIN``
    would open a new TCP connection. So requests handed out are counted too,
    until they reach the slot or leave the downloader.
    """

    def __init__(self, crawler: Crawler):
        self.crawler = crawler
        self._downloader: Any | None = None
        self._handed = shared(crawler, "queue_handed_out", HandedOut)

    def downloader(self) -> Any | None:
        """The engine's downloader (None before the crawl starts, e.g. in unit tests)."""
        if self._downloader is None:
            self._downloader = getattr(engine_of(self.crawler), "downloader", None)
        return self._downloader

    def busy(self, domain: str) -> int:
        """Downloads of *domain* under way: in its download slot, and handed out on the way to it."""
        downloader = self.downloader()
        return self._in_flight(domain, downloader.slots.get(domain) if downloader is not None else None)

    def has_room(self, domain: str) -> bool:
        """Fewer downloads of *domain* under way than its slot's concurrency (which the health
        middleware keeps scaled by the domain's health; before the slot exists, the one Scrapy
        will give it: several requests may be handed out before the first reaches the slot).
        Always, before the crawl has a downloader."""
        downloader = self.downloader()
        if downloader is None:
            return True
        slot = downloader.slots.get(domain)
        concurrency = slot.concurrency if slot is not None else new_slot_concurrency(downloader, domain)
        return self._in_flight(domain, slot) < concurrency

    def active_domains(self) -> set[str]:
        """The domains whose download slot has a download under way now."""
        downloader = self.downloader()
        if downloader is None:
            return set()
        return {name for name, slot in downloader.slots.items() if slot.active}

    def handed_out(self, domain: str, request: Request) -> None:
        """Count a request just popped until it reaches its download slot (or leaves the downloader)."""
        by_domain = self._handed.by_domain
        by_domain.setdefault(domain, set()).add(request)
        if len(by_domain) > self._handed.prune_at:  # (domains never looked at again: amortised O(1))
            downloader = self.downloader()
            for name, handed in list(by_domain.items()):
                self._prune(name, handed, downloader.slots.get(name) if downloader is not None else None)
            self._handed.prune_at = max(64, 2 * len(by_domain))

    def _in_flight(self, domain: str, slot: Any | None) -> int:
        busy = len(slot.active) if slot is not None else 0
        handed = self._handed.by_domain.get(domain)
        if handed:
            self._prune(domain, handed, slot)
            busy += len(handed)
        return busy

    def _prune(self, domain: str, handed: set[Request], slot: Any | None) -> None:
        downloader = self.downloader()
        in_downloader = downloader.active if downloader is not None else ()
        in_slot = slot.active if slot is not None else ()
        gone = [r for r in handed if r not in in_downloader or r in in_slot]
        handed.difference_update(gone)
        if not handed:
            del self._handed.by_domain[domain]
