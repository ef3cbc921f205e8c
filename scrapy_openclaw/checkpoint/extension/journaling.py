"""Group commit and snapshots: what the checkpoint writes, in the order that keeps any prefix consistent.

New requests, then the durable feeds' bytes, then one "done" record with
their offsets; a snapshot compacts it all into a new generation (its file
written by :mod:`..snapshotter`).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from scrapy_openclaw.checkpoint import records
from scrapy_openclaw.checkpoint.journal import JournalWriter
from scrapy_openclaw.checkpoint.refusal import DiskRefusal, refuses
from scrapy_openclaw.checkpoint.restore import health_registry
from scrapy_openclaw.checkpoint.snapshotter import Snapshotter, json_copy, json_safe_stats
from scrapy_openclaw.checkpoint.state import journal_path

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from scrapy.crawler import Crawler

    from scrapy_openclaw.checkpoint.feeds import DurableFeeds
    from scrapy_openclaw.checkpoint.state import RecoveredState
    from scrapy_openclaw.checkpoint.tracker import RequestTracker

logger = logging.getLogger(__name__)


class CheckpointWriter:
    """The checkpoint's writing side: it owns the journal, the snapshot writer, the generation
    and the durable outputs' recorded offsets; it reads the tracker's changes and the feeds."""

    def __init__(
        self,
        crawler: Crawler,
        directory: Path,
        crawl_id: str,
        tracker: RequestTracker,
        feeds: DurableFeeds,
        recovered: RecoveredState,
        outputs: dict[str, dict[str, Any]],
        *,
        flush_interval: float,
        snapshot_records: int,
        write_file: Callable[..., int],
    ):
        self.crawler = crawler
        self.stats = crawler.stats
        self.dir = directory
        self.crawl_id = crawl_id
        self.tracker = tracker
        self.feeds = feeds
        self.outputs = outputs  # (the feeds were activated with them) as the journal recorded them
        self.flush_interval = flush_interval
        self.snapshot_records = snapshot_records
        self.snapshotter = Snapshotter(directory, self.stats, write_file, recovered.snapshot_gen)
        self.snapshotter.on_refused = self._refused
        self.gen = recovered.next_generation
        self.journal = self._new_journal(self.gen)
        self.records_since_snapshot = 0
        self.last_fsync = time.monotonic()
        self.closed = False  # at spider_closed: no periodic snapshot from then on

    def _new_journal(self, gen: int) -> JournalWriter:
        return JournalWriter(
            journal_path(self.dir, gen),
            {
                "gen": gen,
                "crawl_id": self.crawl_id,
                "spider": getattr(self.crawler.spidercls, "name", None),
                "created": time.time(),
            },
            on_refused=self._refused,
        )

    def _refused(self, path: Path | str, exc: OSError) -> None:
        DiskRefusal.for_crawler(self.crawler).report(path, exc)

    def commit(self, *, may_snapshot: bool = True, force_fsync: bool = False) -> bool:
        """Journal what happened since the last commit and fsync it (group commit).

        Order: the outputs' starting points; new and changed requests; then the
        durable outputs are written (and fsynced with the journal), then one
        "done" record with their offsets.
        """
        now = time.monotonic()
        fsync = force_fsync or now - self.last_fsync >= self.flush_interval
        if not self._journal_output_bases():
            return False  # nothing else is written while the journal cannot be (outputs stay in memory)
        payloads = self.tracker.take_changes()
        done = self._done_record(fsync)
        if done is not None:
            payloads.append(done)
        if payloads:
            self.journal.extend(payloads)
            self.records_since_snapshot += len(payloads)
            self.stats.inc_value("openclaw/checkpoint/journal_records", len(payloads))
        ok = self.journal.flush(fsync=fsync) if self.journal.buffered or fsync else True
        if fsync and ok:
            self.last_fsync = now
        self.stats.set_value("openclaw/checkpoint/live", len(self.tracker.live))
        if may_snapshot and self.snapshot_records and self.records_since_snapshot >= self.snapshot_records:
            self.periodic_snapshot()
        return ok

    def _journal_output_bases(self) -> bool:
        """Put new outputs' starting points on disk before any of their bytes; False if the
        journal cannot be written."""
        bases = self.feeds.bases()
        if bases:
            self.journal.append(records.outputs_record(bases))
            self.outputs.update(bases)
            self.feeds.recorded(bases)
        return not self.journal.buffered or self.journal.flush(fsync=True)

    def _done_record(self, fsync: bool) -> str | None:
        """Write the durable outputs, then the record of the pages done with their offsets
        (None when nothing is done, or when the outputs could not be written: those pages
        stay not-done until a later commit writes their items)."""
        try:
            outputs = self.feeds.sync(fsync)
        except OSError as exc:
            self.stats.inc_value("openclaw/checkpoint/feed_errors")
            if refuses(exc):
                self._refused(exc.filename or self.dir, exc)
                return None
            logger.error(
                "Checkpoint: cannot write the durable feeds (%(error)s); retrying at the next commit", {"error": exc}
            )
            return None
        changed = {k: v for k, v in outputs.items() if self.outputs.get(k) != v}
        done, seen = self.tracker.take_done()
        if not (changed or done or seen):
            return None
        if changed:
            self.outputs.update(changed)
            self.feeds.recorded(changed)
        return records.done_record(done, seen, changed)

    def periodic_snapshot(self) -> None:
        if not self.closed and not self.writing:
            self.snapshot(background=True)

    @property
    def writing(self) -> bool:
        """A snapshot file is being written by its thread."""
        return self.snapshotter.writing

    def join(self) -> None:
        """Wait for the snapshot being written, if any."""
        self.snapshotter.join()

    def snapshot(
        self,
        *,
        finished: bool = False,
        reason: str | None = None,
        final: bool = False,
        background: bool = False,
    ) -> bool:
        """Compact the state into a new snapshot generation; False if it could not be written.

        The state is cut on the reactor thread (a copy of the live requests and
        fingerprints) and the journal moves on to the new generation at once.
        *background* leaves the file to a thread (see :mod:`.snapshotter`);
        True is returned at once.
        """
        self.join()  # one at a time, in generation order
        self.commit(may_snapshot=False, force_fsync=True)  # outputs too: the snapshot names their offsets
        if not self.journal.flush():  # the disk refuses even the journal: keep its records, skip
            self.stats.inc_value("openclaw/checkpoint/snapshot_errors")
            if not DiskRefusal.for_crawler(self.crawler).stopped:  # (that one said it all)
                logger.error(
                    "Checkpoint %(dir)s: snapshot skipped, the journal cannot be written either", {"dir": self.dir}
                )
            return False
        gen = self.gen + 1
        header = self._snapshot_header(gen, finished, reason)
        requests, fingerprints = self.tracker.requests(), list(self.tracker.seen)
        self.journal.close()  # empty: everything in it is also in this snapshot
        self.gen = gen
        self.records_since_snapshot = 0
        if not final:
            try:
                self.journal = self._new_journal(gen)
            except OSError as exc:
                if not refuses(exc):
                    raise
                self._refused(journal_path(self.dir, gen), exc)  # (the closed journal takes no more writes)
        return self.snapshotter.write(gen, header, requests, fingerprints, background=background)

    def _snapshot_header(self, gen: int, finished: bool, reason: str | None) -> dict[str, Any]:
        return {
            "gen": gen,
            "crawl_id": self.crawl_id,
            "created": time.time(),
            "finished": finished,
            "reason": reason,
            "next_id": self.tracker.next_id,
            "spider": getattr(self.crawler.spider, "name", None),
            "stats": json_safe_stats(self.stats.get_stats()),
            "health": self._health_snapshot(),
            "start_fingerprints": sorted(fp.hex() for fp in self.tracker.start_seen),
            "outputs": json_copy(self.outputs),  # as the journal recorded them
        }

    def _health_snapshot(self) -> Any:
        registry = health_registry(self.crawler)
        if registry is None:
            return None
        try:
            return json_copy(registry.snapshot())  # a copy: it may be written by a thread
        except (TypeError, ValueError) as exc:
            logger.warning(
                "Checkpoint: the health registry's snapshot is not JSON-safe (%(error)s); not saved", {"error": exc}
            )
            return None
