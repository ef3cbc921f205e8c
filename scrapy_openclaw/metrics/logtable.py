"""Progress and a compact per-domain table in the crawl log, every ``LOGSTATS_INTERVAL`` and at close.

Scrapy's LogStats line says how the crawl does as a whole; this says how far it
is, which domains carry it and which are in trouble, and what pending requests
wait for, for operators who read logs rather than dashboards (docs/monitoring.md).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scrapy.utils.asyncio import create_looping_call

from scrapy_openclaw.metrics.collector import effective_rate
from scrapy_openclaw.metrics.figures import DomainFigures

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Spider

    from scrapy_openclaw.metrics.figures import CrawlFigures

logger = logging.getLogger(__name__)

HEADER = (
    "domain",
    "pages/min",
    "health",
    "rate/s",
    "retries",
    "circuit",
    "held",
    "done",
    "pending",
    "failed",
    "dead",
    "ETA",
)


@dataclass
class Progress:
    """Where the crawl stands: requests discovered (accepted by the scheduler, retries not
    counted again), and pending ones by state; ``domains``: pending per domain."""

    discovered: int
    queued: int
    waiting: int
    in_flight: int
    domains: dict[str, int] = field(default_factory=dict)
    due_at: dict[str, float] = field(default_factory=dict)  # earliest not-before time (UNIX) per domain

    @property
    def pending(self) -> int:
        return self.queued + self.waiting + self.in_flight

    @property
    def done(self) -> int:
        return max(0, self.discovered - self.pending)


def eta(pending: int, per_second: float) -> str:
    """``12s``, ``4m05s``, ``2h10m``; ``-`` when nothing is pending, ``?`` at rate 0."""
    if pending <= 0:
        return "-"
    if per_second <= 0:
        return "?"
    seconds = int(round(pending / per_second))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class DomainLogTable:
    """Logs the progress line and the top *rows* domains; every count is read from *figures*."""

    def __init__(
        self,
        *,
        rows: int,
        interval: float,
        health: Callable[[], Any],
        figures: CrawlFigures,
        progress: Callable[[], Progress | None] = lambda: None,
        stats: Any = None,
    ):
        self.rows = rows
        self.interval = interval
        self.health = health
        self.figures = figures
        self.progress = progress
        self.stats = stats
        self._done_then: dict[str, int] = {}  # each domain's done at the last table
        self._requests_then = 0  # requests sent at the last progress line
        self._done_before: int | None = None
        self.rate = 0.0  # requests done per second over the last interval
        self._started = time.monotonic()
        self._loop: Any = None
        self._spider: Spider | None = None

    def _interval_done(self) -> Counter[str]:
        """Requests done per domain since the last table (and start a new interval)."""
        now = {domain: f.done for domain, f in self.figures.domains.items()}
        pages = Counter({d: n - self._done_then.get(d, 0) for d, n in now.items()})
        self._done_then = now
        return pages

    def start(self, spider: Spider) -> None:
        self._spider = spider
        self._loop = create_looping_call(self.log)
        self._loop.start(self.interval, now=False)

    def stop(self) -> None:
        """Stop the timer and log the whole crawl's progress and table."""
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None
        elapsed = max(time.monotonic() - self._started, 1e-9)
        self.figures.settle()
        progress = self.progress()
        if progress is not None:
            self._record(progress)
            logger.info(
                "OpenClaw progress at close: %(done)d done of %(found)d discovered, %(pending)d pending, "
                "%(rate).1f pages/min over the crawl (%(elapsed).0f s)",
                {
                    "done": progress.done,
                    "found": progress.discovered,
                    "pending": progress.pending,
                    "rate": progress.done * 60.0 / elapsed,
                    "elapsed": elapsed,
                },
                extra={"spider": self._spider},
            )
        whole = Counter({domain: f.done for domain, f in self.figures.domains.items()})
        table = self.render(whole, progress=progress, period=elapsed, title="whole crawl")
        if table:
            logger.info("%(table)s", {"table": table}, extra={"spider": self._spider})

    def log(self) -> None:
        pages = self._interval_done()
        requests = self.figures.total().requests
        sent, self._requests_then = requests - self._requests_then, requests
        self.figures.settle()
        progress = self.progress()
        if progress is not None:
            self._record(progress)
            logger.info("%(line)s", {"line": self.progress_line(progress, pages, sent)}, extra={"spider": self._spider})
        table = self.render(pages, progress=progress)
        if table:
            logger.info("%(table)s", {"table": table}, extra={"spider": self._spider})

    def _record(self, progress: Progress) -> None:
        if self.stats is not None:
            for name in ("discovered", "done", "pending", "queued", "waiting", "in_flight"):
                self.stats.set_value(f"openclaw/progress/{name}", getattr(progress, name))

    def progress_line(self, progress: Progress, pages: Counter[str], sent: int) -> str:
        """Done, pending (by state) of discovered, the rate over the last interval, ETA; what blocks."""
        done = progress.done
        before = self._done_before if self._done_before is not None else 0
        self._done_before = done
        per_second = self.rate = max(0, done - before) / self.interval
        share = f" ({100.0 * done / progress.discovered:.0f}%)" if progress.discovered else ""
        line = (
            f"OpenClaw progress: {done} done of {progress.discovered} discovered{share}, "
            f"{progress.pending} pending ({progress.queued} queued, {progress.waiting} waiting, "
            f"{progress.in_flight} in flight), {per_second * 60:.1f}/min over the last {self.interval:g} s, "
            f"ETA {eta(progress.pending, per_second)}"
        )
        if sent == 0 and progress.pending:
            line += "; nothing sent: " + self.waiting_for(progress)
        return line

    def waiting_for(self, progress: Progress) -> str:
        """Why pending requests are not sent: per domain with pending requests, its block."""
        registry = self.health()
        now = time.time()
        reasons = []
        for domain, n in sorted(progress.domains.items(), key=lambda kv: -kv[1]):
            if n <= 0:
                continue
            due = progress.due_at.get(domain)
            why = f"next retry due in {max(0.0, due - now):.0f} s" if due is not None else "a download slot"
            if registry is not None and domain in set(registry.domains()):
                state = registry.state(domain)
                blocked = registry.blocked_until(domain) - now
                if state.circuit == "open" and blocked > 0:
                    why = f"circuit open for {blocked:.0f} s"
                elif state.hold_until > now:
                    why = f"held for {state.hold_until - now:.0f} s (Retry-After)"
                elif blocked > 0:
                    why = f"held by the operator for {blocked:.0f} s"
                elif state.circuit == "half_open":
                    why = "a half-open probe"
            reasons.append(f"{n} request(s) wait for {domain}, {why}")
            if len(reasons) == 3:
                break
        return "; ".join(reasons) or f"{progress.pending} request(s) wait for their retry time"

    def render(
        self,
        pages: Counter[str],
        *,
        progress: Progress | None = None,
        period: float | None = None,
        title: str | None = None,
    ) -> str:
        """The table for one interval's page counts ('' when no domain is known yet)."""
        registry = self.health()
        period = self.interval if period is None else period
        pending = progress.domains if progress is not None else {}
        figures = self.figures.domains
        known = set(figures) | {d for d, n in pending.items() if n}
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
        per_minute = 60.0 / period
        rows = [HEADER]
        for domain in top:
            state = states.get(domain)
            f = figures.get(domain) or DomainFigures()
            rows.append(
                (
                    domain,
                    f"{pages[domain] * per_minute:.1f}",
                    f"{state.health:.0f}" if state is not None else "-",
                    f"{effective_rate(state):.2f}" if state is not None else "-",
                    str(f.retries),
                    str(state.circuit) if state is not None else "-",
                    f"{state.blocked_seconds:.0f}" if state is not None else "-",  # held or circuit open
                    str(f.done),
                    str(pending.get(domain, 0)),
                    str(f.failures),
                    str(f.dead),
                    eta(pending.get(domain, 0), pages[domain] / period),
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
        lines = [
            "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
            for row in rows
        ]
        title = f"OpenClaw domains (top {len(top)} of {len(known)}, {title or f'last {period:g} s'}):"
        return "\n".join([title, *lines])
