"""A compact per-domain table in the crawl log, every ``LOGSTATS_INTERVAL``.

Scrapy's LogStats line says how the crawl does as a whole; this table says
which domains carry it and which are in trouble, for operators who read logs
rather than dashboards. Domains with a circuit that is not closed come first,
then the busiest ones. Health, rate and circuit are read from the
HealthRegistry when the table is written (shown as ``-`` without one).
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import TYPE_CHECKING, Any

from scrapy.utils.asyncio import create_looping_call

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Spider

logger = logging.getLogger(__name__)

HEADER = ("domain", "pages/min", "health", "rate/s", "retries", "circuit")


class DomainLogTable:
    """Counts pages and retries per domain and logs the top *rows* domains."""

    def __init__(self, *, rows: int, interval: float, health: Callable[[], Any]):
        self.rows = rows
        self.interval = interval
        self.health = health
        self._pages: Counter[str] = Counter()  # this interval only
        self._retries: Counter[str] = Counter()  # whole crawl
        self._loop: Any = None
        self._spider: Spider | None = None

    def count_page(self, domain: str) -> None:
        self._pages[domain] += 1

    def count_retry(self, domain: str) -> None:
        self._retries[domain] += 1

    def start(self, spider: Spider) -> None:
        self._spider = spider
        self._loop = create_looping_call(self.log)
        self._loop.start(self.interval, now=False)

    def stop(self) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None

    def log(self) -> None:
        pages, self._pages = self._pages, Counter()
        table = self.render(pages)
        if table:
            logger.info("%(table)s", {"table": table}, extra={"spider": self._spider})

    def render(self, pages: Counter[str]) -> str:
        """The table for one interval's page counts ('' when no domain is known yet)."""
        registry = self.health()
        known = set(pages) | set(self._retries)
        states: dict[str, Any] = {}
        if registry is not None:
            # Only domains the registry knows: state() of a new one would create it.
            states = {d: registry.state(d) for d in registry.domains()}
            known.update(states)
        if not known:
            return ""

        def rank(domain: str) -> tuple[int, int, str]:
            state = states.get(domain)
            troubled = state is not None and state.circuit != "closed"
            return (0 if troubled else 1, -pages[domain], domain)

        top = sorted(known, key=rank)[: self.rows]
        per_minute = 60.0 / self.interval
        rows = [HEADER]
        for domain in top:
            state = states.get(domain)
            rows.append(
                (
                    domain,
                    f"{pages[domain] * per_minute:.1f}",
                    f"{state.health:.0f}" if state is not None else "-",
                    f"{state.rate:.2f}" if state is not None else "-",
                    str(self._retries[domain]),
                    str(state.circuit) if state is not None else "-",
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
        lines = [
            "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
            for row in rows
        ]
        title = f"OpenClaw domains (top {len(top)} of {len(known)}, last {self.interval:g} s):"
        return "\n".join([title, *lines])
