"""The add-on: ``ADDONS = {"scrapy_openclaw.Addon": 100}`` switches everything on.

Every write is at ``"addon"`` priority or only fills a component slot the
user left empty, so a project's explicit settings always win. Each component
can also be enabled alone by its class path (docs/components.md).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scrapy import signals
from scrapy.downloadermiddlewares.retry import RetryMiddleware
from scrapy.extensions.feedexport import FeedExporter
from scrapy.utils.misc import load_object

from scrapy_openclaw.distributed import configure as configure_distributed
from scrapy_openclaw.exceptions import OpenClawConfigError
from scrapy_openclaw.health.registry import health_registry_class
from scrapy_openclaw.policy import PolicySet
from scrapy_openclaw.scrapy_internals import inspection_command
from scrapy_openclaw.settings import OpenClawSettings
from scrapy_openclaw.startup import refuse_start

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings

logger = logging.getLogger(__name__)

HEALTH_MIDDLEWARE = "scrapy_openclaw.health.DomainHealthMiddleware"
RETRY_MIDDLEWARE = "scrapy_openclaw.retry.ClassifiedRetryMiddleware"
PARSE_RETRY_MIDDLEWARE = "scrapy_openclaw.retry.ParseRetryMiddleware"
PRIORITY_QUEUE = "scrapy_openclaw.pqueues.DeadlinePriorityQueue"
DLQ_PIPELINE = "scrapy_openclaw.dlq.DeadLetterPipeline"
CHECKPOINT_EXTENSION = "scrapy_openclaw.checkpoint.CheckpointExtension"
METRICS_EXTENSION = "scrapy_openclaw.metrics.MetricsExtension"
REPORT_EXTENSION = "scrapy_openclaw.report.PolitenessReportExtension"
SITES_EXTENSION = "scrapy_openclaw.sites.SiteMemoryExtension"
FEED_EXPORTER = "scrapy_openclaw.checkpoint.feeds.DurableFeedExporter"
BAN_MIDDLEWARE = "scrapy_openclaw.health.BanDetectionMiddleware"
SNAPSHOT_MIDDLEWARE = "scrapy_openclaw.dlq.snapshots.ErrorSnapshotMiddleware"
PARSE_SNAPSHOT_MIDDLEWARE = "scrapy_openclaw.dlq.snapshots.ParseErrorSnapshotMiddleware"
HEAP_FREEZE = "scrapy_openclaw.heap.HeapFreeze"

# Orders: health sits nearer the downloader than retry (560 > 550), so it sees
# every raw response and failure before retry decides what to do with it.
# Ban detection (580) and error snapshots (570) see a response before health does.
DOWNLOADER_MIDDLEWARES = {HEALTH_MIDDLEWARE: 560, RETRY_MIDDLEWARE: 550, BAN_MIDDLEWARE: 580, SNAPSHOT_MIDDLEWARE: 570}
SPIDER_MIDDLEWARES = {PARSE_RETRY_MIDDLEWARE: 45, PARSE_SNAPSHOT_MIDDLEWARE: 46}
ITEM_PIPELINES = {DLQ_PIPELINE: 1000}
EXTENSIONS = {
    CHECKPOINT_EXTENSION: 10,
    METRICS_EXTENSION: 500,
    REPORT_EXTENSION: 505,
    SITES_EXTENSION: 506,
    FEED_EXPORTER: 0,
    HEAP_FREEZE: 0,
}
#: Left out under the commands that look at a page or test a spider (``scrapy fetch``,
#: ``shell``, ``parse``, ``check``): they would write into the project, resume a
#: checkpoint or take the metrics port of a crawl that is running.
CRAWL_ONLY = frozenset(
    {
        DLQ_PIPELINE,
        CHECKPOINT_EXTENSION,
        METRICS_EXTENSION,
        REPORT_EXTENSION,
        SITES_EXTENSION,
        SNAPSHOT_MIDDLEWARE,
        PARSE_SNAPSHOT_MIDDLEWARE,
    }
)


class Addon:
    """Wires scrapy-openclaw's components into a crawl with safe defaults."""

    def __init__(self, crawler: Crawler | None = None):
        self.crawler = crawler
        self._warnings: list[str] = []

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Addon:
        return cls(crawler)

    def update_settings(self, settings: BaseSettings) -> None:
        try:
            self._update_settings(settings)
        except OpenClawConfigError as exc:
            refuse_start(self.crawler, exc)
            raise

    def _update_settings(self, settings: BaseSettings) -> None:
        command = inspection_command(getattr(self.crawler, "spidercls", None), settings)
        for setting, components in (
            ("DOWNLOADER_MIDDLEWARES", DOWNLOADER_MIDDLEWARES),
            ("SPIDER_MIDDLEWARES", SPIDER_MIDDLEWARES),
            ("ITEM_PIPELINES", ITEM_PIPELINES),
            ("EXTENSIONS", EXTENSIONS),
        ):
            for path, order in components.items():
                if command is None or path not in CRAWL_ONLY:
                    settings.setdefault_in_component_priority_dict(setting, load_object(path), order)
        if command is not None:
            logger.debug(
                "scrapy %(command)s: dead letters, error snapshots, checkpoints and metrics are off",
                {"command": command},
            )
        # A bad OPENCLAW_* value stops the crawl here (OpenClawConfigError), before it is used.
        config = OpenClawSettings.from_settings(settings)
        health_registry_class(config.health_registry_class)
        # Ours replaces Scrapy's retry, unless the user switched ours off.
        if _order_of(settings, "DOWNLOADER_MIDDLEWARES", load_object(RETRY_MIDDLEWARE)) is not None:
            _switch_off(settings, "DOWNLOADER_MIDDLEWARES", RetryMiddleware)
            if config.retry_enabled:
                self._warnings += _switch_off_retry_subclasses(settings)
        health = _order_of(settings, "DOWNLOADER_MIDDLEWARES", load_object(HEALTH_MIDDLEWARE))
        if config.health_enabled and health is not None:
            self._warnings += _switch_off_autothrottle(settings)
        self._warn_at_start()
        # Ours (durable feeds under the checkpoint, Scrapy's otherwise) replaces Scrapy's feed exporter.
        if _order_of(settings, "EXTENSIONS", load_object(FEED_EXPORTER)) is not None:
            _switch_off(settings, "EXTENSIONS", FeedExporter)
        settings.set("SCHEDULER_PRIORITY_QUEUE", PRIORITY_QUEUE, "addon")
        if config.distributed and command is not None:
            # the command's own requests (their callbacks its closures) stay in this process: in
            # the crawl's Redis queue they would be refused, or fetched by another worker
            settings.set("OPENCLAW_DISTRIBUTED", False, "cmdline")  # (over the project's, and -s's)
            config = OpenClawSettings.from_settings(settings)
            logger.debug("scrapy %(command)s: distributed mode is off", {"command": command})
        if config.distributed:
            configure_distributed(settings, config)
            config = OpenClawSettings.read(settings)  # with distributed mode's own settings
        if self.crawler is not None:
            config.remember(self.crawler, settings)  # validated once: the components take this one
        # Fail at start, before any request, on a bad policy.
        PolicySet.load(config)

    def _warn_at_start(self) -> None:
        """Log what the add-on switched off once the crawl starts: Scrapy installs the
        crawl's log handler (``LOG_FILE``) after the add-ons ran."""
        if self.crawler is None:
            self._log_warnings()
        elif self._warnings:
            self.crawler.signals.connect(self._log_warnings, signal=signals.engine_started)

    def _log_warnings(self) -> None:
        warnings, self._warnings = self._warnings, []
        for message in warnings:
            logger.warning("%(message)s", {"message": message})


