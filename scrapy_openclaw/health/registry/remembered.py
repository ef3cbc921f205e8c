"""What an earlier crawl learned of each domain (site memory), for the registry to start it at."""

from __future__ import annotations

from typing import NamedTuple

from scrapy_openclaw.health.registry.tuning import _MAX_RATE


class Seed(NamedTuple):
    limit: float | None  # req/s the site took (None: not measured)
    burst: int  # the largest burst it allowed (0: not known)
    crawl_delay: float  # its robots.txt Crawl-delay (0.0: none)


class Remembered:
    """Per domain, the :class:`Seed` a domain is started at when first seen; a domain
    already seen keeps its state."""

    def __init__(self) -> None:
        self._seeds: dict[str, Seed] = {}

    def remember(self, domain: str, *, limit: float | None, burst: int = 0, crawl_delay: float = 0.0) -> None:
        """Start *domain* at its *limit* on the cubic's plateau instead of slow start, bursts no
        bigger than *burst*, spaced by *crawl_delay* before its robots.txt is back."""
        self._seeds[domain] = Seed(limit, int(burst), float(crawl_delay))

    def get(self, domain: str) -> Seed | None:
        return self._seeds.get(domain)

    def resumed_limit(self, domain: str) -> float | None:
        """The limit *domain* is started at (its remembered one), None without one: a domain
        whose limit still equals it was not measured again."""
        seed = self._seeds.get(domain)
        return None if seed is None or seed.limit is None else min(float(seed.limit), _MAX_RATE)

    def crawl_delay(self, domain: str) -> float:
        """The Crawl-delay *domain* is started with (0.0: none)."""
        seed = self._seeds.get(domain)
        return seed.crawl_delay if seed is not None else 0.0
