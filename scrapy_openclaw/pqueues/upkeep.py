"""Memory upkeep: letting the health registry forget idle domains, and the size estimates as stats.

Every minute (or a quarter of ``OPENCLAW_HEALTH_IDLE_TTL``) the queue sweeps
the registry, keeping domains with requests here or downloads in flight, and
sets ``openclaw/health/{domains,evicted,bytes_per_domain}`` and
``openclaw/queue/{domains,bytes_per_request}``.
"""

from __future__ import annotations

import itertools
import math
import sys
from typing import Any

from scrapy_openclaw.pqueues.domains import DomainQueues
from scrapy_openclaw.runtime import shared

#: Seconds between two sweeps for idle domains in the health registry (as Scrapy's downloader
#: collects idle slots every 60 s; a quarter of OPENCLAW_HEALTH_IDLE_TTL if that is shorter).
EVICT_EVERY = 60.0


class Upkeep(DomainQueues):
    """Part of DeadlinePriorityQueue: idle-domain sweeps and memory figures."""

    def _sweep_idle(self, now: float) -> None:
        """Let the health registry forget idle domains: all but those pending in any of the
        crawl's queues or downloading now (see ``HealthRegistry.evict_idle``)."""
        registry = self.registry
        if registry is None or not registry.idle_ttl:
            self._next_sweep = math.inf
            return
        self._next_sweep = now + min(EVICT_EVERY, registry.idle_ttl / 4)
        keep: set[str] = set()
        queues: list[DomainQueues] = shared(self.crawler, "queues", list)
        for queue in queues:
            keep.update(queue._domains)
            keep.update(queue._domain_of(r) for _, _, r in queue._delayed)
        downloader = self._downloader()
        if downloader is not None:
            keep.update(name for name, slot in downloader.slots.items() if slot.active)
        evicted = registry.evict_idle(now, keep)
        if evicted:
            self.stats.inc_value("openclaw/health/evicted", len(evicted))
        self._report_memory()

    def _report_memory(self, *args: Any, **kwargs: Any) -> None:
        """Known domains and estimated bytes per domain (registry) and per pending request (the
        queue's own structures, not the requests) as stats."""
        stats = self.stats
        stats.set_value("openclaw/queue/domains", len(self._domains))
        if self._count:  # (the last figure with requests pending stays)
            stats.set_value("openclaw/queue/bytes_per_request", round(self.overhead_bytes() / self._count, 1))
        if self.registry is not None:
            stats.set_value("openclaw/health/domains", len(self.registry.domains()))
            stats.set_value("openclaw/health/bytes_per_domain", round(self.registry.bytes_per_domain(), 1))

    def overhead_bytes(self, sample: int = 50) -> float:
        """An estimate (``sys.getsizeof``) of the queue's own structures: per-domain queues from a
        sample, the cross-domain index and the per-request slots in them."""
        if not self._domains:
            return 0.0
        per_domain, n = 0, 0
        for dq in itertools.islice(self._domains.values(), sample):
            n += 1
            per_domain += sys.getsizeof(dq) + sys.getsizeof(dq.buckets) + sys.getsizeof(dq.prios)
            per_domain += sum(sys.getsizeof(b) for b in dq.buckets.values()) + sys.getsizeof(dq.aging)
            per_domain += sys.getsizeof(dq.entries) if dq.entries is not None else 0
        entry_bytes = 0
        if self._index.buckets:
            entry_bytes = sys.getsizeof(self._index.buckets[0]) + 8  # a tuple and its heap slot
        entries = self._index.entries_total() * entry_bytes
        timed = 0
        if self._expiry:  # a deadline request: its Timed, the expiry and aging tuples, their floats
            deadline, _, entry = self._expiry[0]
            timed = len(self._expiry) * (
                sys.getsizeof(entry) + 2 * (sys.getsizeof(self._expiry[0]) + 8) + 2 * sys.getsizeof(deadline)
            )
        return per_domain / n * len(self._domains) + entries + timed