def _switch_off_retry_subclasses(settings: BaseSettings) -> list[str]:
    """Our retry owns retrying: a project's RetryMiddleware subclass would retry the same
    failures again (twice the attempts, two give-ups per URL), so it is switched off, once said."""
    ours = load_object(RETRY_MIDDLEWARE)
    components = settings.getdict("DOWNLOADER_MIDDLEWARES")
    warnings = []
    for key, order in components.items():
        cls = load_object(key)
        if order is None or cls is ours or not (isinstance(cls, type) and issubclass(cls, RetryMiddleware)):
            continue
        components[key] = None
        warnings.append(
            f"{cls.__module__}.{cls.__qualname__} (a RetryMiddleware subclass in DOWNLOADER_MIDDLEWARES) "
            "is switched off: scrapy_openclaw's ClassifiedRetryMiddleware retries this crawl's failures; "
            "to keep yours instead, set OPENCLAW_RETRY_ENABLED = False"
        )
    if warnings:
        settings.set("DOWNLOADER_MIDDLEWARES", components, settings.getpriority("DOWNLOADER_MIDDLEWARES") or 0)
    return warnings


def _switch_off_autothrottle(settings: BaseSettings) -> list[str]:
    """The health middleware owns pacing: AutoThrottle's slot delays would stack on its rate
    control (a crawl twice as slow, from latency alone), so it is switched off, once said."""
    if not settings.getbool("AUTOTHROTTLE_ENABLED"):
        return []
    settings.set("AUTOTHROTTLE_ENABLED", False, settings.getpriority("AUTOTHROTTLE_ENABLED") or 0)
    return [
        "AUTOTHROTTLE_ENABLED is ignored: scrapy_openclaw's DomainHealthMiddleware paces each domain "
        "(429s, Retry-After, errors, latency); to use AutoThrottle instead, set OPENCLAW_HEALTH_ENABLED = False"
    ]


def _switch_off(settings: BaseSettings, name: str, cls: type) -> None:
    """Set *cls* to None in the component dict unless the user names it.

    Keyed by import path, as Scrapy's ``*_BASE`` dicts are: Scrapy 2.14 merges
    them by key (``getwithbase``), so a class key would leave the base entry on.
    """
    components = settings.getdict(name)
    if any(load_object(key) is cls for key in components):
        return
    components[f"{cls.__module__}.{cls.__qualname__}"] = None
    settings.set(name, components, settings.getpriority(name) or 0)


def _order_of(settings: BaseSettings, name: str, cls: type) -> int | None:
    """The order the user's (or our) component dict gives *cls*, None if off or absent."""
    for key, order in settings.getdict(name).items():
        if load_object(key) is cls:
            return order
    return None
