"""``scrapy openclaw-dlq``: inspect, replay and purge dead letters.

Works on every store (jsonl file or Redis stream). The store defaults to the
project's ``OPENCLAW_DLQ_URI`` (or the default location); ``--uri`` overrides
it. A URI with ``%(name)s`` is filled from ``--spider``, or, without it, from
every spider of the project that has dead letters.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections import Counter
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError
from scrapy.utils.conf import arglist_to_dict

from scrapy_openclaw.dlq.stores import (
    DeadLetterStore,
    Filters,
    JsonlStore,
    default_uri,
    open_store,
)
from scrapy_openclaw.redact import mask_uri

if TYPE_CHECKING:
    import argparse

    from scrapy_openclaw.deadletter import DeadLetter

SUBCOMMANDS = ("list", "show", "stats", "replay", "purge")
_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_time(value: str, option: str) -> float:
    """A UNIX time from ``1700000000``, an ISO date/time (UTC unless given) or ``2h`` (ago)."""
    value = value.strip()
    match = _RELATIVE.match(value)
    if match:
        return time.time() - float(match.group(1)) * _UNITS[match.group(2)]
    try:
        return float(value)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise UsageError(
            f"{option} {value!r}: expected a UNIX time, an ISO date/time or an age like 30m, 2h, 1d",
            print_help=False,
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def _when(ts: float | None) -> str:
    if not ts:
        return "-"
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _printable(text: str) -> str:
    """Stored text is untrusted: no control characters (terminal escapes) reach the terminal."""
    return "".join(ch if ch.isprintable() else "?" for ch in text)


#: How much of a request body ``show`` prints.
BODY_PREVIEW = 500


def _text(value: Any) -> Any:
    """Stored bytes (``{"__bytes__": base64}``) as text, lists of one value as the value."""
    from scrapy_openclaw.serialization import decode_value

    try:
        value = decode_value(value)
    except Exception:  # a display helper: show what is stored
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, list):
        values = [_text(v) for v in value]
        return values[0] if len(values) == 1 else values
    return value


def readable(data: dict[str, Any]) -> dict[str, Any]:
    """A stored record for a person: headers and body decoded, engine meta, defaults and empty
    fields left out, times in UTC, the traceback as lines."""
    from scrapy_openclaw.deadletter import ENGINE_META

    out = {k: v for k, v in data.items() if v is not None}
    request = data.get("request")
    if isinstance(request, dict):
        shown: dict[str, Any] = {"method": request.get("method"), "url": request.get("url")}
        headers = request.get("headers")
        if isinstance(headers, dict) and headers:
            shown["headers"] = {str(k): _text(v) for k, v in headers.items()}
        body = _text(request.get("body"))
        if body:
            text = str(body)
            shown["body"] = text[:BODY_PREVIEW] + (f"... ({len(text)} characters)" if len(text) > BODY_PREVIEW else "")
        meta = request.get("meta")
        if isinstance(meta, dict):
            meta = {k: v for k, v in meta.items() if k not in ENGINE_META}
            if meta:
                shown["meta"] = meta
        for name in ("callback", "errback", "cb_kwargs", "cookies", "priority", "flags", "_class"):
            if request.get(name) not in (None, {}, [], 0):
                shown[name] = request[name]
        out["request"] = shown
    if isinstance(data.get("traceback"), str):
        out["traceback"] = data["traceback"].rstrip("\n").splitlines()
    for name in ("first_attempt_at", "last_attempt_at", "created_at", "replayed_at"):
        if isinstance(data.get(name), (int, float)):
            out[name] = _when(data[name]) + " UTC"
    return out


def format_table(rows: list[list[str]], headers: list[str]) -> str:
    rows = [[_printable(cell) for cell in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines)


def _store_errors() -> tuple[type[BaseException], ...]:
    """What an unreachable or unreadable store raises: a message, not a traceback."""
    try:
        from redis.exceptions import RedisError
    except ImportError:
        return (OSError,)
    return (OSError, RedisError)


def _where(stores: list[DeadLetterStore], uri: str) -> str:
    """The real places several stores read as one are, for messages (never a ``%(name)s`` template)."""
    if not stores:
        return mask_uri(uri.replace("%(name)s", "*"))
    return ", ".join(store.uri for store in stores)


class _Stores(DeadLetterStore):
    """Several stores read as one (one file per spider under a ``%(name)s`` URI)."""

    def __init__(self, stores: list[DeadLetterStore], uri: str):
        self.stores, self.uri = stores, uri

    @property
    def skipped(self) -> dict[str, str]:
        return {where: why for store in self.stores for where, why in store.skipped.items()}

    def append(self, record: DeadLetter) -> None:  # pragma: no cover - read-only view
        raise NotImplementedError

    def iter(self, filters: Filters = Filters()) -> Any:
        for store in self.stores:
            yield from store.iter(filters)

    def replayed(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for store in self.stores:
            out.update(store.replayed())
        return out

    def mark_replayed(self, ids: Any) -> int:
        ids = list(ids)
        return sum(store.mark_replayed(ids) for store in self.stores)

    def update(self, records: Any) -> int:
        records = list(records)
        return sum(store.update(records) for store in self.stores)

    def purge(self, filters: Filters = Filters()) -> int:
        return sum(store.purge(filters) for store in self.stores)

    def close(self) -> None:
        for store in self.stores:
            store.close()


class _WithUri:
    """Settings view whose OPENCLAW_DLQ_URI is the one the command reads (``--uri``)."""

    def __init__(self, settings: Any, uri: str | None):
        self._settings, self._uri = settings, uri

    def get(self, name: str, default: Any = None) -> Any:
        if name == "OPENCLAW_DLQ_URI" and self._uri:
            return self._uri
        return self._settings.get(name, default)


def _crawler_process(settings: Any) -> Any:
    """The crawler process ``scrapy`` itself would make for a crawl command."""
    from scrapy.crawler import AsyncCrawlerProcess, CrawlerProcess

    asyncio_reactor = "twisted.internet.asyncioreactor.AsyncioSelectorReactor"
    if (
        settings["TWISTED_REACTOR"] == asyncio_reactor and not settings.getbool("FORCE_CRAWLER_PROCESS")
    ) or not settings.getbool("TWISTED_REACTOR_ENABLED", True):
        return AsyncCrawlerProcess(settings)
    return CrawlerProcess(settings)


class Command(ScrapyCommand):
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
        group.add_argument("--domain", help="only dead letters of this domain (host name)")
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
        group.add_argument(
            "-a",
            dest="spargs",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="replay: set a spider argument (may be repeated)",
        )

    def process_options(self, args: list[str], opts: argparse.Namespace) -> None:
        super().process_options(args, opts)
        try:
            opts.spargs = arglist_to_dict(opts.spargs)
        except ValueError:
            raise UsageError("Invalid -a value, use -a NAME=VALUE", print_help=False) from None

    # ------------------------------------------------------------------ plumbing

    def _filters(
        self, opts: argparse.Namespace, *, spider: str | None = None, include_replayed: bool = True
    ) -> Filters:
        return Filters(
            domain=opts.domain,
            error_class=opts.error_class,
            spider=spider or opts.spider,
            since=parse_time(opts.since, "--since") if opts.since else None,
            until=parse_time(opts.until, "--until") if opts.until else None,
            include_replayed=include_replayed,
        )

    def _open(self, opts: argparse.Namespace, spider: str | None = None) -> DeadLetterStore:
        assert self.settings is not None
        uri = opts.uri or default_uri(self.settings)
        self._uri = uri  # error snapshots live beside it
        spider = spider or opts.spider
        try:
            if spider is not None or "%(" not in uri:
                return open_store(uri, spider=spider)
            from scrapy.spiderloader import get_spider_loader

            stores: list[DeadLetterStore] = []
            for name in sorted(get_spider_loader(self.settings).list()):
                store = open_store(uri, spider=name)
                if isinstance(store, JsonlStore) and not store.path.exists():
                    continue
                stores.append(store)
            return _Stores(stores, _where(stores, uri))
        except ValueError as exc:
            raise UsageError(str(exc), print_help=False) from None

    def _report_skipped(self, store: DeadLetterStore) -> int:
        """Say how many unreadable records were skipped (each was logged); returns the count."""
        n = len(store.skipped)
        if n:
            print(
                f"warning: skipped {n} unreadable dead-letter record(s) in {store.uri} "
                "(each is named in a warning above)",
                file=sys.stderr,
            )
        return n

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        unknown = [a for a in args if a.startswith("-")]
        if unknown:
            raise UsageError(f"unknown option(s): {' '.join(unknown)}")
        if not args or args[0] not in SUBCOMMANDS:
            raise UsageError(f"expected one of: {', '.join(SUBCOMMANDS)}")
        sub, rest = args[0], args[1:]
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
            uri = opts.uri or default_uri(self.settings)
            spider = opts.spider or (rest[0] if sub == "replay" else None)
            uri = mask_uri(uri % {"name": spider} if spider and "%(name)s" in uri else uri.replace("%(name)s", "*"))
            print(f"cannot read the dead-letter store {uri}: {mask_uri(exc)}", file=sys.stderr)
            self.exitcode = 1

    # ------------------------------------------------------------------ subcommands

    def _run_list(self, opts: argparse.Namespace) -> None:
        store = self._open(opts)
        replayed = store.replayed()
        records = list(store.iter(self._filters(opts)))
        if opts.limit > 0:
            records = sorted(records, key=lambda r: r.created_at)[-opts.limit :]
        rows = [
            [
                r.id[:12],
                _when(r.created_at),
                r.spider,
                r.error_class,
                r.reason,
                str(r.status) if r.status is not None else "-",
                str(r.attempts),
                (r.replay_outcome or "yes") if r.id in replayed else "",
                r.url or "-",
            ]
            for r in records
        ]
        print(
            format_table(
                rows, ["ID", "CREATED (UTC)", "SPIDER", "CLASS", "REASON", "STATUS", "ATTEMPTS", "REPLAYED", "URL"]
            )
        )
        print(f"{len(rows)} dead letter(s) in {store.uri}")
        self._report_skipped(store)
        store.close()

    def _run_show(self, opts: argparse.Namespace, id_: str) -> None:
        store = self._open(opts)
        record = store.get(id_)
        if record is None and len(id_) < 32:  # a prefix, as printed by list
            found = [r for r in store.iter(self._filters(opts)) if r.id.startswith(id_)]
            if len(found) > 1:
                raise UsageError(f"id prefix {id_!r} is ambiguous ({len(found)} dead letters)", print_help=False)
            record = found[0] if found else None
        if record is None:
            self._report_skipped(store)
            print(f"no dead letter {_printable(repr(id_))} in {store.uri}", file=sys.stderr)
            self.exitcode = 1
            return
        data = record.to_dict()
        data["replayed_at"] = store.replayed().get(record.id)
        if not opts.raw:
            data = readable(data)
            data["snapshots"] = self._snapshots_of(record)
        print(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False))
        self._report_skipped(store)
        store.close()

    def _run_stats(self, opts: argparse.Namespace) -> None:
        store = self._open(opts)
        stats = store.stats(self._filters(opts))
        print(f"{stats['total']} dead letter(s) in {store.uri} ({stats['replayed']} replayed)")
        for title, counts in (("CLASS", stats["by_class"]), ("DOMAIN", stats["by_domain"])):
            print()
            print(format_table([[k, str(v)] for k, v in counts.items()], [title, "COUNT"]))
        self._print_snapshots(store, opts)
        self._report_skipped(store)
        store.close()

    # ------------------------------------------------------------------ error snapshots

    def _snapshot_dir(self, spider: str) -> Any:
        from scrapy_openclaw.dlq.snapshots import snapshot_dir

        assert self.settings is not None
        return snapshot_dir(_WithUri(self.settings, getattr(self, "_uri", None)), spider)

    def _snapshots_of(self, record: DeadLetter) -> list[dict[str, Any]]:
        """The snapshots filed under the record's signature (class, status, exception, domain)."""
        from scrapy_openclaw.dlq.snapshots import signature_of, snapshots_by_signature

        try:
            found = snapshots_by_signature(self._snapshot_dir(record.spider)).get(signature_of(record), [])
        except ValueError:
            return []
        return [
            {
                "path": m["path"],
                "body": m.get("body_path"),
                "status": m.get("status"),
                "url": m.get("url"),
                "captured_at": _when(m.get("captured_at")) + " UTC",
                "body_bytes": m.get("body_bytes"),
                "truncated": m.get("truncated"),
            }
            for m in found
        ]

    def _print_snapshots(self, store: DeadLetterStore, opts: argparse.Namespace) -> None:
        """A table of the error snapshots of the spiders whose dead letters were counted."""
        from scrapy_openclaw.dlq.snapshots import snapshots_by_signature

        spiders = {opts.spider} if opts.spider else {r.spider for r in store.iter(self._filters(opts))}
        for spider in sorted(s for s in spiders if s):
            try:
                directory = self._snapshot_dir(spider)
            except ValueError:
                continue
            found = snapshots_by_signature(directory)
            if not found:
                continue
            rows = [
                [
                    sig[0],
                    sig[1] or "-",
                    sig[2] or "-",
                    sig[3] or "-",
                    str(len(metas)),
                    os.path.basename(metas[0]["path"]),
                ]
                for sig, metas in sorted(found.items())
            ]
            print()
            print(f"error snapshots of {spider} in {directory}:")
            print(format_table(rows, ["CLASS", "STATUS", "EXCEPTION", "DOMAIN", "SNAPSHOTS", "FIRST"]))

    def _run_purge(self, opts: argparse.Namespace) -> None:
        store = self._open(opts)
        filters = self._filters(opts)
        n = sum(1 for _ in store.iter(filters))
        if n == 0:
            print(f"nothing to purge in {store.uri}")
            self._report_skipped(store)
            return
        if not opts.yes:
            try:
                answer = input(f"Purge {n} dead letter(s) from {store.uri}? [y/N] ")
            except EOFError:
                answer = ""
            if answer.strip().lower() not in ("y", "yes"):
                print("aborted; nothing purged")
                self.exitcode = 1
                return
        purged = store.purge(filters)
        print(f"purged {purged} dead letter(s) from {store.uri}")
        self._report_skipped(store)
        store.close()

    def _run_replay(self, opts: argparse.Namespace, spider: str) -> None:
        from scrapy_openclaw.dlq.replay import PLAN_KEY, ReplayPlan, ReplayStartMiddleware, select
        from scrapy_openclaw.runtime import shared

        if opts.spider and opts.spider != spider:
            raise UsageError(f"replay {spider}: --spider {opts.spider} names another spider", print_help=False)
        store = self._open(opts, spider=spider)
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
        if not records:
            print(f"nothing to replay for {spider} in {store.uri}")
            return
        if opts.dry_run:
            rows = [[r.id[:12], r.error_class, r.reason, r.method, r.url] for r in records]
            print(format_table(rows, ["ID", "CLASS", "REASON", "METHOD", "URL"]))
            print(f"would replay {len(records)} dead letter(s) of {spider} from {store.uri} (dry run: nothing sent)")
            store.close()
            return
        self.crawler_process = _crawler_process(self.settings)
        # Set on the process's settings before the crawler copies them (the
        # process merges its settings into the crawler again when it starts it).
        self.crawler_process.settings.set_in_component_priority_dict("SPIDER_MIDDLEWARES", ReplayStartMiddleware, 990)
        try:
            crawler = self.crawler_process.create_crawler(spider)
        except KeyError as exc:
            raise UsageError(str(exc), print_help=False) from None
        plan = shared(crawler, PLAN_KEY, lambda: ReplayPlan(store, records, duplicates))
        self.crawler_process.crawl(crawler, **opts.spargs)
        self.crawler_process.start()
        if getattr(self.crawler_process, "bootstrap_failed", False):
            self.exitcode = 1
        recovered = plan.finish()
        print(
            f"replayed {len(plan.injected)} dead letter(s) of {spider} from {store.uri}: "
            f"{recovered} recovered, {len(plan.failed)} failed again"
            + (f"; skipped {len(plan.skipped)} that could not be rebuilt or were refused" if plan.skipped else "")
        )
        for id_, why in plan.skipped.items():
            print(f"  skipped {id_}: {_printable(why)}", file=sys.stderr)
        if plan.skipped or len(plan.injected) < len(records):
            self.exitcode = 1
        store.close()
