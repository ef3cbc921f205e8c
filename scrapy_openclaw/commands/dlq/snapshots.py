"""The error snapshots shown beside dead letters: those of one record's signature, or a spider's table.

Snapshots live beside the dead-letter store; ``--uri`` moves both, so the
snapshot directory is looked up with the command's URI, not the project's.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from scrapy_openclaw.commands.dlq.reading import StoreAccess
from scrapy_openclaw.commands.dlq.text import _when, format_table

if TYPE_CHECKING:
    import argparse

    from scrapy_openclaw.deadletter import DeadLetter
    from scrapy_openclaw.dlq.stores import DeadLetterStore


class SnapshotViews(StoreAccess):
    """Part of the openclaw-dlq command: the error snapshots ``show`` and ``stats`` print."""

    def _snapshot_dir(self, spider: str) -> Any:
        from scrapy_openclaw.dlq.snapshots import snapshot_dir

        return snapshot_dir(self.config, spider, getattr(self, "_uri", None))

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
