"""``scrapy openclaw-sites list|show DOMAIN|forget DOMAIN...|forget --all``: the site memory.

Reads the project's store (``--path``, else ``OPENCLAW_SITES_PATH`` /
``<project>/openclaw-data/sites.json``), or with ``--redis SPIDER`` the
distributed crawl's (``REDIS_URL``). ``list`` prints one line per domain (the
most recently seen first), ``show`` one domain's entry as JSON, ``forget``
drops entries so the next crawl meets those sites as strangers.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any, ClassVar

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError

from scrapy_openclaw.exceptions import OpenClawConfigError
from scrapy_openclaw.settings import OpenClawSettings
from scrapy_openclaw.sites.entry import SiteEntry
from scrapy_openclaw.sites.store import FileSiteStore, RedisSiteStore, SiteStoreError, open_store

COLUMNS = ("domain", "limit/s", "burst", "crawl-delay", "signals", "bans", "latency", "crawls", "last seen (UTC)")


class Command(ScrapyCommand):
    requires_project = False
    requires_crawler_process = False
    default_settings: ClassVar[dict[str, Any]] = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return "list | show DOMAIN | forget DOMAIN... | forget --all  [--path FILE | --redis SPIDER]"

    def short_desc(self) -> str:
        return "List, show or forget what crawls remember about each site"

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--path", help="the site memory file (default: the project's sites.json)")
        parser.add_argument("--redis", metavar="SPIDER", help="the distributed crawl's memory in Redis (REDIS_URL)")
        parser.add_argument("--all", action="store_true", help="forget: every domain")

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        if not args or args[0] not in ("list", "show", "forget"):
            raise UsageError("expected list, show DOMAIN or forget DOMAIN... / forget --all")
        action, names = args[0], args[1:]
        if action == "show" and len(names) != 1:
            raise UsageError("show takes one domain")
        if action == "forget" and bool(names) == opts.all:
            raise UsageError("forget takes domains, or --all (not both)")
        try:
            store = self._store(opts)
            self._run(action, names, opts, store)
        except SiteStoreError as exc:
            print(f"error: {exc}")
            self.exitcode = 1
        except OSError as exc:
            print(f"error: {exc}")
            self.exitcode = 1

    def _store(self, opts: argparse.Namespace) -> FileSiteStore | RedisSiteStore:
        assert self.settings is not None
        try:
            config = OpenClawSettings.from_settings(self.settings)
        except OpenClawConfigError as exc:
            raise UsageError(str(exc), print_help=False) from None
        if opts.path:
            store = open_store(config, self.settings, "-", redis=False)
            assert isinstance(store, FileSiteStore)
            store.path = Path(opts.path)
            return store
        if opts.redis:
            return open_store(config, self.settings, opts.redis, redis=True)
        return open_store(config, self.settings, "-", redis=False)

    def _run(self, action: str, names: list[str], opts: argparse.Namespace, store: Any) -> None:
        if action == "forget":
            gone = store.forget(None if opts.all else names)
            missing = sorted(set(names) - set(gone))
            print(f"forgot {len(gone)} domain(s)" + (f"; not known: {', '.join(missing)}" if missing else ""))
            return
        problems: list[str] = []
        entries = store.load(problems=problems) if isinstance(store, RedisSiteStore) else store.load()
        for problem in problems:
            print(f"warning: {problem} (left out)")
        if action == "show":
            entry = entries.get(names[0])
            if entry is None:
                print(f"error: {names[0]!r} is not remembered in {store}")
                self.exitcode = 1
                return
            print(json.dumps({"domain": names[0], **entry.to_data(), "signal": entry.signal}, indent=1))
            return
        print(listing(entries) or f"no sites remembered in {store}")


def listing(entries: dict[str, SiteEntry]) -> str:
    """One line per domain, the most recently seen first ('' without entries)."""
    if not entries:
        return ""
    rows = [COLUMNS]
    for domain, e in sorted(entries.items(), key=lambda item: (-item[1].seen_at, item[0])):
        rows.append(
            (
                domain,
                f"{e.limit:g}" if e.limit is not None else "-",
                str(e.burst or "-"),
                f"{e.crawl_delay:g}s" if e.crawl_delay else "-",
                e.signal,
                "yes" if e.bans else "no",
                f"{e.latency * 1000:.0f}ms" if e.latency is not None else "-",
                str(e.crawls),
                time.strftime("%Y-%m-%d %H:%M", time.gmtime(e.seen_at)),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)
