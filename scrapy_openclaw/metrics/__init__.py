"""Prometheus metrics and live per-domain visibility for a crawl.

``EXTENSIONS = {"scrapy_openclaw.metrics.MetricsExtension": 500}`` (the add-on
does it); settings ``OPENCLAW_METRICS_PORT``, ``OPENCLAW_METRICS_HOST``,
``OPENCLAW_METRICS_MAX_DOMAINS``, ``OPENCLAW_METRICS_PUSHGATEWAY``,
``OPENCLAW_LOG_DOMAINS``.
"""

from scrapy_openclaw.metrics.collector import OTHER, DomainLabels, OpenClawCollector
from scrapy_openclaw.metrics.extension import MetricsExtension
from scrapy_openclaw.metrics.logtable import DomainLogTable

__all__ = ["OTHER", "DomainLabels", "DomainLogTable", "MetricsExtension", "OpenClawCollector"]
