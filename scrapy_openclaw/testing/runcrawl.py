"""Run one crawl in a process of its own and leave its results on disk.

Tests and benchmarks that kill or compare crawls start it as
``python -m scrapy_openclaw.testing.runcrawl`` (see :func:`main`) and read
``DIR/items.jsonl``, ``DIR/stats.json`` and ``DIR/crawl.log`` afterwards.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import json
import sys
from pathlib import Path
from typing import Any

ITEMS_FILE = "items.jsonl"
STATS_FILE = "stats.json"
LOG_FILE = "crawl.log"

# Test-friendly defaults; the settings file overrides them.
#: seconds after the engine stopped before a process still running dumps its threads' stacks
STUCK_AFTER = 20.0
DEFAULT_SETTINGS: dict[str, Any] = {
    "LOG_LEVEL": "INFO",
    "TELNETCONSOLE_ENABLED": False,
    # every test crawl meets the chaos site's hosts (the same 127.0.0.x names) as strangers;
    # a test of site memory turns it on
    "OPENCLAW_SITES_ENABLED": False,
}


def json_safe(value: Any) -> Any:
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [json_safe(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


def _spider_args(pairs: list[str]) -> dict[str, str]:
    args = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"-a expects key=value, got {pair!r}")
        args[key] = value
    return args


def _dump_stacks_if_stuck() -> None:
    faulthandler.dump_traceback_later(STUCK_AFTER, repeat=True, file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Run the crawl the command line describes; 0 when it closed normally, 1 when it never finished.

        python -m scrapy_openclaw.testing.runcrawl --spider PATH.TO.Spider \\
            --settings-json FILE --out DIR [-a key=value ...]

    Writes ``DIR/items.jsonl`` (feed export), ``DIR/stats.json`` (final stats) and
    ``DIR/crawl.log``; with ``--profile FILE`` the crawl runs under cProfile, its stats
    dumped to FILE. Any finish reason counts as closing normally.
    """
    parser = argparse.ArgumentParser(prog="python -m scrapy_openclaw.testing.runcrawl")
    parser.add_argument("--spider", required=True, help="import path of the spider class")
    parser.add_argument("--settings-json", help="JSON file with a settings dict")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("-a", dest="spider_args", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--profile", metavar="FILE", help="run the crawl under cProfile, dump its stats here")
    args = parser.parse_args(argv)

    from scrapy import signals
    from scrapy.crawler import CrawlerProcess
    from scrapy.utils.misc import load_object

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = dict(DEFAULT_SETTINGS)
    if args.settings_json:
        settings.update(json.loads(Path(args.settings_json).read_text(encoding="utf-8")))
    feeds = dict(settings.get("FEEDS") or {})
    feeds[(out / ITEMS_FILE).as_uri()] = {"format": "jsonlines", "overwrite": True, "encoding": "utf-8"}
    settings["FEEDS"] = feeds
    settings["LOG_FILE"] = str(out / LOG_FILE)
    settings["LOG_FILE_APPEND"] = False

    process = CrawlerProcess(settings)
    crawler = process.create_crawler(load_object(args.spider))
    # A process that does not exit after its crawl is a bug to find: from 20 s after the engine
    # stopped, every thread's stack goes to stderr (stderr.log) every 20 s until it exits.
    crawler.signals.connect(_dump_stacks_if_stuck, signal=signals.engine_stopped)
    process.crawl(crawler, **_spider_args(args.spider_args))
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.runcall(process.start)
        profiler.dump_stats(args.profile)
    else:
        process.start()
    faulthandler.cancel_dump_traceback_later()
    stats = json_safe(crawler.stats.get_stats() if crawler.stats else {})
    (out / STATS_FILE).write_text(json.dumps(stats, indent=1, sort_keys=True), encoding="utf-8")
    return 0 if "finish_reason" in stats else 1


if __name__ == "__main__":
    sys.exit(main())
