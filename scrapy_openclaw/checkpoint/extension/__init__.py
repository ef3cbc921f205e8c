"""CheckpointExtension: crash-safe checkpoint and resume (``OPENCLAW_CHECKPOINT_DIR``; docs/checkpoint.md).

A request is live from the moment the scheduler accepts it until the engine
slot forgets it (:class:`~scrapy_openclaw.lifecycle.RequestLifecycle`); live
requests are journaled with group commit and compacted into snapshots by
:class:`~.journaling.CheckpointWriter`. The state is read in ``from_crawler``
so the crawl id is back before other components are built. JOBDIR is refused:
Scrapy's duplicate filter would drop the requests this extension restores.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.dupefilters import BaseDupeFilter
from scrapy.exceptions import DontCloseSpider, NotConfigured
from scrapy.utils.asyncio import create_looping_call
from scrapy.utils.misc import load_object

from scrapy_openclaw import runtime
from scrapy_openclaw.checkpoint.extension.journaling import CheckpointWriter
from scrapy_openclaw.checkpoint.feeds import DurableFeeds
from scrapy_openclaw.checkpoint.refusal import DiskRefusal
from scrapy_openclaw.checkpoint.restore import Restorer, open_directory
from scrapy_openclaw.checkpoint.snapshot import write_snapshot
from scrapy_openclaw.checkpoint.tracker import RequestTracker
from scrapy_openclaw.exceptions import OpenClawConfigError
from scrapy_openclaw.lifecycle import RequestLifecycle
from scrapy_openclaw.paths import crawl_path
from scrapy_openclaw.serialization import SerializationError, dumps, request_to_data
from scrapy_openclaw.settings import OpenClawSettings, crawl_id
from scrapy_openclaw.startup import reports_config_errors

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler

    from scrapy_openclaw.checkpoint.restore import Note
    from scrapy_openclaw.checkpoint.state import RecoveredState

logger = logging.getLogger(__name__)

__all__ = ["WRITE_INTERVAL", "CheckpointExtension"]

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
        self.dir = crawl_path(crawler, directory, setting="OPENCLAW_CHECKPOINT_DIR")
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
        self._loops: list[Any] = []
        # (set in open, once the directory is locked and the crawl id is back)
        self._lock_fd: int
        self.crawl_id: str
        self.feeds: DurableFeeds
        self.writer: CheckpointWriter
        self.lifecycle: RequestLifecycle

    @classmethod
    @reports_config_errors
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
        outputs = dict(recovered.outputs) if self.resumed else {}
        self.feeds.activate(outputs, self.resumed)
        self._warn_plain_feed_exporter()
        if self.recovered is not None:
            self._restorer = Restorer(crawler, self.tracker, self.recovered, self.crawl_id)
        self.writer = CheckpointWriter(
            crawler,
            self.dir,
            self.crawl_id,
            self.tracker,
            self.feeds,
            recovered,
            outputs,
            flush_interval=self.flush_interval,
            snapshot_records=self.snapshot_records,
            write_file=_write_file,
        )
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
        return crawl_id(self.crawler)

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

    # ------------------------------------------------------- crawl signals

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
            (self.writer.commit, min(self.flush_interval, WRITE_INTERVAL)),
            (self.writer.periodic_snapshot, self.snapshot_interval),
        ):
            loop = create_looping_call(func)
            loop.start(interval, now=False)
            self._loops.append(loop)

    def spider_idle(self, spider: Spider) -> None:
        if self._restorer is not None and self._restorer.queue:
            raise DontCloseSpider

    def spider_closed(self, spider: Spider, reason: str) -> None:
        if self.writer.closed:
            return
        self.writer.closed = True
        if self._restorer is not None:
            self._restorer.closed = True
        for loop in self._loops:
            if loop.running:
                loop.stop()
        finished = self._finished(spider, reason)
        if self.writer.snapshot(finished=finished, reason=reason, final=True):
            logger.info(
                "Checkpoint %(dir)s: final snapshot written (%(state)s, %(n)d requests pending)",
                {
                    "dir": self.dir,
                    "state": "finished" if finished else f"resumable, {reason}",
                    "n": len(self.tracker.live),
                },
                extra={"spider": spider},
            )
        elif DiskRefusal.for_crawler(self.crawler).stopped:  # (its error said what to do)
            self.writer.journal.close()
        else:
            logger.error(
                "Checkpoint %(dir)s: the final snapshot could not be written; the next run resumes "
                "from the previous snapshot and the journals (it may re-fetch some pages)",
                {"dir": self.dir},
                extra={"spider": spider},
            )
            self.writer.journal.close()
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

    # ------------------------------------------------------------ inspect

    def pending_by_domain(self) -> dict[str, int]:
        """Live requests per domain (for metrics and tests)."""
        return self.tracker.pending_by_domain()
