"""Forgetting idle domains, and what one known domain costs in memory.

A mixin of :class:`HealthRegistry`: a broad crawl meets domains once, and
their state need not outlive ``OPENCLAW_HEALTH_IDLE_TTL`` of quiet.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Container
from typing import TYPE_CHECKING, Any

from scrapy_openclaw.health.registry.core import _RegistryCore
from scrapy_openclaw.health.registry.tuning import CLOSED

if TYPE_CHECKING:
    from scrapy_openclaw.health.registry.record import _Domain


class _Eviction(_RegistryCore):
    """``evict_idle`` and ``bytes_per_domain``."""

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
            self._histories.pop(name, None)
        if len(gone) > len(self._domains):  # a dict never shrinks by itself
            self._domains = dict(self._domains)
            self._histories = dict(self._histories)
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
        memory one known domain costs here (its record and its history for the limit fit); 0.0
        with none known."""
        if not self._domains:
            return 0.0
        histories = _sampled_bytes(self._histories, sample) * len(self._histories) / len(self._domains)
        return _sampled_bytes(self._domains, sample) + histories


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
