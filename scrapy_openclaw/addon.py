"""The add-on: ``ADDONS = {"scrapy_openclaw.Addon": 100}`` switches everything on.

Every write is at ``"addon"`` priority or only fills a component slot the
user left empty, so a project's explicit settings always win. Each component
can also be enabled alone by its class path (see the README).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy.downloadermiddlewares.retry import RetryMiddleware
from scrapy.extensions.feedexport import FeedExporter
from scrapy.utils.misc import load_object

from scrapy_openclaw.policy import PolicySet
from scrapy_openclaw.settings import OpenClawSettings

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

HEALTH_MIDDLEWARE = "scrapy_openclaw.health.DomainHealthMiddleware"
RETRY_MIDDLEWARE = "scrapy_openclaw.retry.ClassifiedRetryMiddleware"
PARSE_RETRY_MIDDLEWARE = "scrapy_openclaw.retry.ParseRetryMiddleware"
PRIORITY_QUEUE = "scrapy_openclaw.pqueues.DeadlinePriorityQueue"
DLQ_PIPELINE = "scrapy_openclaw.dlq.DeadLetterPipeline"
CHECKPOINT_EXTENSION = "scrapy_openclaw.checkpoint.CheckpointExtension"
METRICS_EXTENSION = "scrapy_openclaw.metrics.MetricsExtension"
REPORT_EXTENSION = "scrapy_openclaw.report.PolitenessReportExtension"
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
    FEED_EXPORTER: 0,
    HEAP_FREEZE: 0,
}


class Addon:
    """Wires scrapy-openclaw's components into a crawl with safe defaults."""

    def update_settings(self, settings: BaseSettings) -> None:
        for setting, components in (
            ("DOWNLOADER_MIDDLEWARES", DOWNLOADER_MIDDLEWARES),
            ("SPIDER_MIDDLEWARES", SPIDER_MIDDLEWARES),
            ("ITEM_PIPELINES", ITEM_PIPELINES),
            ("EXTENSIONS", EXTENSIONS),
        ):
            for path, order in components.items():
                settings.setdefault_in_component_priority_dict(setting, load_object(path), order)
        # Ours replaces Scrapy's retry, unless the user switched ours off.
        if _order_of(settings, "DOWNLOADER_MIDDLEWARES", load_object(RETRY_MIDDLEWARE)) is not None:
            _switch_off(settings, "DOWNLOADER_MIDDLEWARES", RetryMiddleware)
        # Ours (durable feeds under the checkpoint, Scrapy's otherwise) replaces Scrapy's feed exporter.
        if _order_of(settings, "EXTENSIONS", load_object(FEED_EXPORTER)) is not None:
            _switch_off(settings, "EXTENSIONS", FeedExporter)
        settings.set("SCHEDULER_PRIORITY_QUEUE", PRIORITY_QUEUE, "addon")
        # A bad OPENCLAW_* value stops the crawl here (OpenClawConfigError), before it is used.
        if OpenClawSettings.from_settings(settings).distributed:
            from scrapy_openclaw.distributed import configure

            configure(settings)
        # Fail at start, before any request, on a bad policy (and a setting distributed mode set).
        PolicySet.from_settings(settings)


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
