"""The per-domain request counters of ``/metrics``, read from :class:`~scrapy_openclaw.metrics.figures.CrawlFigures`
at each scrape, so they are the log table's and the politeness report's figures, not a second count."""

from __future__ import annotations

from operator import attrgetter
from typing import TYPE_CHECKING

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily

from scrapy_openclaw.metrics.collector import PREFIX, by_label, on_reactor_thread
from scrapy_openclaw.metrics.peaks import WINDOWS

if TYPE_CHECKING:
    from collections.abc import Callable

    from prometheus_client.metrics_core import Metric

    from scrapy_openclaw.metrics.figures import CrawlFigures, DomainFigures


class FiguresCollector:
    """``scrapy_openclaw_downloader_*``, ``retry_requests``, ``dlq_dead_letters``, ``health_circuit_openings``."""

    def __init__(self, figures: CrawlFigures, labels: Callable[[str], str], spider_name: Callable[[], str]):
        self.figures = figures
        self.labels = labels
        self.spider_name = spider_name

    def collect(self) -> list[Metric]:
        return on_reactor_thread(self.families)

    def _counter(self, name: str, doc: str, read: Callable[[DomainFigures], float]) -> Metric:
        family = CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=["spider", "domain"])
        spider = self.spider_name()
        values = [(domain, read(f)) for domain, f in self.figures.domains.items()]
        for label, value in by_label(self.labels, values):
            family.add_metric([spider, label], value)
        return family

    def families(self) -> list[Metric]:
        spider = self.spider_name()
        domains = self.figures.domains
        result = [
            self._counter(
                "downloader_requests",
                "Attempts handed to the downloader (robots.txt included).",
                attrgetter("requests"),
            ),
            self._counter(
                "downloader_errors", "Attempts that ended without an answer (network failures).", attrgetter("errors")
            ),
            self._counter(
                "downloader_failures",
                "Attempts of spider requests that failed (error status or none).",
                attrgetter("failures"),
            ),
            self._counter("downloader_response_bytes", "Response body bytes received.", attrgetter("bytes")),
            self._counter("retry_requests", "Retry attempts handed to the downloader.", attrgetter("retries")),
            self._counter("progress_domain_done_requests", "Spider requests finished for good.", attrgetter("done")),
            self._counter(
                "health_circuit_openings", "Times a domain's circuit opened (here).", attrgetter("circuit_openings")
            ),
            self._counter(
                "downloader_retry_after",
                "Answers (429/503) that carried a usable Retry-After.",
                attrgetter("retry_after_received"),
            ),
        ]
        responses = CounterMetricFamily(
            f"{PREFIX}_downloader_responses",
            "Answers by domain and status class (2xx, 3xx, 4xx, 5xx).",
            labels=["spider", "domain", "status_class"],
        )
        classes = sorted({c for f in domains.values() for c in f.answers})
        for status_class in classes:
            values = [(d, f.answers.get(status_class, 0)) for d, f in domains.items()]
            for label, value in by_label(self.labels, values):
                responses.add_metric([spider, label, status_class], value)
        dead = CounterMetricFamily(
            f"{PREFIX}_dlq_dead_letters",
            "Dead letters stored, by domain and class (error class, deadline, retry_budget, ...).",
            labels=["spider", "domain", "error_class"],
        )
        for error_class in sorted({c for f in domains.values() for c in f.dead_letters}):
            values = [(d, f.dead_letters.get(error_class, 0)) for d, f in domains.items()]
            for label, value in by_label(self.labels, values):
                dead.add_metric([spider, label, error_class], value)
        peaks = GaugeMetricFamily(
            f"{PREFIX}_downloader_peak_requests",
            'Most requests sent in any window of the given seconds ("other": the largest).',
            labels=["spider", "domain", "window"],
        )
        for window in WINDOWS:
            values = [(d, f.peaks.peak(window)) for d, f in domains.items()]
            for label, value in by_label(self.labels, values, "max"):
                peaks.add_metric([spider, label, f"{window:g}"], value)
        return [*result, responses, dead, peaks]
