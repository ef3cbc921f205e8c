"""``scrapy openclaw-report [SPIDER]``: print a stored politeness report.

Reads the file the crawl wrote (``--path``, else ``OPENCLAW_REPORT_PATH`` /
``<project>/openclaw-data/SPIDER/report.json``), or with ``--redis`` the
merged report of a distributed crawl's workers. ``--format table`` (the
default: every domain, busiest first), ``text`` (sentences for a site's
operator; needs ``--domain``) or ``json``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, ClassVar

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError

from scrapy_openclaw.exceptions import OpenClawConfigError
from scrapy_openclaw.report.model import ReportError
from scrapy_openclaw.report.render import as_json, table, text
from scrapy_openclaw.report.store import read_report, report_path
from scrapy_openclaw.settings import OpenClawSettings


class Command(ScrapyCommand):
    requires_project = False
    requires_crawler_process = False
    default_settings: ClassVar[dict[str, Any]] = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return "[SPIDER] [--path FILE | --redis] [--domain DOMAIN] [--format table|text|json]"

    def short_desc(self) -> str:
        return "Print a crawl's politeness report: what it did to each site"

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--path", help="the report file (default: the spider's report.json)")
        parser.add_argument("--redis", action="store_true", help="the distributed crawl's merged report (REDIS_URL)")
        parser.add_argument("--domain", help="only this domain")
        parser.add_argument(
            "--format",
            choices=("table", "text", "json"),
            default="table",
            help="table: every domain, busiest first; text: sentences for one site's operator (needs --domain); json",
        )
        parser.add_argument("--rows", type=int, default=1000, help="domains in the table (default 1000)")

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        if len(args) > 1:
            raise UsageError("expected at most one argument, the spider name")
        if opts.format == "text" and not opts.domain:
            raise UsageError("--format text is written for one site's operator: name it with --domain")
        try:
            report = self._load(args[0] if args else None, opts)
        except ReportError as exc:
            print(f"error: {exc}")
            self.exitcode = 1
            return
        if opts.domain is not None and opts.domain not in report["domains"]:
            known = ", ".join(list(report["domains"])[:10]) or "none"
            print(f"error: {opts.domain!r} is not in this report (domains: {known})")
            self.exitcode = 1
            return
        if opts.format == "json":
            print(as_json(report, opts.domain))
        elif opts.format == "text":
            print(text(report, opts.domain))
        else:
            shown = (
                report if opts.domain is None else {**report, "domains": {opts.domain: report["domains"][opts.domain]}}
            )
            print(table(shown, opts.rows) or "no domains in this report")

    def _load(self, spider: str | None, opts: argparse.Namespace) -> dict[str, Any]:
        assert self.settings is not None
        try:
            config = OpenClawSettings.from_settings(self.settings)
        except OpenClawConfigError as exc:
            raise UsageError(str(exc), print_help=False) from None
        if opts.redis:
            if spider is None:
                raise UsageError("--redis needs the spider name")
            return _from_redis(self.settings, config, spider)
        if opts.path:
            return read_report(Path(opts.path))
        if spider is None:
            raise UsageError("name the spider (its report.json) or give --path FILE")
        return read_report(report_path(config, spider))


def _from_redis(settings: Any, config: OpenClawSettings, spider: str) -> dict[str, Any]:
    from redis.exceptions import RedisError

    from scrapy_openclaw.distributed.connection import client_from_settings
    from scrapy_openclaw.redact import mask_uri
    from scrapy_openclaw.report.shared import SharedReport

    scope = config.crawl_id or spider
    try:
        return SharedReport(client_from_settings(settings, config), spider, scope).merged()
    except RedisError as exc:
        raise ReportError(f"Redis {mask_uri(settings.get('REDIS_URL'))}: {exc}") from None
