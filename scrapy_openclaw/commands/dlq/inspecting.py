"""The ``list``, ``show``, ``stats`` and ``purge`` subcommands: reading and deleting stored dead letters."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

from scrapy.exceptions import UsageError

from scrapy_openclaw.commands.dlq.snapshots import SnapshotViews
from scrapy_openclaw.commands.dlq.text import _printable, _when, format_table, masked, readable
from scrapy_openclaw.redact import mask_uri

if TYPE_CHECKING:
    import argparse


class InspectSubcommands(SnapshotViews):
    """Part of the openclaw-dlq command: list, show, stats and purge."""

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
        data = masked(record.to_dict())  # credentials never printed, --raw included
        data["replayed_at"] = store.replayed().get(record.id)
        if not opts.raw:
            data = readable(data)
            data["snapshots"] = self._snapshots_of(record)
        print(mask_uri(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False)))
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
