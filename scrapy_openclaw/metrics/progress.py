"""Crawl progress: requests discovered and pending by state, overall and per domain.

:func:`crawl_progress` reads it from the engine, the scheduler's queue and the
downloader (the log table prints it, the metrics extension serves it);
:class:`ProgressCollector` turns it into the ``scrapy_openclaw_progress_*``
Prometheus families at each scrape.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy_openclaw.metrics.collector import PREFIX, by_label, on_reactor_thread
from scrapy_openclaw.metrics.figures import CrawlFigures
from scrapy_openclaw.metrics.logtable import Progress
from scrapy_openclaw.pqueues import queue_state as deadline_queue_state
from scrapy_openclaw.runtime import peek
from scrapy_openclaw.scrapy_internals import downloader_activity, engine_of, scheduler_of, slot_key

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric
    from scrapy.crawler import Crawler


def crawl_progress(crawler: Crawler, figures: CrawlFigures | None = None) -> Progress | None:
    """Requests pending by state, overall and per domain, and discovered (done, from *figures*,
    plus pending: each request once, whatever its retries); None before the crawl runs."""
    engine = engine_of(crawler)
    scheduler = scheduler_of(engine)
    activity = downloader_activity(engine)
    if scheduler is None or activity is None:
        return None
    in_flight, active = activity
    domains: dict[str, int] = dict(active)
    distributed = peek(crawler, "distributed_queue")
    if distributed is not None:  # the leased Redis queue: the whole crawl's figures
        return distributed.progress(domains)
    due_at: dict[str, float] = {}
    if peek(crawler, "queues"):  # the DeadlinePriorityQueue: ready and delayed per domain
        state = deadline_queue_state(crawler)
        queued, waiting = int(state["ready"]), int(state["delayed"])
        for domain, n in state["domains"].items():
            domains[domain] = domains.get(domain, 0) + int(n)
        for queue in peek(crawler, "queues") or ():  # delayed ones (retries), per domain
            for due, request in queue.delayed_requests():
                domain = slot_key(crawler, request)
                domains[domain] = domains.get(domain, 0) + 1
                due_at[domain] = min(due_at.get(domain, due), due)
    else:
        delayed = peek(crawler, "delayed")
        waiting = len(delayed) if delayed is not None and getattr(delayed, "active", False) else 0
        queued = len(scheduler) if hasattr(scheduler, "__len__") else 0
    left = peek(crawler, "left_at_close")  # (the queue closed: what it held then, kept in a JOBDIR)
    if left:
        queued += sum(left.values())
        for domain, n in left.items():
            domains[domain] = domains.get(domain, 0) + n
    figures = figures or CrawlFigures.for_crawler(crawler)
    discovered = figures.total().done + queued + waiting + in_flight
    return Progress(discovered, queued, waiting, in_flight, domains, due_at)


class ProgressCollector:
    """``scrapy_openclaw_progress_*``: the log's progress figures, read per scrape."""

    def __init__(self, ext: Any):
        self.ext = ext

    def collect(self) -> list[Metric]:
        return on_reactor_thread(self.families)

    def families(self) -> list[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        spider = self.ext._spider_name
        requests = GaugeMetricFamily(
            f"{PREFIX}_progress_requests",
            "Requests by progress state: discovered, done, pending, queued, waiting (retry or not-before "
            "time), in_flight.",
            labels=["spider", "state"],
        )
        rate = GaugeMetricFamily(
            f"{PREFIX}_progress_rate", "Requests done per second over the last LOGSTATS_INTERVAL.", labels=["spider"]
        )
        domains = GaugeMetricFamily(
            f"{PREFIX}_progress_domain_pending_requests",
            "Requests pending per domain (queued, waiting or in the download slot).",
            labels=["spider", "domain"],
        )
        progress = self.ext.progress() if self.ext._spider_name else None
        if progress is None:
            return [requests, rate, domains]
        for state in ("discovered", "done", "pending", "queued", "waiting", "in_flight"):
            requests.add_metric([spider, state], getattr(progress, state))
        table = self.ext.logtable
        rate.add_metric([spider], table.rate if table is not None else 0.0)
        for label, n in by_label(self.ext.labels, progress.domains.items()):
            domains.add_metric([spider, label], n)
        return [requests, rate, domains]
