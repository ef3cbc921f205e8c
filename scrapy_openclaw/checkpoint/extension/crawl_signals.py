"""The crawl's signals: notes and resume at spider_opened, the commit and snapshot loops, the final snapshot.

A mixin of :class:`CheckpointExtension` (its writer, :class:`.CheckpointWriter`, does the
writing). A crawl that finished with requests
it could not restore stays resumable, so a later run can still fetch them.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from scrapy.exceptions import DontCloseSpider
from scrapy.utils.asyncio import create_looping_call

from scrapy_openclaw.checkpoint.refusal import DiskRefusal

if TYPE_CHECKING:
    from pathlib import Path

    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

    from scrapy_openclaw.checkpoint.extension.journaling import CheckpointWriter
    from scrapy_openclaw.checkpoint.restore import Note, Restorer
    from scrapy_openclaw.checkpoint.state import RecoveredState
    from scrapy_openclaw.checkpoint.tracker import RequestTracker
    from scrapy_openclaw.lifecycle import RequestLifecycle

logger = logging.getLogger(__name__)

#: Seconds between journal writes to the OS (fsync follows OPENCLAW_CHECKPOINT_FLUSH).
WRITE_INTERVAL = 0.1


class _CrawlSignals:
    """``spider_opened``, ``spider_idle`` and ``spider_closed``."""

    crawler: Crawler
    stats: StatsCollector
    dir: Path
    crawl_id: str
    tracker: RequestTracker
    writer: CheckpointWriter
    flush_interval: float
    _notes: list[Note]
    recovered: RecoveredState | None
    lifecycle: RequestLifecycle
    _restorer: Restorer | None
    snapshot_interval: float
    _loops: list[Any]
    _lock_fd: int

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
