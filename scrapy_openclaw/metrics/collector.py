"""A Prometheus collector that reads the crawl's owners at scrape time.

Per-domain health, queue depth and in-flight downloads belong to other components
(the HealthRegistry, the scheduler's queue, Scrapy's downloader); this collector
asks them when Prometheus scrapes instead of keeping a copy that could drift. The
request figures are served by :class:`~scrapy_openclaw.metrics.families.FiguresCollector`.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from scrapy_openclaw.errors import ErrorClass
from scrapy_openclaw.health.reader import HealthReader, health_registry
from scrapy_openclaw.health.registry.record import effective_rate as effective_rate
from scrapy_openclaw.metrics.figures import status_class as status_class
from scrapy_openclaw.pqueues import queue_state as deadline_queue_state
from scrapy_openclaw.runtime import peek
from scrapy_openclaw.scrapy_internals import downloader_activity, scheduler_of

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

PREFIX = "scrapy_openclaw"
OTHER = "other"

#: The CheckpointExtension's stats keys behind the checkpoint metrics:
#: metric name suffix -> (metric type, stats key).
CHECKPOINT_KEYS: dict[str, tuple[str, str]] = {
    "checkpoint_last_duration_seconds": ("gauge", "openclaw/checkpoint/snapshot_seconds"),
    "checkpoint_last_size_bytes": ("gauge", "openclaw/checkpoint/snapshot_bytes"),
    "checkpoint_snapshots": ("counter", "openclaw/checkpoint/snapshots"),
    "checkpoint_journal_records": ("counter", "openclaw/checkpoint/journal_records"),
}

_RETRY_KEY = re.compile(r"^openclaw/retry/([a-z_]+)/(count|max_reached)$")
_RETRY_REASON_PREFIX = "openclaw/retry/reason_count/"
_RETRY_DELAY_PREFIX = "openclaw/retry/delay_le/"
_RETRY_CLASSES = frozenset(c.value for c in ErrorClass)
_CIRCUIT_STATES = ("closed", "half_open", "open")
_BAN_DOMAIN_PREFIX = "openclaw/ban/domain/"
_SCRAPE_TIMEOUT = 10.0  # seconds a scrape waits for the reactor thread


class DomainLabels:
    """Bounds the ``domain`` label: the first *limit* domains seen, then ``other``.

    Assignment is first come, first served and never changes during a crawl,
    so a domain's counters never jump from one series to another.
    """

    def __init__(self, limit: int):
        self.limit = max(0, int(limit))
        self._tracked: dict[str, str] = {}

    def __call__(self, domain: str | None) -> str:
        domain = domain or ""
        label = self._tracked.get(domain)
        if label is not None:
            return label
        if len(self._tracked) < self.limit and domain != OTHER:
            self._tracked[domain] = domain
            return domain
        return OTHER

    def tracked(self) -> list[str]:
        return list(self._tracked)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


_FOLDS: dict[str, Callable[[list[float]], float]] = {"sum": sum, "mean": _mean, "max": max}


def by_label(
    labels: Callable[[str], str], values: Iterable[tuple[str, float]], how: str = "sum"
) -> list[tuple[str, float]]:
    """Per-domain *values* folded into their ``domain`` labels (``other`` gathers the
    untracked ones) by *how*: ``sum``, ``mean`` or ``max``; sorted by label."""
    groups: dict[str, list[float]] = defaultdict(list)
    for domain, value in values:
        groups[labels(domain)].append(float(value))
    fold = _FOLDS[how]
    return [(label, fold(group)) for label, group in sorted(groups.items())]


def on_reactor_thread(func: Callable[[], Any], timeout: float = _SCRAPE_TIMEOUT) -> Any:
    """Run *func* on the reactor thread and return its result (bounded wait)."""
    from twisted.python import threadable

    if threadable.isInIOThread() or threadable.ioThread is None:
        return func()
    from twisted.internet import reactor

    done = threading.Event()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = func()
        except BaseException as exc:  # handed back to the scraping thread
            box["error"] = exc
        finally:
            done.set()

    reactor.callFromThread(run)  # type: ignore[attr-defined]
    if not done.wait(timeout):
        raise TimeoutError(f"the reactor did not answer a metrics scrape within {timeout:.0f} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


class OpenClawCollector:
    """Gauges and counters whose values another component owns, read per scrape.

    What it reads: ``crawler.stats`` (``item_scraped_count``, ``item_dropped_count``,
    ``openclaw/retry/<class>/count`` and ``.../max_reached``, the :data:`CHECKPOINT_KEYS`);
    :func:`~scrapy_openclaw.health.reader.health_registry` (``domains()``, ``state(domain)``),
    when the health middleware runs; the engine's scheduler
    (:func:`~scrapy_openclaw.scrapy_internals.scheduler_of`) and its ``len()``, with the
    DeadlinePriorityQueue's :func:`~scrapy_openclaw.pqueues.queue_state` (ready, delayed,
    expired, per domain) or else the :class:`~scrapy_openclaw.delay.DelayedRequests`
    fallback's ``len()``; the downloader's active requests, overall and per slot
    (:func:`~scrapy_openclaw.scrapy_internals.downloader_activity`). Prometheus' Twisted
    resource renders in a thread-pool thread, so :meth:`collect` hands the reading to the
    reactor thread (bounded wait): the crawl's dicts are only read where they are written.
    """

    def __init__(self, crawler: Crawler, labels: DomainLabels, spider_name: Callable[[], str]):
        self.crawler = crawler
        self.labels = labels
        self.spider_name = spider_name
        self.stats = crawler.stats
        #: Set by the extension at spider_opened (``crawler.engine`` raises before).
        self.engine: Any = None
        self._failed_sources: set[str] = set()
        self._health: HealthReader | None = None
        self._health_resolved = False

    def collect(self) -> Iterable[Metric]:
        return on_reactor_thread(self.families)

    def health(self) -> HealthReader | None:
        """The health registry (resolved once, lazily: it may be created after us)."""
        if not self._health_resolved:
            self._health = health_registry(self.crawler)
            self._health_resolved = True
        return self._health

    # ------------------------------------------------------------------ families

    def families(self) -> list[Metric]:
        """Read every source now (call on the reactor thread)."""
        spider = self.spider_name()
        families: list[Metric] = []
        for name, source in (
            ("stats", self._stats_families),
            ("health", self._health_families),
            ("queue", self._queue_families),
            ("downloader", self._downloader_families),
            ("ban", self._ban_families),
        ):
            try:
                families.extend(source(spider))
            except Exception:
                # One broken source must not blank the whole endpoint; say so once.
                if name not in self._failed_sources:
                    self._failed_sources.add(name)
                    logger.warning(
                        "Metrics: reading %(source)s failed; its metrics are left out",
                        {"source": name},
                        exc_info=True,
                    )
        return families

    def _stats_families(self, spider: str) -> list[Metric]:
        items = CounterMetricFamily(
            f"{PREFIX}_items_scraped", "Items scraped (Scrapy's item_scraped_count).", labels=["spider"]
        )
        dropped = CounterMetricFamily(
            f"{PREFIX}_items_dropped", "Items dropped by pipelines (item_dropped_count).", labels=["spider"]
        )
        retries = CounterMetricFamily(
            f"{PREFIX}_retry_retries",
            "Retries scheduled, by error class (openclaw/retry/<class>/count).",
            labels=["spider", "error_class"],
        )
        gave_up = CounterMetricFamily(
            f"{PREFIX}_retry_gave_up",
            "Requests whose retry budget was spent, by error class (openclaw/retry/<class>/max_reached).",
            labels=["spider", "error_class"],
        )
        reasons = CounterMetricFamily(
            f"{PREFIX}_retry_reasons",
            "Retries scheduled, by reason (http_503, timeout, ...; openclaw/retry/reason_count/<reason>).",
            labels=["spider", "reason"],
        )
        checkpoint: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
        for suffix, (kind, key) in CHECKPOINT_KEYS.items():
            cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            checkpoint[suffix] = cls(f"{PREFIX}_{suffix}", f"Checkpoint stats: {key}.", labels=["spider"])
        result: list[Metric] = [items, dropped, retries, gave_up, reasons, *checkpoint.values()]
        stats = self.stats.get_stats()
        items.add_metric([spider], _number(stats.get("item_scraped_count")))
        dropped.add_metric([spider], _number(stats.get("item_dropped_count")))
        for key, value in stats.items():
            if not isinstance(key, str):
                continue
            if key.startswith(_RETRY_REASON_PREFIX):
                reasons.add_metric([spider, key[len(_RETRY_REASON_PREFIX) :]], _number(value))
                continue
            match = _RETRY_KEY.match(key)
            if match is None or match.group(1) not in _RETRY_CLASSES:
                continue
            family = retries if match.group(2) == "count" else gave_up
            family.add_metric([spider, match.group(1)], _number(value))
        for suffix, (_, key) in CHECKPOINT_KEYS.items():
            if isinstance(stats.get(key), (int, float)):
                checkpoint[suffix].add_metric([spider], float(stats[key]))
        delay = _retry_delay_histogram(stats, spider)
        if delay is not None:
            result.append(delay)
        return result

    def _health_families(self, spider: str) -> list[Metric]:
        labels = ["spider", "domain"]
        score = GaugeMetricFamily(
            f"{PREFIX}_health_score",
            'Domain health 0..100 (domain="other": mean of the untracked domains).',
            labels=labels,
        )
        rate = GaugeMetricFamily(
            f"{PREFIX}_health_rate_requests_per_second",
            'Requests per second the domain may get now ("other": sum).',
            labels=labels,
        )
        concurrency = GaugeMetricFamily(
            f"{PREFIX}_health_concurrency",
            'Concurrent downloads the domain may get now ("other": sum).',
            labels=labels,
        )
        latency = GaugeMetricFamily(
            f"{PREFIX}_health_latency_ewma_seconds",
            'Moving average of the domain\'s response latency ("other": mean).',
            labels=labels,
        )
        hold = GaugeMetricFamily(
            f"{PREFIX}_health_hold_remaining_seconds",
            'Seconds left of a Retry-After hold on the domain ("other": max).',
            labels=labels,
        )
        circuit = GaugeMetricFamily(
            f"{PREFIX}_health_circuit_state",
            'Domains whose circuit is in this state (1/0 for a tracked domain; a count for "other").',
            labels=[*labels, "state"],
        )
        domains = GaugeMetricFamily(
            f"{PREFIX}_health_domains", "Domains known to the health registry.", labels=["spider"]
        )
        result: list[Metric] = [score, rate, concurrency, latency, hold, circuit, domains]
        registry = self.health()
        if registry is None:
            return result
        now = time.time()
        names = registry.domains()
        states = [(domain, registry.state(domain)) for domain in names]
        domains.add_metric([spider], len(names))
        for family, how, read in (
            (score, "mean", lambda s: s.health),
            (rate, "sum", effective_rate),
            (concurrency, "sum", lambda s: s.concurrency),
            (latency, "mean", lambda s: s.latency),
            (hold, "max", lambda s: max(0.0, float(s.hold_until or 0) - now)),
        ):
            values = [(d, read(s)) for d, s in states if read(s) is not None]
            for label, value in by_label(self.labels, values, how):
                family.add_metric([spider, label], value)
        for state in _CIRCUIT_STATES:
            values = [(d, 1.0 if s.circuit == state else 0.0) for d, s in states]
            for label, value in by_label(self.labels, values):
                circuit.add_metric([spider, label, state], value)
        return result

    def _ban_families(self, spider: str) -> list[Metric]:
        """Ban pages per domain (BanDetectionMiddleware's ``openclaw/ban/domain/<domain>``) and
        domains given up (the health middleware's ``openclaw/health/given_up_domains``)."""
        blocked = CounterMetricFamily(
            f"{PREFIX}_ban_blocked_responses",
            "Ban or challenge pages recognised before the callback (error class blocked).",
            labels=["spider", "domain"],
        )
        given_up = GaugeMetricFamily(
            f"{PREFIX}_health_given_up_domains",
            "Domains given up for the rest of the crawl (down past give_up_after).",
            labels=["spider"],
        )
        stats = self.stats.get_stats()
        counts = [
            (key[len(_BAN_DOMAIN_PREFIX) :], _number(value))
            for key, value in stats.items()
            if isinstance(key, str) and key.startswith(_BAN_DOMAIN_PREFIX)
        ]
        for label, total in by_label(self.labels, counts):
            blocked.add_metric([spider, label], total)
        given_up.add_metric([spider], _number(stats.get("openclaw/health/given_up_domains")))
        return [blocked, given_up]

    def _queue_families(self, spider: str) -> list[Metric]:
        pending = GaugeMetricFamily(
            f"{PREFIX}_scheduler_pending_requests",
            "Requests in the scheduler (len(scheduler)), delayed ones included.",
            labels=["spider"],
        )
        by_state = GaugeMetricFamily(
            f"{PREFIX}_queue_requests",
            "Requests waiting by state: ready, delayed (not-before in the future).",
            labels=["spider", "state"],
        )
        expired = CounterMetricFamily(
            f"{PREFIX}_queue_expired_requests",
            "Requests whose deadline passed in the queue (boosted or dropped per policy).",
            labels=["spider"],
        )
        by_domain = GaugeMetricFamily(
            f"{PREFIX}_queue_domain_pending_requests",
            "Requests pending in the queue per domain.",
            labels=["spider", "domain"],
        )
        result = [pending, by_state, expired, by_domain]
        scheduler = scheduler_of(self.engine)
        if scheduler is None:
            return result
        if hasattr(scheduler, "__len__"):
            pending.add_metric([spider], len(scheduler))
        if peek(self.crawler, "queues"):  # the DeadlinePriorityQueue registers itself
            state = deadline_queue_state(self.crawler)
            for name in ("ready", "delayed"):
                by_state.add_metric([spider, name], state[name])
            expired.add_metric([spider], state["expired"])
            for label, value in by_label(self.labels, state["domains"].items()):
                by_domain.add_metric([spider, label], value)
            return result
        # Any other queue: delayed requests wait in the DelayedRequests fallback,
        # outside the scheduler, so the scheduler's length is what is ready.
        delayed = peek(self.crawler, "delayed")
        if hasattr(scheduler, "__len__"):
            by_state.add_metric([spider, "ready"], len(scheduler))
        if delayed is not None and getattr(delayed, "active", False):
            by_state.add_metric([spider, "delayed"], len(delayed))
        return result

    def _downloader_families(self, spider: str) -> list[Metric]:
        active = GaugeMetricFamily(
            f"{PREFIX}_downloader_active_requests",
            "Requests in the downloader (middlewares included), Scrapy's downloader.active.",
            labels=["spider"],
        )
        by_domain = GaugeMetricFamily(
            f"{PREFIX}_downloader_domain_active_requests",
            "Requests in a domain's download slot (queued for the slot or transferring).",
            labels=["spider", "domain"],
        )
        result: list[Metric] = [active, by_domain]
        activity = downloader_activity(self.engine)
        if activity is None:
            return result
        in_flight, per_slot = activity
        active.add_metric([spider], in_flight)
        for label, value in by_label(self.labels, per_slot.items()):
            by_domain.add_metric([spider, label], value)
        return result


def _retry_delay_histogram(stats: dict[str, Any], spider: str) -> Metric | None:
    """The retry middleware's cumulative ``delay_le/<bound>`` stats as a histogram."""
    if not isinstance(stats.get("openclaw/retry/delay_count"), (int, float)):
        return None
    buckets: dict[float, float] = {}
    for key, value in stats.items():
        if isinstance(key, str) and key.startswith(_RETRY_DELAY_PREFIX):
            bound = key[len(_RETRY_DELAY_PREFIX) :]
            try:
                buckets[float("inf") if bound == "inf" else float(bound)] = _number(value)
            except ValueError:
                continue
    count = _number(stats.get("openclaw/retry/delay_count"))
    buckets[float("inf")] = count
    histogram = HistogramMetricFamily(
        f"{PREFIX}_retry_delay_seconds",
        "Backoff delays given to retries (openclaw/retry/delay_le/<bound>).",
        labels=["spider"],
    )
    histogram.add_metric(
        [spider],
        [("+Inf" if b == float("inf") else f"{b:g}", v) for b, v in sorted(buckets.items())],
        sum_value=_number(stats.get("openclaw/retry/delay_seconds_total")),
    )
    return histogram


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0
