"""The ``replay SPIDER`` subcommand: a new crawl of SPIDER started from the selected dead letters.

One request per URL (the newest record); ``protocol_permanent`` and
``domain_down`` only with ``--class`` or ``--all``; the records are marked in
place with the outcome once the crawl ends.
"""

from __future__ import annotations

import sys
from collections import Counter
from typing import TYPE_CHECKING, Any

from scrapy.exceptions import UsageError

from scrapy_openclaw.commands.dlq.reading import StoreAccess
from scrapy_openclaw.commands.dlq.text import _printable
from scrapy_openclaw.redact import mask_headers, mask_uri
from scrapy_openclaw.runtime import shared

if TYPE_CHECKING:
    import argparse

    from scrapy_openclaw.deadletter import DeadLetter
    from scrapy_openclaw.dlq.replay import ReplayPlan
    from scrapy_openclaw.dlq.stores import DeadLetterStore


def _crawler_process(settings: Any) -> Any:
    """The crawler process ``scrapy`` itself would make for a crawl command."""
    from scrapy.crawler import AsyncCrawlerProcess, CrawlerProcess

    asyncio_reactor = "twisted.internet.asyncioreactor.AsyncioSelectorReactor"
    if (
        settings["TWISTED_REACTOR"] == asyncio_reactor and not settings.getbool("FORCE_CRAWLER_PROCESS")
    ) or not settings.getbool("TWISTED_REACTOR_ENABLED", True):
        return AsyncCrawlerProcess(settings)
    return CrawlerProcess(settings)


class ReplaySubcommand(StoreAccess):
    """Part of the openclaw-dlq command: replay."""

    def _run_replay(self, opts: argparse.Namespace, spider: str) -> None:
        if opts.spider and opts.spider != spider:
            raise UsageError(f"replay {spider}: --spider {opts.spider} names another spider", print_help=False)
        store = self._open(opts, spider=spider)
        records, duplicates = self._replay_selection(store, opts, spider)
        if not records:
            print(f"nothing to replay for {spider} in {store.uri}")
            return
        if opts.dry_run:
            self._dry_run(opts, spider, store, records)
            store.close()
            return
        plan = self._crawl_replay(opts, spider, store, records, duplicates)
        self._report_replay(plan, spider, store, records)
        store.close()

    def _dry_run(
        self, opts: argparse.Namespace, spider: str, store: DeadLetterStore, records: list[DeadLetter]
    ) -> None:
        """The requests the replay would send, built as it builds them (same skips, same counts)."""
        from scrapy.crawler import Crawler
        from scrapy.spiderloader import get_spider_loader

        from scrapy_openclaw.dlq.replay import plan_requests

        try:
            assert self.settings is not None  # (Scrapy sets the project's before run)
            spidercls = get_spider_loader(self.settings).load(spider)
        except KeyError as exc:
            raise UsageError(str(exc), print_help=False) from None
        crawler = Crawler(spidercls, self.settings)
        planned, skipped = plan_requests(records, spidercls.from_crawler(crawler, **opts.spargs))
        for id_, request in planned:
            callback = getattr(request.callback, "__name__", request.callback) or "parse"
            print(f"{id_[:12]}  {request.method} {mask_uri(request.url)}  callback={callback}")
            for name, value in mask_headers(request.headers).items():
                print(f"    {_printable(name)}: {_printable(value)}")
            meta = sorted(k for k in request.meta if not k.startswith("_"))
            if meta:
                print(
                    f"    meta: {', '.join(meta)}"
                    + (f" (proxy {mask_uri(request.meta['proxy'])})" if "proxy" in meta else "")
                )
        print(
            f"would replay {len(planned)} dead letter(s) of {spider} from {store.uri} (dry run: nothing sent)"
            + (f"; would skip {len(skipped)} that could not be rebuilt or were refused" if skipped else "")
        )
        for id_, why in skipped.items():
            print(f"  would skip {id_}: {_printable(mask_uri(why))}", file=sys.stderr)
        if skipped:
            self.exitcode = 1

    def _replay_selection(
        self, store: DeadLetterStore, opts: argparse.Namespace, spider: str
    ) -> tuple[list[DeadLetter], list[DeadLetter]]:
        """(to send, older duplicates): one per URL, held-back classes left out; says what is not sent and why."""
        from scrapy_openclaw.dlq.replay import select

        selected = list(store.iter(self._filters(opts, spider=spider, include_replayed=opts.include_replayed)))
        records = [r for r in selected if r.request]
        if len(records) < len(selected):
            print(
                f"{len(selected) - len(records)} selected dead letter(s) hold no request (items) and are not replayed"
            )
        unreadable = self._report_skipped(store)
        if unreadable:
            self.exitcode = 1
        records, duplicates, held = select(records, everything=opts.replay_all or bool(opts.error_class))
        if held:
            counts = Counter(r.error_class for r in held)
            print(
                f"held back {len(held)} dead letter(s) ("
                + ", ".join(f"{n} {c}" for c, n in sorted(counts.items()))
                + "); replay them with --class CLASS or --all"
            )
        if duplicates:
            print(f"{len(duplicates)} older dead letter(s) of the same URL(s) are not sent again")
        return records, duplicates

    def _crawl_replay(
        self,
        opts: argparse.Namespace,
        spider: str,
        store: DeadLetterStore,
        records: list[DeadLetter],
        duplicates: list[DeadLetter],
    ) -> ReplayPlan:
        """Run the replay crawl (``ReplayStartMiddleware`` sends *records*); its plan, filled in."""
        from scrapy_openclaw.dlq.replay import PLAN_KEY, ReplayPlan, ReplayStartMiddleware

        process = self.crawler_process = _crawler_process(self.settings)
        # Set on the process's settings before the crawler copies them (the
        # process merges its settings into the crawler again when it starts it).
        process.settings.set_in_component_priority_dict("SPIDER_MIDDLEWARES", ReplayStartMiddleware, 990)
        try:
            crawler = process.create_crawler(spider)
        except KeyError as exc:
            raise UsageError(str(exc), print_help=False) from None
        plan = shared(crawler, PLAN_KEY, lambda: ReplayPlan(store, records, duplicates))
        process.crawl(crawler, **opts.spargs)
        process.start()
        if getattr(process, "bootstrap_failed", False):
            self.exitcode = 1
        return plan

    def _report_replay(self, plan: ReplayPlan, spider: str, store: DeadLetterStore, records: list[DeadLetter]) -> None:
        """Print what the replay recovered, failed again or skipped; exit 1 unless every record was sent."""
        recovered = plan.finish()
        print(
            f"replayed {len(plan.injected)} dead letter(s) of {spider} from {store.uri}: "
            f"{recovered} recovered, {len(plan.failed)} failed again"
            + (f"; skipped {len(plan.skipped)} that could not be rebuilt or were refused" if plan.skipped else "")
        )
        for id_, why in plan.skipped.items():
            print(f"  skipped {id_}: {_printable(mask_uri(why))}", file=sys.stderr)
        if plan.skipped or len(plan.injected) < len(records):
            self.exitcode = 1
