"""PolitenessReportExtension: at the end of every crawl, what it did to each site.

At close it builds the report from the crawl's figures and the health registry,
logs its table and writes it as JSON for ``scrapy openclaw-report``. In
distributed mode the workers' parts meet in Redis (:mod:`.shared`): the last
worker to close writes the whole crawl's (docs/politeness-report.md).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import NotConfigured
from scrapy.utils.asyncio import create_looping_call
from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet.defer import Deferred

from scrapy_openclaw.health.reader import health_registry
from scrapy_openclaw.metrics.figures import CrawlFigures
from scrapy_openclaw.paths import job_id
from scrapy_openclaw.report.model import ReportError, build_report
from scrapy_openclaw.report.render import table
from scrapy_openclaw.report.shared import PUSH_INTERVAL, SharedReport, fresh_bins
from scrapy_openclaw.report.store import report_lock, report_path, write_report
from scrapy_openclaw.settings import OpenClawSettings, crawl_id

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

SETTLE_INTERVAL = 10.0  # seconds between two settlings of the busiest windows (bounds their memory)


class PolitenessReportExtension:
    """Builds, logs and stores the politeness report when the spider closes."""

    def __init__(self, crawler: Crawler):
        config = OpenClawSettings.for_crawler(crawler)
        self.crawler = crawler
        self.rows = config.report_rows
        self.figures = CrawlFigures.for_crawler(crawler)
        self.distributed = config.distributed
        self.scope = config.crawl_id
        self.started_at = time.time()
        self.report: dict[str, Any] | None = None
        self.path: Any = None
        self._shared: SharedReport | None = None
        self._link: Any = None
        self._loop: Any = None
        crawler.signals.connect(self.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(self.spider_closed, signal=signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> PolitenessReportExtension:
        if not OpenClawSettings.for_crawler(crawler).report_enabled:
            raise NotConfigured
        return cls(crawler)

    def spider_opened(self, spider: Spider) -> None:
        self.started_at = time.time()
        try:
            self.path = report_path(OpenClawSettings.for_crawler(self.crawler), spider.name, job_id(spider))
        except ReportError as exc:
            logger.error("%(error)s; no politeness report file", {"error": exc}, extra={"spider": spider})
        if self.distributed:
            self._open_shared(spider)
        self._loop = create_looping_call(self._tick)
        self._loop.start(PUSH_INTERVAL if self._shared is not None else SETTLE_INTERVAL, now=False)

    def _open_shared(self, spider: Spider) -> None:
        from scrapy_openclaw.distributed.connection import client_from_settings
        from scrapy_openclaw.distributed.link import RedisLink

        registry = health_registry(self.crawler)
        server = getattr(registry, "server", None) or client_from_settings(
            self.crawler.settings, OpenClawSettings.for_crawler(self.crawler)
        )
        self._shared = SharedReport(server, spider.name, self.scope or spider.name)
        self._link = RedisLink.for_crawler(self.crawler)

    def _tick(self) -> None:
        self.figures.settle()
        if self._shared is not None:
            shared, fresh, horizon = self._shared, fresh_bins(self.figures), self.figures.horizon
            if fresh:
                self._link.submit(shared.push_bins, fresh, horizon, errback=lambda exc: None)

    async def spider_closed(self, spider: Spider, reason: str) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self.figures.settle()
        part = build_report(
            self.figures,
            health_registry(self.crawler),
            spider=spider.name,
            crawl_id=crawl_id(self.crawler),
            started_at=self.started_at,
            finish_reason=reason,
            robots_forbidden=int(self.crawler.stats.get_value("robotstxt/forbidden", 0) or 0),
        )
        if self._shared is None:
            self._finish(spider, part)
            return
        done: Deferred[None] = Deferred()
        shared, fresh, horizon = self._shared, fresh_bins(self.figures), self.figures.horizon
        worker = f"{socket.gethostname()}:{os.getpid()}:{crawl_id(self.crawler)}"

        path = self.path

        def exchange() -> tuple[dict[str, Any] | None, Exception | None, OSError | None]:
            try:
                shared.push_bins(fresh, horizon)
                shared.store_part(worker, part)
                # workers of one machine writing one path: each merges and writes holding the path's
                # lock, so the last to write merged after every part stored before it (a merge and
                # a write apart, a worker that merged first could write last, missing the other's)
                with report_lock(path):
                    report = shared.merged()
                    return report, None, _written(path, report)
            except Exception as exc:  # Redis down or a bad entry: this worker's part still gets written
                return None, exc, None

        def exchanged(outcome: tuple[dict[str, Any] | None, Exception | None, OSError | None]) -> None:
            report, error, write_error = outcome
            if report is not None:
                self._finish(spider, report, write_error=write_error, written=True)
            else:
                logger.error(
                    "Could not merge the politeness report in Redis (%(error)s): writing this worker's figures only",
                    {"error": error},
                    extra={"spider": spider},
                )
                self._finish(spider, part)
            done.callback(None)

        self._link.submit(exchange, callback=exchanged, raw=True)
        await maybe_deferred_to_future(done)  # (a coroutine handler: Scrapy deprecates returned Deferreds)

    def _finish(
        self, spider: Spider, report: dict[str, Any], *, written: bool = False, write_error: OSError | None = None
    ) -> None:
        """Say the report; write it unless *written* already (*write_error*: the write failed)."""
        self.report = report
        text = table(report, self.rows)
        if text:
            logger.info("%(table)s", {"table": text}, extra={"spider": spider})
        if self.path is None:
            return
        if not written:
            write_error = _written(self.path, report)
        if write_error is not None:
            logger.error(
                "Cannot write the politeness report to %(path)s (OPENCLAW_REPORT_PATH): %(error)s",
                {"path": self.path, "error": write_error.strerror or write_error},
                extra={"spider": spider},
            )
            return
        self.crawler.stats.set_value("openclaw/report/path", str(self.path))
        logger.info(
            "Politeness report written to %(path)s (scrapy openclaw-report --format text --domain DOMAIN)",
            {"path": self.path},
            extra={"spider": spider},
        )


def _written(path: Any, report: dict[str, Any]) -> OSError | None:
    """Write *report* to *path* (None: no file); the error, if the write failed."""
    if path is None:
        return None
    try:
        write_report(path, report)
    except OSError as exc:
        return exc
    return None
