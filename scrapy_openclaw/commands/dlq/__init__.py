"""``scrapy openclaw-dlq``: inspect, replay and purge dead letters.

The command (options, dispatch) is here; its parts are :mod:`.reading` (the
store(s) and filters), :mod:`.inspecting` (list, show, stats, purge),
:mod:`.snapshots`, :mod:`.replay` and :mod:`.text` (terminal output).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from scrapy.commands import BaseRunSpiderCommand
from scrapy.exceptions import UsageError

from scrapy_openclaw.commands.dlq.inspecting import InspectSubcommands
from scrapy_openclaw.commands.dlq.reading import _store_errors
from scrapy_openclaw.commands.dlq.replay import ReplaySubcommand
from scrapy_openclaw.commands.dlq.text import BODY_PREVIEW, format_table, parse_time, readable
from scrapy_openclaw.dlq.stores import default_uri
from scrapy_openclaw.exceptions import OpenClawConfigError
from scrapy_openclaw.redact import mask_uri
from scrapy_openclaw.settings import OpenClawSettings

if TYPE_CHECKING:
    import argparse

__all__ = ["BODY_PREVIEW", "SUBCOMMANDS", "Command", "format_table", "parse_time", "readable"]

SUBCOMMANDS = ("list", "show", "stats", "replay", "purge")


class Command(InspectSubcommands, ReplaySubcommand, BaseRunSpiderCommand):
    # BaseRunSpiderCommand: replay takes scrapy crawl's -a, -o and -O (FEEDS), parsed by Scrapy's own code
    requires_project = True
    # Only replay runs a crawl (and makes its own process): the other
    # subcommands print their own output, no Scrapy start banner.
    requires_crawler_process = False

    def syntax(self) -> str:
        return "[options] list [SPIDER]|show ID|stats [SPIDER]|replay SPIDER|purge [SPIDER]"

    def short_desc(self) -> str:
        return "Inspect, replay and purge scrapy-openclaw dead letters"

    def long_desc(self) -> str:
        return (
            "Inspect, replay and purge dead letters (requests and items a crawl gave up on). "
            "list: a table of dead letters; show ID: one record as JSON (an id prefix is enough), with the "
            "error snapshots of its signature; stats: counts by domain and error class, and the error snapshots; replay SPIDER: a new crawl of SPIDER that "
            "starts from the selected dead letters, one request per URL (the newest record), "
            "protocol_permanent and domain_down only with --class or --all; records are marked "
            "in place (replayed at, outcome) and a page that fails again updates its record "
            "(--include-replayed to send replayed ones again, --dry-run to list what would be sent); purge: delete the selected dead letters (asks unless --yes). "
            "Filters: --domain, --class, --since/--until, --spider."
        )

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        group = parser.add_argument_group(title="Dead letters")
        group.add_argument("--uri", help="dead-letter store (default: the project's OPENCLAW_DLQ_URI)")
        group.add_argument("--spider", help="only dead letters of this spider (fills %%(name)s)")
        group.add_argument(
            "--domain",
            help="only dead letters of this domain (its download-slot key: the host name unless download_slot says otherwise)",
        )
        group.add_argument(
            "--class", dest="error_class", help="only this error class (network, protocol_permanent, business, ...)"
        )
        group.add_argument("--since", help="created at or after: UNIX time, ISO date/time, or age (30m, 2h, 1d)")
        group.add_argument("--until", help="created at or before (same forms as --since)")
        group.add_argument(
            "--include-replayed", action="store_true", help="replay: also send dead letters replayed before"
        )
        group.add_argument(
            "--all",
            dest="replay_all",
            action="store_true",
            help="replay: also protocol_permanent and domain_down dead letters",
        )
        group.add_argument("--dry-run", action="store_true", help="replay: list what would be sent, send nothing")
        group.add_argument(
            "--raw",
            action="store_true",
            help="show: the record as stored (base64 bytes, engine meta, traceback in one string)",
        )
        group.add_argument("--limit", type=int, default=0, help="list: show at most this many (newest)")
        group.add_argument("-y", "--yes", action="store_true", help="purge: do not ask for confirmation")

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        unknown = [a for a in args if a.startswith("-")]
        if unknown:
            raise UsageError(f"unknown option(s): {' '.join(unknown)}")
        if not args or args[0] not in SUBCOMMANDS:
            raise UsageError(f"expected one of: {', '.join(SUBCOMMANDS)}")
        sub, rest = args[0], args[1:]
        try:  # records are sealed and read with the project's store key (OpenClawSettings configures it)
            self.config = OpenClawSettings.from_settings(self.settings)
        except OpenClawConfigError as exc:
            raise UsageError(str(exc), print_help=False) from None
        if sub in ("list", "stats", "purge") and len(rest) == 1:  # list SPIDER = list --spider SPIDER
            if opts.spider and opts.spider != rest[0]:
                raise UsageError(f"{sub} {rest[0]}: --spider {opts.spider} names another spider", print_help=False)
            opts.spider, rest = rest[0], []
        expected = 1 if sub in ("show", "replay") else 0
        if len(rest) != expected:
            raise UsageError(f"{sub}: expected {expected} argument(s), got {len(rest)}")
        try:
            getattr(self, f"_run_{sub}")(opts, *rest)
        except _store_errors() as exc:
            uri = opts.uri or default_uri(self.config.dlq_uri)
            spider = opts.spider or (rest[0] if sub == "replay" else None)
            uri = mask_uri(uri % {"name": spider} if spider and "%(name)s" in uri else uri.replace("%(name)s", "*"))
            print(f"cannot read the dead-letter store {uri}: {mask_uri(exc)}", file=sys.stderr)
            self.exitcode = 1
