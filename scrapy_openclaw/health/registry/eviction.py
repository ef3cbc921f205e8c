"""Which idle domains the registry may forget, and what one known domain costs in memory.

A broad crawl meets domains once, and their state need not outlive
``OPENCLAW_HEALTH_IDLE_TTL`` of quiet.
"""

from __future__ import annotations

import sys
from collections.abc import Container
from typing import TYPE_CHECKING, Any

from scrapy_openclaw.health.registry.tuning import CLOSED

if TYPE_CHECKING:
    from scrapy_openclaw.health.registry.record import _Domain


def idle_domains(
    domains: dict[str, _Domain], now: float, idle_ttl: float, keep: Container[str], given_up: Container[str]
) -> list[str]:
    """The domains not in *keep* with nothing heard (an answer, a failure, first sight) for
    *idle_ttl* seconds, whose state need not outlive idleness (see :func:`outlives_idleness`)."""
    cutoff = now - idle_ttl
    return [
        name
        for name, d in domains.items()
        if max(d.born, d.answered_at, d.troubled_at) < cutoff
        and name not in keep
        and not outlives_idleness(d, now, given_up=name in given_up)
    ]


def outlives_idleness(d: _Domain, now: float, *, given_up: bool) -> bool:
    """A hold or an open or half-open circuit (until it ends), a give-up, an operator override,
    a Crawl-delay (robots.txt is read once per crawl): state that must not be forgotten."""
    return bool(
        d.circuit != CLOSED
        or d.hold_until > now
        or d.ctl_hold > now
        or d.ctl_down
        or d.ctl_rate > 0
        or d.ctl_concurrency > 0
        or d.crawl_delay > 0
        or given_up
    )


def bytes_per_domain(domains: dict[str, _Domain], histories: dict[str, Any], sample: int = 50) -> float:
    """An estimate (``sys.getsizeof`` of a few records, their fields and dict entries) of the
    memory one known domain costs (its record and its history for the limit fit); 0.0 with none."""
    if not domains:
        return 0.0
    return _sampled_bytes(domains, sample) + _sampled_bytes(histories, sample) * len(histories) / len(domains)


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
