"""Opening a checkpoint directory and handing its requests, health and stats back to a crawl.

:func:`open_directory` locks the directory, clears what a crash left, and
reads the state (discarding it for ``OPENCLAW_CHECKPOINT_RESTART`` or a
finished crawl). :class:`Restorer` gives the live requests to
``engine.crawl`` in batches, one reactor turn each, exempt from duplicate
filtering; a request that cannot be rebuilt becomes a dead letter and stays in
the checkpoint.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from scrapy.utils.asyncio import call_later

from scrapy_openclaw import signals as openclaw_signals
from scrapy_openclaw._files import open_private, private_dir
from scrapy_openclaw.checkpoint.state import LOCK_FILE, RecoveredState, checkpoint_files, load, temp_files
from scrapy_openclaw.checkpoint.tracker import entry_url
from scrapy_openclaw.exceptions import OpenClawConfigError
from scrapy_openclaw.scrapy_internals import engine_of
from scrapy_openclaw.serialization import SerializationError, request_from_data

if TYPE_CHECKING:
    from pathlib import Path

    from scrapy.crawler import Crawler

    from scrapy_openclaw.checkpoint.tracker import RequestTracker

logger = logging.getLogger(__name__)

#: Restored requests handed to the engine per reactor turn.
RESTORE_BATCH = 2000
#: Stats that are gauges or per-process values: recomputed, never carried over.
#: (the checkpoint's own stats describe this process's run.)
_STATS_NOT_RESTORED = (
    "elapsed_time_seconds",
    "memusage/",
    "openclaw/checkpoint/",
    "openclaw/dlq/buffered",
    "log_count/",
)

Note = tuple[int, str, dict[str, Any]]


def open_directory(directory: Path, *, restart: bool, notes: list[Note]) -> tuple[int, RecoveredState]:
    """Lock *directory* (created 0700) and read its state: ``(lock fd, state)``.

    Messages go to *notes* (logged once the crawl's log handlers exist).
    OpenClawConfigError when another crawl holds the lock; CheckpointVersionError
    for files of another format version.
    """
    try:
        private_dir(directory, setting="OPENCLAW_CHECKPOINT_DIR")
        lock_fd = _lock(directory)
    except OSError as exc:
        raise OpenClawConfigError(
            f"setting OPENCLAW_CHECKPOINT_DIR: cannot use {os.path.abspath(directory)} as "
            f"the checkpoint directory ({exc.strerror}): point it at a directory this user can create and write"
        ) from None
    try:
        for path in temp_files(directory):  # a snapshot cut short by a crash (ours only)
            path.unlink(missing_ok=True)
        if restart and checkpoint_files(directory):
            notes.append(
                (logging.INFO, "OPENCLAW_CHECKPOINT_RESTART: discarding the checkpoint in %(dir)s", {"dir": directory})
            )
            wipe(directory)
        recovered = load(directory)
    except OSError as exc:  # a planted (or dangling) symlink, a file we may not read
        os.close(lock_fd)
        raise OpenClawConfigError(
            f"setting OPENCLAW_CHECKPOINT_DIR: cannot read the checkpoint in {directory}: "
            + (f"{exc.filename}: {exc.strerror}" if exc.filename else str(exc.strerror or exc))
        ) from None
    except BaseException:
        os.close(lock_fd)
        raise
    if recovered.finished:
        notes.append(
            (
                logging.INFO,
                "Checkpoint %(dir)s holds a finished crawl (%(reason)s); starting a new crawl",
                {"dir": directory, "reason": recovered.header.get("reason")},
            )
        )
        wipe(directory)
        recovered = RecoveredState()
    for warning in recovered.warnings:
        notes.append((logging.WARNING, "Checkpoint %(dir)s: %(warning)s", {"dir": directory, "warning": warning}))
    return lock_fd, recovered


def _lock(directory: Path) -> int:
    fd = open_private(directory / LOCK_FILE, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise OpenClawConfigError(
            f"setting OPENCLAW_CHECKPOINT_DIR={str(directory)!r}: another running crawl uses this checkpoint directory "
            "(for jobs of one spider running at once, as scrapyd runs them, name the job in the setting: %(job)s)"
        ) from None
    return fd


def wipe(directory: Path) -> None:
    for path in checkpoint_files(directory):
        path.unlink(missing_ok=True)


def health_registry(crawler: Crawler) -> Any:
    """The crawl's health registry if it can snapshot and restore itself, else None."""
    try:
        from scrapy_openclaw.health import HealthRegistry
    except ImportError:
        return None
    registry = HealthRegistry.for_crawler(crawler)
    if not (hasattr(registry, "snapshot") and hasattr(registry, "restore")):
        return None
    return registry


class Restorer:
    """Puts a recovered crawl back: health, stats, then the live requests in batches."""

    def __init__(self, crawler: Crawler, tracker: RequestTracker, recovered: RecoveredState, crawl_id: str):
        self.crawler = crawler
        self.stats = crawler.stats
        self.tracker = tracker
        self.recovered = recovered
        self.crawl_id = crawl_id
        self.queue = tracker.adopt(recovered)
        self.unrestorable: set[int] = set()  # kept live (not finished): a resume with the callback back restores them
        self.closed = False
        self._started = 0.0

    def start(self) -> None:
        self._restore_health()
        self._restore_stats()
        if self.recovered.refused:
            self.stats.set_value("openclaw/checkpoint/refused", self.recovered.refused)
        self._started = time.monotonic()
        call_later(0, self.step)

    def step(self) -> None:
        engine = engine_of(self.crawler)
        if self.closed or engine is None or engine.spider is None:
            return
        spider = self.crawler.spider
        tracker = self.tracker
        tracker.restoring = True
        try:
            for _ in range(min(RESTORE_BATCH, len(self.queue))):
                rid = self.queue.pop()
                entry = tracker.live.get(rid)
                if entry is None:
                    continue
                try:
                    request = request_from_data(json.loads(entry.data), spider)
                except (SerializationError, ValueError, TypeError) as exc:
                    self._unrestorable(rid, exc)
                    continue
                tracker.restored(rid, request)
                self.stats.inc_value("openclaw/checkpoint/restored")
                engine.crawl(request)
        finally:
            tracker.restoring = False
        if self.queue:
            call_later(0, self.step)
        else:
            seconds = time.monotonic() - self._started
            self.stats.set_value("openclaw/checkpoint/resume_seconds", round(seconds, 3))
            logger.info(
                "Checkpoint: all %(n)d requests restored in %(s).1fs",
                {"n": self.stats.get_value("openclaw/checkpoint/restored", 0), "s": seconds},
                extra={"spider": spider},
            )

    def _unrestorable(self, rid: int, exc: Exception) -> None:
        """A request that cannot be rebuilt (its callback was removed, say): a dead letter, kept live.

        It stays in the checkpoint (so the crawl is not marked finished and a
        later resume, with the callback back, restores it) and becomes a dead
        letter now (replayable); the dead letter's id is stable across resumes.
        """
        from scrapy_openclaw.deadletter import DeadLetter, domain_of

        spider = self.crawler.spider
        self.unrestorable.add(rid)
        self.stats.inc_value("openclaw/checkpoint/unrestorable")
        url, data = entry_url(self.tracker.live[rid])
        logger.error(
            "Checkpoint: cannot restore request #%(rid)d %(url)s (%(error)s); it is kept in the checkpoint "
            "and recorded as a dead letter (replay it with scrapy openclaw-dlq replay)",
            {"rid": rid, "url": url[:200], "error": exc},
            extra={"spider": spider},
        )
        letter = DeadLetter(
            url=url,
            domain=domain_of(self.crawler, url),
            error_class="parse",
            reason="checkpoint_unrestorable",
            spider=getattr(spider, "name", ""),
            crawl_id=self.crawl_id,
            method=str(data.get("method", "GET")) if isinstance(data, dict) else "GET",
            exception_type=type(exc).__name__,
            exception_message=str(exc)[:2000],
            request=data if isinstance(data, dict) else None,
            id=f"checkpoint-{self.crawl_id}-{rid}",
        )
        self.crawler.signals.send_catch_log(signal=openclaw_signals.dead_letter, dead_letter=letter, spider=spider)

    def _restore_health(self) -> None:
        data = self.recovered.header.get("health")
        registry = health_registry(self.crawler) if data else None
        if registry is not None:
            try:
                registry.restore(data)
            except ValueError as exc:
                logger.warning("Checkpoint: health state not restored: %(error)s", {"error": exc})

    def _restore_stats(self) -> None:
        for key, value in (self.recovered.header.get("stats") or {}).items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if key.startswith(_STATS_NOT_RESTORED):
                continue
            if key.endswith("max"):
                self.stats.max_value(key, value)
            else:
                # (Scrapy types the count as int; stats hold floats too, and inc_value just adds)
                self.stats.inc_value(key, value)  # type: ignore[arg-type]
