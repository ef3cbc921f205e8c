"""MetricsExtension: Prometheus metrics and a live per-domain log table.

Each crawler gets its own ``CollectorRegistry``, so crawls in one process never
clash, served on ``/metrics`` from Scrapy's own reactor (docs/monitoring.md). The
extension observes only latency itself: the request figures come from
:class:`~scrapy_openclaw.metrics.figures.CrawlFigures`, the rest from their owners.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Histogram, push_to_gateway
from scrapy import signals
from scrapy.exceptions import NotConfigured
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.reactor import is_reactor_installed
from twisted.internet.defer import DeferredList
from twisted.internet.error import CannotListenError
from twisted.internet.threads import deferToThread

from scrapy_openclaw._metrics_http import serve_metrics, summarise_refusals
from scrapy_openclaw.metrics.collector import PREFIX, DomainLabels, OpenClawCollector
from scrapy_openclaw.metrics.families import FiguresCollector
from scrapy_openclaw.metrics.figures import CrawlFigures
from scrapy_openclaw.metrics.logtable import DomainLogTable, Progress
from scrapy_openclaw.metrics.progress import ProgressCollector, crawl_progress
from scrapy_openclaw.metrics.zeros import ZeroFilled
from scrapy_openclaw.scrapy_internals import engine_of, slot_key
from scrapy_openclaw.settings import OpenClawSettings

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from twisted.internet.defer import Deferred


logger = logging.getLogger(__name__)

#: Latency buckets (seconds): loopback-fast to very slow sites.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
PUSH_TIMEOUT = 10.0  # seconds


class MetricsExtension:
    """Per-crawl Prometheus registry, ``/metrics`` endpoint, push at close, log table."""

    def __init__(self, crawler: Crawler):
        settings = crawler.settings
        config = OpenClawSettings.for_crawler(crawler)
        self.crawler = crawler
        self.port = config.metrics_port
        self.host = config.metrics_host
        self.allowed_hosts = config.allowed_hosts
        self.pushgateway: str | None = config.metrics_pushgateway or None
        self.labels = DomainLabels(config.metrics_max_domains)
        self.registry = CollectorRegistry()
        self._spider_name = ""
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}  # see _series
        self._listening: Any = None  # twisted IListeningPort
        self.control_token: str | None = config.control_token or None
        self.control_poll = config.control_poll
        self._channel: Any = None
        self._build_metrics()
        self.collector = OpenClawCollector(crawler, self.labels, lambda: self._spider_name)
        spider_name = lambda: self._spider_name  # noqa: E731
        self.registry.register(ZeroFilled(self.collector, self.labels.tracked, spider_name))
        self.figures = CrawlFigures.for_crawler(crawler)
        self.registry.register(
            ZeroFilled(FiguresCollector(self.figures, self.labels, spider_name), self.labels.tracked, spider_name)
        )
        self.registry.register(ProgressCollector(self))
        rows = config.log_domains
        interval = settings.getfloat("LOGSTATS_INTERVAL")
        self.logtable = (
            DomainLogTable(
                rows=rows,
                interval=interval,
                health=self.collector.health,
                figures=self.figures,
                progress=self.progress,
                stats=crawler.stats,
            )
            if rows > 0 and interval > 0
            else None
        )
        connect = crawler.signals.connect
        connect(self.spider_opened, signal=signals.spider_opened)
        connect(self.spider_closed, signal=signals.spider_closed)
        connect(self.response_downloaded, signal=signals.response_downloaded)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> MetricsExtension:
        config = OpenClawSettings.for_crawler(crawler)
        if (
            not config.metrics_port
            and not config.metrics_pushgateway
            and config.log_domains <= 0
            and not config.control_token
        ):
            raise NotConfigured
        return cls(crawler)

    def _build_metrics(self) -> None:
        self.latency = Histogram(
            f"{PREFIX}_downloader_response_latency_seconds",
            "Time to the response headers (request.meta['download_latency']), by domain.",
            ["spider", "domain"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )

    # ------------------------------------------------------------------ signals

    def spider_opened(self, spider: Spider) -> None:
        self._spider_name = spider.name
        self._children.clear()
        self.collector.engine = engine_of(self.crawler)
        controller = self._controller(spider)
        if self.port:
            self._listen(spider, controller)
        if self.logtable is not None:
            self.logtable.start(spider)

    async def spider_closed(self, spider: Spider, reason: str) -> None:
        if self.logtable is not None:
            self.logtable.stop()
        if self._channel is not None:
            self._channel.stop()
            self._channel = None
        waits: list[Deferred[Any]] = []
        if self.pushgateway:
            pushed = self._push(spider)
            if pushed is not None:
                waits.append(pushed)
        if self._listening is not None:
            waits.append(self._listening.stopListening())
            self._listening = None
            summarise_refusals(extra={"spider": spider})
        if waits:  # (a coroutine handler: Scrapy deprecates handlers returning a Deferred)
            await maybe_deferred_to_future(DeferredList(waits, consumeErrors=True))

    def progress(self) -> Progress | None:
        """The crawl's progress now (see :func:`~scrapy_openclaw.metrics.progress.crawl_progress`)."""
        return crawl_progress(self.crawler, self.figures)

    def _series(self, metric: Any, *labels: str) -> Any:
        """The metric's child for this spider and *labels*, kept: ``labels()`` takes a lock
        and builds a key on every call, and these run several times per request."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(self._spider_name, *labels)
        return child

    def response_downloaded(self, response: Response, request: Request, spider: Spider) -> None:
        latency = request.meta.get("download_latency")
        if isinstance(latency, (int, float)) and latency >= 0:
            self._series(self.latency, self.labels(slot_key(self.crawler, request))).observe(latency)

    # ------------------------------------------------------------------ endpoint

    def _controller(self, spider: Spider) -> Any:
        """The crawl's live control (OPENCLAW_CONTROL_TOKEN), with its Redis channel in distributed mode."""
        if not self.control_token:
            return None
        if len(self.control_token) < 16:
            logger.error(
                "OPENCLAW_CONTROL_TOKEN is shorter than 16 characters: live control is off", extra={"spider": spider}
            )
            return None
        from scrapy_openclaw.control.controller import Controller

        controller = Controller.for_crawler(self.crawler)
        controller.pending = self._pending
        server = getattr(controller.registry, "server", None)  # the Redis health registry's
        if server is not None:
            from scrapy_openclaw.control.channel import ControlChannel

            self._channel = controller.channel = ControlChannel(
                self.crawler,
                controller,
                server,
                controller.registry.link,  # type: ignore[attr-defined]  # (the Redis registry's)
                self.control_poll,
            )
            self._channel.start()
        if not self.port:
            logger.warning(
                "OPENCLAW_CONTROL_TOKEN is set but OPENCLAW_METRICS_PORT is 0: no control API%(redis)s",
                {"redis": " (commands sent through Redis still apply)" if server else ""},
                extra={"spider": spider},
            )
        return controller

    def _pending(self) -> dict[str, int]:
        progress = self.progress()
        return dict(progress.domains) if progress is not None else {}

    def _listen(self, spider: Spider, controller: Any = None) -> None:
        if not is_reactor_installed():
            self._listen_failed(spider, "the HTTP endpoint needs the Twisted reactor")
            return
        from twisted.internet import reactor  # (the global reactor, installed by now)

        children: dict[bytes, Any] = {}
        if controller is not None:
            from scrapy_openclaw.control.api import ControlResource

            children[b"control"] = ControlResource(controller, self.control_token or "")
        try:
            self._listening = serve_metrics(
                reactor, self.port, self.host, self.registry, children=children, allowed_hosts=self.allowed_hosts
            )
        except CannotListenError as exc:
            self._listen_failed(spider, str(exc.socketError or exc))
            return
        logger.info(
            "Prometheus metrics on http://%(host)s:%(port)d/metrics%(control)s",
            {
                "host": self.host,
                "port": self._listening.getHost().port,
                "control": ", live control on /control/" if controller is not None else "",
            },
            extra={"spider": spider},
        )

    def _listen_failed(self, spider: Spider, why: str) -> None:
        where = f"{self.host}:{self.port}"
        logger.error(
            "Cannot serve Prometheus metrics on %(where)s (OPENCLAW_METRICS_HOST/PORT): "
            "%(why)s. The crawl continues without the metrics endpoint.",
            {"where": where, "why": why},
            extra={"spider": spider},
        )
        self.crawler.stats.set_value("openclaw/metrics/listen_error", f"{where}: {why}")

    # ------------------------------------------------------------------ push

    def _push(self, spider: Spider) -> Deferred[Any] | None:
        """Push one snapshot to the Pushgateway in a thread; failures are logged only."""
        if not is_reactor_installed():
            logger.warning("Pushgateway push skipped: it needs the Twisted reactor", extra={"spider": spider})
            return None
        snapshot = CollectorRegistry()
        snapshot.register(_Frozen(list(self.registry.collect())))  # read here, on the reactor thread
        gateway, job = self.pushgateway, spider.name
        assert gateway is not None  # (only called with OPENCLAW_METRICS_PUSHGATEWAY set)
        d = deferToThread(push_to_gateway, gateway, job=job, registry=snapshot, timeout=PUSH_TIMEOUT)

        def pushed(_: Any) -> None:
            logger.info(
                "Pushed final metrics to the Pushgateway %(gateway)s (job=%(job)s)",
                {"gateway": gateway, "job": job},
                extra={"spider": spider},
            )
            self.crawler.stats.set_value("openclaw/metrics/pushed", 1)

        def failed(failure: Any) -> None:
            logger.error(
                "Could not push metrics to the Pushgateway %(gateway)s (OPENCLAW_METRICS_PUSHGATEWAY): %(error)s",
                {"gateway": gateway, "error": failure.getErrorMessage()},
                extra={"spider": spider},
            )
            self.crawler.stats.set_value("openclaw/metrics/push_error", failure.getErrorMessage())

        d.addCallbacks(pushed, failed)
        return d


class _Frozen:
    """A collector returning metrics read earlier (for a push from a thread)."""

    def __init__(self, metrics: list[Metric]):
        self.metrics = metrics

    def collect(self) -> list[Metric]:
        return self.metrics
