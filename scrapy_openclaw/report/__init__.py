"""The politeness report: what a crawl did to each site (requests, busiest second, answers,
429/503 and Retry-After, holds, robots.txt, circuit openings, bytes, dead letters).

``EXTENSIONS = {"scrapy_openclaw.report.PolitenessReportExtension": 505}`` (the add-on
does it); ``scrapy openclaw-report`` prints a stored one. Settings
``OPENCLAW_REPORT_ENABLED``, ``OPENCLAW_REPORT_PATH``, ``OPENCLAW_REPORT_ROWS``,
``OPENCLAW_REPORT_MAX_DOMAINS``.
"""

from scrapy_openclaw.report.extension import PolitenessReportExtension
from scrapy_openclaw.report.model import ReportError, build_report, merge

__all__ = ["PolitenessReportExtension", "ReportError", "build_report", "merge"]
