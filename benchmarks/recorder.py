"""A Scrapy extension for benchmark runs only: a time series of every domain's state.

Every ``BENCH_RECORDER_INTERVAL`` seconds (default 0.5) it appends one JSON
line to ``BENCH_RECORDER_PATH``: per domain (download-slot key) the requests
handed to the download slot (``sent``), the downloads finished, answered or
failed (``done``, what the server saw), and the raw responses by status
before any middleware (so retried 429s count) so far, and, when scrapy-openclaw's health
middleware is part of the crawl, the HealthRegistry's view (health, rate,
tokens, concurrency, circuit, hold). The plot (:mod:`benchmarks.plot`) turns
this into "health and request rate over time", so a reader sees the
controller adapt; plain Scrapy runs record the same counters without health.

The settings are deliberately *not* ``OPENCLAW_*`` (the add-on validates
those and rejects names it does not know). Enable it with
:func:`benchmarks.suite.with_recorder`, or by hand::

    EXTENSIONS = {"benchmarks.recorder.BenchRecorder": 900}
    BENCH_RECORDER_PATH = "/tmp/run.jsonl"

Lines: first ``{"event": "start", "t": ..., "health": bool}``, then samples
``{"t": ..., "elapsed": ..., "domains": {domain: {...}}}``, the last one
written when the spider closes (with ``"final": true``). Each line is flushed
at once, so a killed crawl leaves everything up to its last sample.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import NotConfigured
from scrapy.utils.asyncio import create_looping_call

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response

logger = logging.getLogger(__name__)

PATH_SETTING = "BENCH_RECORDER_PATH"
INTERVAL_SETTING = "BENCH_RECORDER_INTERVAL"
DEFAULT_INTERVAL = 0.5
EXTENSION_PATH = "benchmarks.recorder.BenchRecorder"
EXTENSION_ORDER = 900


class BenchRecorder:
    """Samples per-domain counters and HealthRegistry state into a JSONL file."""

    def __init__(self, crawler: Crawler, path: str, interval: float):
        self.crawler = crawler
        self.path = Path(path)
        self.interval = interval
        self.sent: Counter[str] = Counter()
        self.done: Counter[str] = Counter()
        self.statuses: defaultdict[str, Counter[int]] = defaultdict(Counter)
        self._registry: Any = None
        self._file: Any = None
        self._loop: Any = None
        self._t0 = 0.0

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> BenchRecorder:
        path = crawler.settings.get(PATH_SETTING)
        if not path:
            raise NotConfigured
        interval = crawler.settings.getfloat(INTERVAL_SETTING, DEFAULT_INTERVAL)
        if interval <= 0:
            raise NotConfigured(f"{INTERVAL_SETTING} must be > 0, got {interval}")
        ext = cls(crawler, path, interval)
        crawler.signals.connect(ext.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(ext.spider_closed, signal=signals.spider_closed)
        crawler.signals.connect(ext.request_reached_downloader, signal=signals.request_reached_downloader)
        crawler.signals.connect(ext.request_left_downloader, signal=signals.request_left_downloader)
        crawler.signals.connect(ext.response_downloaded, signal=signals.response_downloaded)
        return ext

    # --- signals --------------------------------------------------------------

    def spider_opened(self, spider: Any = None) -> None:
        self._registry = self._health_registry()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")  # (closed in spider_closed)
        self._t0 = time.time()
        self._write({"event": "start", "t": self._t0, "health": self._registry is not None})
        self._loop = create_looping_call(self.sample)
        self._loop.start(self.interval, now=True)

    def spider_closed(self, spider: Any = None, reason: str = "") -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None
        if self._file is not None:
            self.sample(final=True)
            self._file.close()
            self._file = None

    def request_reached_downloader(self, request: Request, spider: Any = None) -> None:
        self.sent[self._domain(request)] += 1

    def request_left_downloader(self, request: Request, spider: Any = None) -> None:
        self.done[self._domain(request)] += 1

    def response_downloaded(self, response: Response, request: Request, spider: Any = None) -> None:
        self.statuses[self._domain(request)][response.status] += 1

    # --- sampling -------------------------------------------------------------

    def sample(self, final: bool = False) -> None:
        now = time.time()
        domains: dict[str, dict[str, Any]] = {}
        known = set(self.sent) | set(self.statuses)
        states = {}
        if self._registry is not None:
            # Only domains the registry knows: state() of a new one would create it.
            states = {d: self._registry.state(d, now) for d in self._registry.domains()}
            known |= set(states)
        for domain in sorted(known):
            statuses = self.statuses.get(domain, Counter())
            entry: dict[str, Any] = {
                "sent": self.sent.get(domain, 0),
                "done": self.done.get(domain, 0),
                "responses": sum(statuses.values()),
                "status": {str(k): v for k, v in sorted(statuses.items())},
            }
            state = states.get(domain)
            if state is not None:
                entry.update(
                    health=round(state.health, 2),
                    rate=round(state.rate, 3),
                    tokens=round(state.tokens, 2),
                    burst=state.burst,
                    concurrency=state.concurrency,
                    circuit=state.circuit,
                    latency=None if state.latency is None else round(state.latency, 4),
                    hold=round(max(0.0, state.hold_until - now), 3),
                )
            domains[domain] = entry
        line: dict[str, Any] = {"t": round(now, 3), "elapsed": round(now - self._t0, 3), "domains": domains}
        if final:
            line["final"] = True
        self._write(line)

    def _write(self, data: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json.dumps(data, sort_keys=True) + "\n")
            self._file.flush()

    def _domain(self, request: Request) -> str:
        engine = self.crawler.engine
        return engine.downloader.get_slot_key(request) if engine is not None else ""

    def _health_registry(self) -> Any | None:
        """The crawl's HealthRegistry when the health middleware runs in it, else None.

        A plain Scrapy run must not grow a registry just because we looked.
        """
        engine = self.crawler.engine
        if engine is None:
            return None
        try:
            from scrapy_openclaw.health import DomainHealthMiddleware, HealthRegistry
        except ImportError:
            return None
        middlewares = engine.downloader.middleware.middlewares
        if not any(isinstance(mw, DomainHealthMiddleware) for mw in middlewares):
            return None
        return HealthRegistry.for_crawler(self.crawler)
