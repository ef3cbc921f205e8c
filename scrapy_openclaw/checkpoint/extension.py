"""CheckpointExtension: crash-safe checkpoint and resume (``OPENCLAW_CHECKPOINT_DIR``).

A request is *live* from the moment the scheduler accepts it (or
:class:`~scrapy_openclaw.delay.DelayedRequests` holds it) until the engine
slot forgets it, which happens only after its download, callback or errback,
the scheduling of every request it yielded and the pipelines of every item
(:class:`~scrapy_openclaw.lifecycle.RequestLifecycle`; without that engine
hook the extension refuses to run rather than silently lose requests).

Live requests are journaled with group commit: each batch writes new
requests before "done" marks, so any prefix of it that survives a ``kill -9``
is consistent, and the "done" record is written after the durable feeds
(``feeds.py``) were written and fsynced, carrying their offsets: a page is
done exactly when its items are in the feeds. Snapshots (periodic and at
close) compact everything into one atomic file.

The parts: ``tracker.py`` (live requests, no I/O), ``records.py`` (the record
format), ``journal.py`` (appending), ``snapshot.py`` and ``snapshotter.py``
(snapshot files and writing them), ``restore.py`` (opening the directory,
putting a crawl back); this module wires them to the crawl. The state is read
in ``from_crawler`` (:meth:`CheckpointExtension.open`), so the crawl id is
back before other components are built.

JOBDIR is refused: Scrapy would restore its own queue and ``requests.seen``
next to ours, and its duplicate filter would drop our restored requests.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.dupefilters import BaseDupeFilter
from scrapy.exceptions import DontCloseSpider, NotConfigured
from scrapy.utils.asyncio import create_looping_call
from scrapy.utils.misc import load_object

from scrapy_openclaw import runtime
from scrapy_openclaw.checkpoint import records
from scrapy_openclaw.checkpoint.feeds import DurableFeeds
from scrapy_openclaw.checkpoint.journal import JournalWriter
from scrapy_openclaw.checkpoint.restore import Restorer, health_registry, open_directory
from scrapy_openclaw.checkpoint.snapshot import write_snapshot
from scrapy_openclaw.checkpoint.snapshotter import Snapshotter, json_copy, json_safe_stats
from scrapy_openclaw.checkpoint.state import journal_path
from scrapy_openclaw.checkpoint.tracker import RequestTracker
from scrapy_openclaw.exceptions import OpenClawConfigError
from scrapy_openclaw.lifecycle import RequestLifecycle
from scrapy_openclaw.serialization import SerializationError, dumps, request_to_data
from scrapy_openclaw.settings import OpenClawSettings

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler

    from scrapy_openclaw.checkpoint.restore import Note
    from scrapy_openclaw.checkpoint.state import RecoveredState

logger = logging.getLogger(__name__)

#: Seconds between journal writes to the OS (fsync follows OPENCLAW_CHECKPOINT_FLUSH).
WRITE_INTERVAL = 0.1


def _write_file(*args: Any) -> int:
    return write_snapshot(*args)  # looked up at each call (tests slow it down or fail it)


class CheckpointExtension:
    """Journals the crawl's live requests and snapshots them; resumes a crawl from them."""

    def __init__(self, crawler: Crawler):
        settings = crawler.settings
        config = OpenClawSettings.for_crawler(crawler)
        directory = config.checkpoint_dir
        if not directory:
            raise NotConfigured
        if settings.get("JOBDIR"):
            raise OpenClawConfigError(
                f"setting JOBDIR={settings.get('JOBDIR')!r}: cannot be combined with "
                f"OPENCLAW_CHECKPOINT_DIR={directory!r} (both would restore the queue and the "
                "seen requests and fight over them); unset JOBDIR, the checkpoint replaces it"
            )
        self.crawler = crawler
        self.stats = crawler.stats
        self.dir = Path(directory)
        self.flush_interval = config.checkpoint_flush
        self.snapshot_interval = config.checkpoint_snapshot_interval
        self.snapshot_records = config.checkpoint_snapshot_records
        self.restart = config.checkpoint_restart
        dupefilter = load_object(settings.get("DUPEFILTER_CLASS") or "scrapy.dupefilters.BaseDupeFilter")
        #: whether the crawl filters duplicates at all (BaseDupeFilter does not)
        self.filtering = isinstance(dupefilter, type) and dupefilter is not BaseDupeFilter
        self.tracker = RequestTracker(self._fingerprint, self._serialise, filtering=self.filtering)
        # Messages from construction are logged at spider_opened: the crawl's log
        # handlers (LOG_FILE) may not be installed yet while extensions are built.
        self._notes: list[Note] = []
        self.recovered: RecoveredState | None = None
        self.resumed = False
        self._restorer: Restorer | None = None
        self._records_since_snapshot = 0
        self._last_fsync = time.monotonic()
        self._closed = False
        self._loops: list[Any] = []
        self._outputs: dict[str, dict[str, Any]] = {}

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> CheckpointExtension:
        ext = cls(crawler)
        ext.open()
        return ext

    def open(self) -> None:
        """Lock and read the directory, restore the crawl id, start the journal, hook the crawl.

        Called from :meth:`from_crawler`: the crawl id must be back before
        other components are built.
        """
        crawler = self.crawler
        self._lock_fd, recovered = open_directory(self.dir, restart=self.restart, notes=self._notes)
        self.recovered = recovered if not recovered.empty else None
        self.resumed = self.recovered is not None
        self.crawl_id = self._restore_crawl_id(recovered.crawl_id if self.resumed else None)
        self.feeds = DurableFeeds.for_crawler(crawler)
        self._outputs = dict(recovered.outputs) if self.resumed else {}
        self.feeds.activate(self._outputs, self.resumed)
        self._warn_plain_feed_exporter()
        if self.recovered is not None:
            self._restorer = Restorer(crawler, self.tracker, self.recovered, self.crawl_id)
        self.snapshotter = Snapshotter(self.dir, self.stats, _write_file, recovered.snapshot_gen)
        self.gen = recovered.next_generation
        self.journal = self._new_journal(self.gen)
        self.lifecycle = RequestLifecycle.for_crawler(crawler)
        self.lifecycle.listen(
            "OPENCLAW_CHECKPOINT_DIR",
            on_enqueued=self.tracker.enqueued,
            on_held=self.tracker.held,
            on_started=self._on_popped,
            on_finished=self._on_finished,
            admit=self._admit if self.tracker.filters_restored else None,
        )
        crawler.signals.connect(self.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(self.spider_idle, signal=signals.spider_idle)
        crawler.signals.connect(self.spider_closed, signal=signals.spider_closed)

    # --------------------------------------------------------------- setup

    def _restore_crawl_id(self, saved: str | None) -> str:
        if saved:
            current = runtime.peek(self.crawler, "crawl_id")
            if current is not None and current != saved:
                self._notes.append(
                    (
                        logging.WARNING,
                        "Crawl id %(current)s was read before the checkpoint restored %(saved)s",
                        {"current": current, "saved": saved},
                    )
                )
            runtime.shared(self.crawler, "crawl_id", lambda: saved)
        return runtime.crawl_id(self.crawler)

    def _new_journal(self, gen: int) -> JournalWriter:
        return JournalWriter(
            journal_path(self.dir, gen),
            {
                "gen": gen,
                "crawl_id": self.crawl_id,
                "spider": getattr(self.crawler.spidercls, "name", None),
                "created": time.time(),
            },
        )

    def _warn_plain_feed_exporter(self) -> None:
        settings = self.crawler.settings
        if not (settings.getdict("FEEDS") or settings.get("FEED_URI")):
            return
        from scrapy.extensions.feedexport import FeedExporter

        from scrapy_openclaw.checkpoint.feeds import DurableFeedExporter

        for path, order in settings.getwithbase("EXTENSIONS").items():
            cls = load_object(path) if isinstance(path, str) else path
            if order is not None and cls is FeedExporter:
                self._notes.append(
                    (
                        logging.WARNING,
                        "Checkpoint: Scrapy's FeedExporter is enabled, not %(ours)s: feed items may be lost or "
                        "duplicated after a crash (the add-on swaps it; or set EXTENSIONS yourself)",
                        {"ours": f"{DurableFeedExporter.__module__}.{DurableFeedExporter.__qualname__}"},
                    )
                )
                return

    # ------------------------------------------------------------ signals

    def spider_opened(self, spider: Spider) -> None:
        for level, message, args in self._notes:
            logger.log(level, message, args, extra={"spider": spider})
        self._notes.clear()
        if self.recovered is not None and self.recovered.dropped:
            self.stats.set_value("openclaw/checkpoint/dropped_records", self.recovered.dropped)
        self.lifecycle.install()  # refuses (OpenClawConfigError) when the engine has no slot hook
        if self._restorer is not None:
            self.stats.inc_value("openclaw/checkpoint/resumes")
            logger.info(
                "Resuming crawl %(crawl_id)s from checkpoint %(dir)s: %(n)d requests to restore, "
                "%(fps)d fingerprints seen",
                {
                    "crawl_id": self.crawl_id,
                    "dir": self.dir,
                    "n": len(self._restorer.queue),
                    "fps": len(self.tracker.seen),
                },
                extra={"spider": spider},
            )
            self._restorer.start()
        # Batches reach the OS every WRITE_INTERVAL (enough to survive kill -9) but are
        # fsynced (power-loss safe) at most every OPENCLAW_CHECKPOINT_FLUSH seconds.
        for func, interval in (
            (self.commit, min(self.flush_interval, WRITE_INTERVAL)),
            (self._periodic_snapshot, self.snapshot_interval),
        ):
            loop = create_looping_call(func)
            loop.start(interval, now=False)
            self._loops.append(loop)

    def spider_idle(self, spider: Spider) -> None:
        if self._restorer is not None and self._restorer.queue:
            raise DontCloseSpider

    def spider_closed(self, spider: Spider, reason: str) -> None:
        if self._closed:
            return
        self._closed = True
        if self._restorer is not None:
            self._restorer.closed = True
        for loop in self._loops:
            if loop.running:
                loop.stop()
        finished = self._finished(spider, reason)
        if self.snapshot(finished=finished, reason=reason, final=True):
            logger.info(
                "Checkpoint %(dir)s: final snapshot written (%(state)s, %(n)d requests pending)",
                {
                    "dir": self.dir,
                    "state": "finished" if finished else f"resumable, {reason}",
                    "n": len(self.tracker.live),
                },
                extra={"spider": spider},
            )
        else:
            logger.error(
                "Checkpoint %(dir)s: the final snapshot could not be written; the next run resumes "
                "from the previous snapshot and the journals (it may re-fetch some pages)",
                {"dir": self.dir},
                extra={"spider": spider},
            )
            self.journal.close()
        os.close(self._lock_fd)

    def _finished(self, spider: Spider, reason: str) -> bool:
        """Whether the final snapshot marks the crawl finished (not resumable)."""
        if reason != "finished":
            return False
        live = self.tracker.live
        unrestorable = len(self._restorer.unrestorable.intersection(live)) if self._restorer else 0
        if unrestorable:
            logger.error(
                "Crawl finished but %(n)d request(s) from the checkpoint could not be restored (dead letters); "
                "the checkpoint stays resumable so that a later run with their callbacks restores them",
                {"n": unrestorable},
                extra={"spider": spider},
            )
            return False
        if live:
            logger.warning(
                "Crawl finished with %(n)d requests still recorded as live (held back by another "
                "component); the checkpoint is marked finished anyway",
                {"n": len(live)},
                extra={"spider": spider},
            )
        return True

    # ------------------------------------------------------- request events

    def _admit(self, request: Request) -> bool:
        """Refuse what the runs before the resume already crawled (registered only on resume)."""
        if self.tracker.admit(request):
            return True
        self.stats.inc_value("openclaw/checkpoint/filtered")
        return False

    def _new_request(self, request: Request) -> None:
        self.tracker.new_request(request)

    def _on_popped(self, request: Request) -> None:
        self.feeds.page_started(request)
        self.tracker.popped(request)

    def _on_finished(self, request: Request) -> None:
        self.feeds.page_finished(request)  # its items reach the feeds with its "done" mark
        self.tracker.finished(request)

    def _fingerprint(self, request: Request) -> bytes:
        return self.crawler.request_fingerprinter.fingerprint(request)

    def _serialise(self, request: Request) -> str | None:
        try:
            return dumps(request_to_data(request, self.crawler.spider, compact=True))
        except SerializationError as exc:
            self.stats.inc_value("openclaw/checkpoint/unserializable")
            logger.error(
                "Checkpoint cannot save a request, it will not survive a crash: %(error)s",
                {"error": exc},
                extra={"spider": self.crawler.spider},
            )
            return None

    # ------------------------------------------------- journal and snapshot

    def commit(self, *, may_snapshot: bool = True, force_fsync: bool = False) -> bool:
        """Journal what happened since the last commit and fsync it (group commit).

        Order: the outputs' starting points; new and changed requests; then the
        durable outputs are written (and fsynced with the journal), then one
        "done" record with their offsets.
        """
        now = time.monotonic()
        fsync = force_fsync or now - self._last_fsync >= self.flush_interval
        if not self._journal_output_bases():
            return False  # nothing else is written while the journal cannot be (outputs stay in memory)
        payloads = self.tracker.take_changes()
        done = self._done_record(fsync)
        if done is not None:
            payloads.append(done)
        if payloads:
            self.journal.extend(payloads)
            self._records_since_snapshot += len(payloads)
            self.stats.inc_value("openclaw/checkpoint/journal_records", len(payloads))
        ok = self.journal.flush(fsync=fsync) if self.journal.buffered or fsync else True
        if fsync and ok:
            self._last_fsync = now
        self.stats.set_value("openclaw/checkpoint/live", len(self.tracker.live))
        if may_snapshot and self.snapshot_records and self._records_since_snapshot >= self.snapshot_records:
            self._periodic_snapshot()
        return ok

    def _journal_output_bases(self) -> bool:
        """Put new outputs' starting points on disk before any of their bytes; False if the
        journal cannot be written."""
        bases = self.feeds.bases()
        if bases:
            self.journal.append(records.outputs_record(bases))
            self._outputs.update(bases)
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
            logger.error(
                "Checkpoint: cannot write the durable feeds (%(error)s); retrying at the next commit", {"error": exc}
            )
            return None
        changed = {k: v for k, v in outputs.items() if self._outputs.get(k) != v}
        done, seen = self.tracker.take_done()
        if not (changed or done or seen):
            return None
        if changed:
            self._outputs.update(changed)
            self.feeds.recorded(changed)
        return records.done_record(done, seen, changed)

    def _periodic_snapshot(self) -> None:
        if not self._closed and not self._writing:
            self.snapshot(background=True)

    @property
    def _writing(self) -> bool:
        return self.snapshotter.writing

    def _join_writer(self) -> None:
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
        self._join_writer()  # one at a time, in generation order
        self.commit(may_snapshot=False, force_fsync=True)  # outputs too: the snapshot names their offsets
        if not self.journal.flush():  # the disk refuses even the journal: keep its records, skip
            self.stats.inc_value("openclaw/checkpoint/snapshot_errors")
            logger.error(
                "Checkpoint %(dir)s: snapshot skipped, the journal cannot be written either", {"dir": self.dir}
            )
            return False
        gen = self.gen + 1
        header = self._snapshot_header(gen, finished, reason)
        requests, fingerprints = self.tracker.requests(), list(self.tracker.seen)
        self.journal.close()  # empty: everything in it is also in this snapshot
        self.gen = gen
        self._records_since_snapshot = 0
        if not final:
            self.journal = self._new_journal(gen)
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
            "outputs": json_copy(self._outputs),  # as the journal recorded them
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

    # ------------------------------------------------------------ inspect

    def pending_by_domain(self) -> dict[str, int]:
        """Live requests per domain (for metrics and tests)."""
        return self.tracker.pending_by_domain()
