"""CheckpointExtension: crash-safe checkpoint and resume (``OPENCLAW_CHECKPOINT_DIR``).

What a request's life looks like to the checkpoint, and where we see it:

* **queued** -- :class:`~scrapy_openclaw.lifecycle.RequestLifecycle`
  ``on_enqueued`` (the scheduler accepted it: past the offsite filter and the
  duplicate filter), or ``on_held`` (kept back until its not-before time by
  :class:`~scrapy_openclaw.delay.DelayedRequests`): the request is serialised
  right away (so one whose meta cannot be stored is reported with its URL and
  key now, not at crash time) and becomes *live*. Duplicates and vetoed
  requests never reach us, so they cost nothing.
* **popped** -- :class:`~scrapy_openclaw.lifecycle.RequestLifecycle`
  ``on_started`` (the engine slot's ``add_request``): in flight.
* **finished** -- ``on_finished`` (the slot's ``remove_request``): only after
  the download, the callback or errback, every request the callback yielded
  (already scheduled, so journaled first) and every item's trip through the
  pipelines are done. A spider middleware would see the end of the
  callback's output but not the items still in pipelines, nor errbacks. The
  slot hook is an engine internal (present in Scrapy 2.14 .. 2.19); without
  it the extension refuses to run rather than silently lose requests.
* **dropped** -- a live request scheduled again (the same object) that the
  scheduler refused.

Live requests are journaled with group commit (see ``journal.py``): each
batch writes new requests before "finished" marks, so whatever prefix of it
survives a ``kill -9`` is consistent: a finished parent's children are
always on disk. The "finished" marks of a batch are one record, written after
the durable feeds (``feeds.py``) were written and fsynced, and it carries
their offsets: a page is done exactly when its items are in the feeds. A request that is scheduled and finished within one batch is
written only as its fingerprint. The snapshot (periodic and at close)
compacts everything into one atomic file.

Resume: the state is read in ``from_crawler`` (so the crawl id is restored
before any other component reads it), and on ``spider_opened`` the health
registry and stats are restored and every live request (pending *and*
in-flight) is handed to ``engine.crawl`` in batches, exempt from duplicate
filtering. Requests (start requests included) whose fingerprint the
previous runs already saw are refused before the scheduler (an ``admit``
listener), so a resumed crawl does not restart.

JOBDIR: refused whenever it is set. Scrapy would restore its own queue and
``requests.seen`` next to ours: its duplicate filter would drop our restored
requests, and after a clean stop both would re-inject the same pending
requests. ``OPENCLAW_CHECKPOINT_DIR`` replaces it.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
import time
from pathlib import Path
from urllib.parse import urlparse
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.dupefilters import BaseDupeFilter
from scrapy.exceptions import DontCloseSpider, NotConfigured
from scrapy.utils.asyncio import call_later, create_looping_call
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.misc import load_object

from scrapy_openclaw import runtime
from scrapy_openclaw import signals as openclaw_signals
from scrapy_openclaw._files import open_private, private_dir
from scrapy_openclaw.checkpoint.feeds import DurableFeeds
from scrapy_openclaw.checkpoint.journal import JournalWriter
from scrapy_openclaw.checkpoint.snapshot import write_snapshot
from scrapy_openclaw.checkpoint.state import (
    LOCK_FILE,
    RecoveredState,
    checkpoint_files,
    generations,
    journal_path,
    load,
    snapshot_path,
    temp_files,
)
from scrapy_openclaw.errors import OpenClawConfigError
from scrapy_openclaw.lifecycle import RequestLifecycle
from scrapy_openclaw.serialization import SerializationError, dumps, request_from_data, request_to_data
from scrapy_openclaw.settings import DEFAULTS

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

#: Seconds between journal writes to the OS (fsync follows OPENCLAW_CHECKPOINT_FLUSH).
WRITE_INTERVAL = 0.1
#: Restored requests handed to the engine per reactor turn.
RESTORE_BATCH = 2000
#: Stats that are gauges or per-process values: recomputed, never carried over.
#: (the checkpoint's own stats describe this process's run.)
_STATS_NOT_RESTORED = ("elapsed_time_seconds", "memusage/", "openclaw/checkpoint/",
                       "openclaw/dlq/buffered", "log_count/")


class _Entry:
    """A live request: state ("p" pending, "f" in flight), its JSON, fingerprint, object."""

    __slots__ = ("data", "flushed", "fp", "request", "state")

    def __init__(self, state: str, data: str, fp: str | None, request: Request | None, flushed: bool):
        self.state = state
        self.data = data
        self.fp = fp
        self.request = request
        self.flushed = flushed


class CheckpointExtension:
    def __init__(self, crawler: Crawler):
        settings = crawler.settings
        directory = settings.get("OPENCLAW_CHECKPOINT_DIR")
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
        self.flush_interval = settings.getfloat("OPENCLAW_CHECKPOINT_FLUSH", DEFAULTS["OPENCLAW_CHECKPOINT_FLUSH"])
        self.snapshot_interval = settings.getfloat(
            "OPENCLAW_CHECKPOINT_SNAPSHOT_INTERVAL", DEFAULTS["OPENCLAW_CHECKPOINT_SNAPSHOT_INTERVAL"]
        )
        self.snapshot_records = settings.getint(
            "OPENCLAW_CHECKPOINT_SNAPSHOT_RECORDS", DEFAULTS["OPENCLAW_CHECKPOINT_SNAPSHOT_RECORDS"]
        )
        restart = settings.getbool("OPENCLAW_CHECKPOINT_RESTART", DEFAULTS["OPENCLAW_CHECKPOINT_RESTART"])
        if self.flush_interval <= 0 or self.snapshot_interval <= 0:
            raise NotConfigured("OPENCLAW_CHECKPOINT_FLUSH and _SNAPSHOT_INTERVAL must be > 0")
        dupefilter = load_object(settings.get("DUPEFILTER_CLASS") or "scrapy.dupefilters.BaseDupeFilter")
        #: whether the crawl filters duplicates at all (BaseDupeFilter does not)
        self.filtering = isinstance(dupefilter, type) and dupefilter is not BaseDupeFilter

        # Messages from construction are logged at spider_opened: the crawl's log
        # handlers (LOG_FILE) may not be installed yet while extensions are built.
        self._notes: list[tuple[int, str, dict[str, Any]]] = []
        private_dir(self.dir)
        self._lock_fd = self._lock()
        for path in temp_files(self.dir):  # a snapshot cut short by a crash (ours only)
            path.unlink(missing_ok=True)
        if restart and checkpoint_files(self.dir):
            self._notes.append((logging.INFO, "OPENCLAW_CHECKPOINT_RESTART: discarding the checkpoint in %(dir)s",
                                {"dir": self.dir}))
            self._wipe()
        recovered = load(self.dir)  # CheckpointVersionError propagates: a clear refusal
        if recovered.finished:
            self._notes.append((
                logging.INFO,
                "Checkpoint %(dir)s holds a finished crawl (%(reason)s); starting a new crawl",
                {"dir": self.dir, "reason": recovered.header.get("reason")},
            ))
            self._wipe()
            recovered = RecoveredState()
        for warning in recovered.warnings:
            self._notes.append((logging.WARNING, "Checkpoint %(dir)s: %(warning)s",
                                {"dir": self.dir, "warning": warning}))
        self.recovered: RecoveredState | None = recovered if not recovered.empty else None
        self.resumed = self.recovered is not None

        # crawl id first: other components read it while they are built
        if self.recovered is not None and self.recovered.crawl_id:
            saved = self.recovered.crawl_id
            current = runtime.peek(crawler, "crawl_id")
            if current is not None and current != saved:
                self._notes.append((
                    logging.WARNING,
                    "Crawl id %(current)s was read before the checkpoint restored %(saved)s",
                    {"current": current, "saved": saved},
                ))
            runtime.shared(crawler, "crawl_id", lambda: saved)
        self.crawl_id = runtime.crawl_id(crawler)

        self._live: dict[int, _Entry] = {}
        self._by_request: dict[Request, int] = {}
        self._seen: set[bytes] = set()
        self._start_seen: set[bytes] = set()
        self._restored_seen: frozenset[bytes] = frozenset()
        self._restored_start: frozenset[bytes] = frozenset()
        self._next_id = 1
        self._new: list[tuple[int, str | None]] = []  # (id, fp) scheduled since the last commit
        self._changed: list[int] = []
        self._popped: list[int] = []
        self._done: list[int] = []
        self._start_new: list[str] = []
        self._restore_queue: list[int] = []
        self._unrestorable: set[int] = set()  # kept live (not finished): a resume with the callback back restores them
        self._restoring = False
        self._restore_started = 0.0
        self._records_since_snapshot = 0
        self._last_fsync = time.monotonic()
        self._prev_snapshot_gen: int | None = None
        self._closed = False
        self._commit_loop: Any = None
        self._snapshot_loop: Any = None
        self._writer: threading.Thread | None = None  # a snapshot being written in the background
        self._written: tuple[int, Any] | None = None  # its outcome, for the reactor thread
        self._seen_done: list[str] = []  # fingerprints for the next "done" record
        self.feeds = DurableFeeds.for_crawler(crawler)
        self._outputs: dict[str, dict[str, Any]] = dict(recovered.outputs) if self.recovered else {}
        self.feeds.activate(self._outputs, self.resumed)
        self._warn_plain_feed_exporter(settings)
        if self.recovered is not None:
            self._adopt(self.recovered)
        self.gen = recovered.next_generation
        self.journal = JournalWriter(
            journal_path(self.dir, self.gen),
            {"gen": self.gen, "crawl_id": self.crawl_id, "spider": getattr(crawler.spidercls, "name", None), "created": time.time()},
        )

        self.lifecycle = RequestLifecycle.for_crawler(crawler)
        self.lifecycle.listen(
            "OPENCLAW_CHECKPOINT_DIR",
            on_enqueued=self._on_enqueued,
            on_held=self._on_held,
            on_started=self._on_popped,
            on_finished=self._on_finished,
            admit=self._admit if (self._restored_seen or self._restored_start) else None,
        )
        crawler.signals.connect(self.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(self.spider_idle, signal=signals.spider_idle)
        crawler.signals.connect(self.spider_closed, signal=signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> CheckpointExtension:
        return cls(crawler)

    # --------------------------------------------------------------- setup

    def _lock(self) -> int:
        fd = open_private(self.dir / LOCK_FILE, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise OpenClawConfigError(
                f"setting OPENCLAW_CHECKPOINT_DIR={str(self.dir)!r}: another running crawl "
                "uses this checkpoint directory"
            ) from None
        return fd

    def _wipe(self) -> None:
        for path in checkpoint_files(self.dir):
            path.unlink(missing_ok=True)

    def _adopt(self, recovered: RecoveredState) -> None:
        """Take over the recovered live requests and fingerprints (built into Requests later)."""
        for rid, (_state, data, fp) in recovered.requests.items():
            # in-flight requests are pending again: they will be re-fetched
            self._live[rid] = _Entry("p", data, fp, None, flushed=True)
            self._restore_queue.append(rid)
        self._restore_queue.sort(reverse=True)  # pop() from the end: oldest first
        self._seen = set(recovered.fingerprints)
        self._start_seen = set(recovered.start_fingerprints)
        if self.filtering:
            self._restored_seen = frozenset(self._seen)
        self._restored_start = frozenset(self._start_seen)
        self._next_id = recovered.next_id
        self._prev_snapshot_gen = recovered.snapshot_gen

    def _warn_plain_feed_exporter(self, settings: Any) -> None:
        if not (settings.getdict("FEEDS") or settings.get("FEED_URI")):
            return
        from scrapy.extensions.feedexport import FeedExporter  # noqa: PLC0415

        from scrapy_openclaw.checkpoint.feeds import DurableFeedExporter  # noqa: PLC0415

        for path, order in settings.getwithbase("EXTENSIONS").items():
            cls = load_object(path) if isinstance(path, str) else path
            if order is not None and cls is FeedExporter:
                self._notes.append((
                    logging.WARNING,
                    "Checkpoint: Scrapy's FeedExporter is enabled, not %(ours)s: feed items may be lost or "
                    "duplicated after a crash (the add-on swaps it; or set EXTENSIONS yourself)",
                    {"ours": f"{DurableFeedExporter.__module__}.{DurableFeedExporter.__qualname__}"},
                ))
                return

    # ------------------------------------------------------------ signals

    def spider_opened(self, spider: Spider) -> None:
        for level, message, args in self._notes:
            logger.log(level, message, args, extra={"spider": spider})
        self._notes.clear()
        if self.recovered is not None and self.recovered.dropped:
            self.stats.set_value("openclaw/checkpoint/dropped_records", self.recovered.dropped)
        self.lifecycle.install()  # refuses (OpenClawConfigError) when the engine has no slot hook
        if self.resumed:
            self._restore_health()
            self._restore_stats()
            self.stats.inc_value("openclaw/checkpoint/resumes")
            logger.info(
                "Resuming crawl %(crawl_id)s from checkpoint %(dir)s: %(n)d requests to restore, "
                "%(fps)d fingerprints seen",
                {"crawl_id": self.crawl_id, "dir": self.dir, "n": len(self._restore_queue),
                 "fps": len(self._seen)},
                extra={"spider": spider},
            )
            self._restore_started = time.monotonic()
            call_later(0, self._restore_step)
        # Batches reach the OS every WRITE_INTERVAL (enough to survive kill -9) but are
        # fsynced (power-loss safe) at most every OPENCLAW_CHECKPOINT_FLUSH seconds.
        self._commit_loop = create_looping_call(self.commit)
        self._commit_loop.start(min(self.flush_interval, WRITE_INTERVAL), now=False)
        self._snapshot_loop = create_looping_call(self._periodic_snapshot)
        self._snapshot_loop.start(self.snapshot_interval, now=False)

    def _admit(self, request: Request) -> bool:
        """Refuse what the runs before the resume already crawled (registered only on resume)."""
        if request in self._by_request:  # a restored request, or one we track coming back
            return True
        start = bool(request.meta.get("is_start_request"))
        if request.dont_filter and not start:
            return True
        fp = self.crawler.request_fingerprinter.fingerprint(request)
        if fp in self._restored_seen or (start and fp in self._restored_start):
            self.stats.inc_value("openclaw/checkpoint/filtered")
            return False
        return True

    def _on_enqueued(self, request: Request, accepted: bool) -> None:
        rid = self._by_request.get(request)
        if rid is not None:  # the same object again (a delayed request released, a reschedule)
            if accepted:
                self._requeued(rid, request)
            else:
                self._finish(rid)
        elif accepted:
            self._new_request(request)

    def _on_held(self, request: Request) -> None:
        rid = self._by_request.get(request)
        if rid is not None:
            self._requeued(rid, request)
        else:
            self._new_request(request)

    def _requeued(self, rid: int, request: Request) -> None:
        entry = self._live[rid]
        entry.state = "p"
        if not self._restoring:
            data = self._serialise(request)
            if data is not None and data != entry.data:
                entry.data = data
                if entry.flushed:
                    self._changed.append(rid)

    def _new_request(self, request: Request) -> None:
        fp = None
        if self.filtering:
            start = bool(request.meta.get("is_start_request"))
            if not request.dont_filter or start:
                fp_bytes = self.crawler.request_fingerprinter.fingerprint(request)
                if start and fp_bytes not in self._start_seen:
                    self._start_seen.add(fp_bytes)
                    self._start_new.append(fp_bytes.hex())
                if not request.dont_filter:
                    self._seen.add(fp_bytes)
                    fp = fp_bytes.hex()
        self._track(request, fp)

    def _track(self, request: Request, fp: str | None) -> None:
        data = self._serialise(request)
        if data is None:
            if fp is not None:
                self._new.append((0, fp))  # keep the fingerprint, like the duplicate filter does
            return
        rid = self._next_id
        self._next_id += 1
        self._live[rid] = _Entry("p", data, fp, request, flushed=False)
        self._by_request[request] = rid
        self._new.append((rid, fp))

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

    def _on_popped(self, request: Request) -> None:
        self.feeds.page_started(request)
        rid = self._by_request.get(request)
        if rid is not None:
            entry = self._live[rid]
            entry.state = "f"
            if entry.flushed:
                self._popped.append(rid)

    def _on_finished(self, request: Request) -> None:
        self.feeds.page_finished(request)  # its items reach the feeds with its "done" mark
        rid = self._by_request.get(request)
        if rid is not None and self._live[rid].state == "f":
            self._finish(rid)

    def _finish(self, rid: int) -> None:
        entry = self._live.pop(rid)
        if entry.request is not None:
            self._by_request.pop(entry.request, None)
        if entry.flushed:
            self._done.append(rid)

    def spider_idle(self, spider: Spider) -> None:
        if self._restore_queue:
            raise DontCloseSpider

    def spider_closed(self, spider: Spider, reason: str) -> None:
        if self._closed:
            return
        self._closed = True
        for loop in (self._commit_loop, self._snapshot_loop):
            if loop is not None and loop.running:
                loop.stop()
        finished = reason == "finished"
        unrestorable = len(self._unrestorable.intersection(self._live))
        if finished and unrestorable:
            logger.error(
                "Crawl finished but %(n)d request(s) from the checkpoint could not be restored (dead letters); "
                "the checkpoint stays resumable so that a later run with their callbacks restores them",
                {"n": unrestorable}, extra={"spider": spider},
            )
            finished = False
        elif finished and self._live:
            logger.warning(
                "Crawl finished with %(n)d requests still recorded as live (held back by another "
                "component); the checkpoint is marked finished anyway",
                {"n": len(self._live)}, extra={"spider": spider},
            )
        ok = self.snapshot(finished=finished, reason=reason, final=True)
        if ok:
            logger.info(
                "Checkpoint %(dir)s: final snapshot written (%(state)s, %(n)d requests pending)",
                {"dir": self.dir, "state": "finished" if finished else f"resumable, {reason}",
                 "n": len(self._live)}, extra={"spider": spider},
            )
        else:
            logger.error(
                "Checkpoint %(dir)s: the final snapshot could not be written; the next run resumes "
                "from the previous snapshot and the journals (it may re-fetch some pages)",
                {"dir": self.dir}, extra={"spider": spider},
            )
            self.journal.close()
        os.close(self._lock_fd)

    # -------------------------------------------------------------- restore

    def _restore_step(self) -> None:
        engine = self.crawler.engine
        if self._closed or engine is None or engine.spider is None:
            return
        spider = self.crawler.spider
        batch = min(RESTORE_BATCH, len(self._restore_queue))
        self._restoring = True
        try:
            for _ in range(batch):
                rid = self._restore_queue.pop()
                entry = self._live.get(rid)
                if entry is None:
                    continue
                try:
                    request = request_from_data(json.loads(entry.data), spider)
                except (SerializationError, ValueError, TypeError) as exc:
                    self._unrestorable_request(rid, entry, exc)
                    continue
                entry.request = request
                self._by_request[request] = rid
                self.stats.inc_value("openclaw/checkpoint/restored")
                engine.crawl(request)
        finally:
            self._restoring = False
        if self._restore_queue:
            call_later(0, self._restore_step)
        else:
            seconds = time.monotonic() - self._restore_started
            self.stats.set_value("openclaw/checkpoint/resume_seconds", round(seconds, 3))
            logger.info(
                "Checkpoint: all %(n)d requests restored in %(s).1fs",
                {"n": self.stats.get_value("openclaw/checkpoint/restored", 0), "s": seconds},
                extra={"spider": spider},
            )

    def _unrestorable_request(self, rid: int, entry: _Entry, exc: Exception) -> None:
        """A request that cannot be rebuilt (its callback was removed, say): a dead letter, kept live.

        It stays in the checkpoint (so the crawl is not marked finished and a
        later resume, with the callback back, restores it) and becomes a dead
        letter now (replayable); the dead letter's id is stable across resumes.
        """
        from scrapy_openclaw.deadletter import DeadLetter  # noqa: PLC0415

        spider = self.crawler.spider
        self._unrestorable.add(rid)
        self.stats.inc_value("openclaw/checkpoint/unrestorable")
        try:
            data = json.loads(entry.data)
        except ValueError:
            data = None
        url = str(data.get("url", "")) if isinstance(data, dict) else ""
        logger.error(
            "Checkpoint: cannot restore request #%(rid)d %(url)s (%(error)s); it is kept in the checkpoint "
            "and recorded as a dead letter (replay it with scrapy openclaw-dlq replay)",
            {"rid": rid, "url": url[:200], "error": exc}, extra={"spider": spider},
        )
        letter = DeadLetter(
            url=url,
            domain=urlparse(url).hostname or "",
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

    def _health_registry(self) -> Any:
        try:
            from scrapy_openclaw.health import HealthRegistry  # noqa: PLC0415
        except ImportError:
            return None
        registry = HealthRegistry.for_crawler(self.crawler)
        if not (hasattr(registry, "snapshot") and hasattr(registry, "restore")):
            return None
        return registry

    def _restore_health(self) -> None:
        assert self.recovered is not None
        data = self.recovered.header.get("health")
        registry = self._health_registry() if data else None
        if registry is not None:
            try:
                registry.restore(data)
            except ValueError as exc:
                logger.warning("Checkpoint: health state not restored: %(error)s", {"error": exc})

    def _restore_stats(self) -> None:
        assert self.recovered is not None
        for key, value in (self.recovered.header.get("stats") or {}).items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if key.startswith(_STATS_NOT_RESTORED):
                continue
            if key.endswith("max"):
                self.stats.max_value(key, value)
            else:
                self.stats.inc_value(key, value)

    # ------------------------------------------------- journal and snapshot

    def commit(self, *, may_snapshot: bool = True, force_fsync: bool = False) -> bool:
        """Journal what happened since the last commit and fsync it (group commit).

        Order: new and changed requests, then the durable outputs are written (and
        fsynced with the journal), then one "done" record with their offsets.
        """
        now = time.monotonic()
        fsync = force_fsync or now - self._last_fsync >= self.flush_interval
        bases = self.feeds.bases()
        if bases:  # an output's starting point is on disk before any of its bytes
            self.journal.append("D " + json.dumps({"o": bases}, separators=(",", ":")))
            self._outputs.update(bases)
            self.feeds.recorded(bases)
        if self.journal.buffered and not self.journal.flush(fsync=True):
            return False  # nothing else is written while the journal cannot be (outputs stay in memory)
        payloads: list[str] = []
        live = self._live
        for rid in self._changed:
            entry = live.get(rid)
            if entry is not None:
                payloads.append(f"a {rid} {entry.state} {entry.fp or '-'} {entry.data}")
        seen_done = self._seen_done
        for rid, fp in self._new:
            entry = live.get(rid)
            if entry is not None:
                entry.flushed = True
                payloads.append(f"a {rid} {entry.state} {fp or '-'} {entry.data}")
            elif fp is not None:
                seen_done.append(fp)
        payloads += [f"S {fp}" for fp in self._start_new]
        payloads += [f"f {rid}" for rid in self._popped if rid in live]
        self._new, self._changed, self._popped, self._start_new = [], [], [], []
        try:
            outputs = self.feeds.sync(fsync)
        except OSError as exc:  # pages stay not-done (kept for the next commit) until their items are written
            self.stats.inc_value("openclaw/checkpoint/feed_errors")
            logger.error("Checkpoint: cannot write the durable feeds (%(error)s); retrying at the next commit",
                         {"error": exc})
            outputs = None
        if outputs is not None:
            changed = {k: v for k, v in outputs.items() if self._outputs.get(k) != v}
            if changed or self._done or seen_done:
                record: dict[str, Any] = {"d": self._done, "s": seen_done}
                if changed:
                    record["o"] = changed
                    self._outputs.update(changed)
                    self.feeds.recorded(changed)
                payloads.append("D " + json.dumps(record, separators=(",", ":")))
            self._done, self._seen_done = [], []
        if payloads:
            self.journal.extend(payloads)
            self._records_since_snapshot += len(payloads)
            self.stats.inc_value("openclaw/checkpoint/journal_records", len(payloads))
        ok = self.journal.flush(fsync=fsync) if self.journal.buffered or fsync else True
        if fsync and ok:
            self._last_fsync = now
        self.stats.set_value("openclaw/checkpoint/live", len(live))
        if (
            may_snapshot
            and self.snapshot_records
            and self._records_since_snapshot >= self.snapshot_records
            and not self._closed
            and not self._writing
        ):
            self.snapshot(background=True)
        return ok

    def _periodic_snapshot(self) -> None:
        if not self._closed and not self._writing:
            self.snapshot(background=True)

    @property
    def _writing(self) -> bool:
        return self._writer is not None

    def snapshot(
        self, *, finished: bool = False, reason: str | None = None, final: bool = False,
        background: bool = False,
    ) -> bool:
        """Compact the state into a new snapshot generation; False if it could not be written.

        The state is cut on the reactor thread (a copy of the live requests and
        fingerprints) and the journal moves on to the new generation at once.
        *background* leaves the file to a thread, so a snapshot of millions of
        requests does not stall the crawl; its outcome is handled on the
        reactor thread when it ends (True is returned at once). Until it ends,
        or if it fails, recovery uses the previous snapshot and every journal
        since, this generation's included.
        """
        self._join_writer()  # one at a time, in generation order
        self.commit(may_snapshot=False, force_fsync=True)  # outputs too: the snapshot names their offsets
        if not self.journal.flush():  # the disk refuses even the journal: keep its records, skip
            self.stats.inc_value("openclaw/checkpoint/snapshot_errors")
            logger.error("Checkpoint %(dir)s: snapshot skipped, the journal cannot be written either",
                         {"dir": self.dir})
            return False
        gen = self.gen + 1
        header = {
            "gen": gen,
            "crawl_id": self.crawl_id,
            "created": time.time(),
            "finished": finished,
            "reason": reason,
            "next_id": self._next_id,
            "spider": getattr(self.crawler.spider, "name", None),
            "stats": _json_safe_stats(self.stats.get_stats()),
            "health": self._health_snapshot(),
            "start_fingerprints": sorted(fp.hex() for fp in self._start_seen),
            "outputs": json.loads(json.dumps(self._outputs)),  # as the journal recorded them
        }
        requests = [(rid, e.state, e.data) for rid, e in self._live.items()]
        fingerprints = list(self._seen)
        self.journal.close()  # empty: everything in it is also in this snapshot
        self.gen = gen
        self._records_since_snapshot = 0
        if not final:
            self.journal = JournalWriter(
                journal_path(self.dir, gen),
                {"gen": gen, "crawl_id": self.crawl_id, "spider": getattr(self.crawler.spidercls, "name", None), "created": time.time()},
            )
        if not background:
            return self._snapshot_written(gen, self._write(gen, header, requests, fingerprints))
        self._writer = threading.Thread(
            target=self._write_in_thread, args=(gen, header, requests, fingerprints),
            name="openclaw-checkpoint-snapshot", daemon=True,
        )
        self._writer.start()
        return True

    def _write(self, gen: int, header: dict[str, Any], requests: list[tuple[int, str, str]],
               fingerprints: list[bytes]) -> tuple[int, float] | Exception:
        """Write the file (any thread): ``(size, seconds)``, or the error."""
        started = time.monotonic()
        try:
            size = write_snapshot(snapshot_path(self.dir, gen), header, requests, fingerprints)
        except OSError as exc:
            return exc
        return size, time.monotonic() - started

    def _write_in_thread(self, gen: int, *args: Any) -> None:
        from twisted.internet import reactor  # noqa: PLC0415 (the installed one)

        try:
            outcome = self._write(gen, *args)
        except Exception as exc:  # reported like a failed write; never leaves a writer hanging
            outcome = exc
        self._written = (gen, outcome)
        reactor.callFromThread(self._collect_writer)

    def _join_writer(self) -> None:
        if self._writer is not None:
            self._writer.join()
            self._collect_writer()

    def _collect_writer(self) -> None:
        """On the reactor thread: handle a background write's outcome (once)."""
        written, self._written = self._written, None
        if written is not None:
            self._writer = None
            self._snapshot_written(*written)

    def _snapshot_written(self, gen: int, outcome: tuple[int, float] | Exception) -> bool:
        if isinstance(outcome, Exception):
            self.stats.inc_value("openclaw/checkpoint/snapshot_errors")
            logger.error(
                "Checkpoint snapshot %(path)s failed (%(error)s); the previous snapshot and the "
                "journals still hold the state, the crawl continues",
                {"path": snapshot_path(self.dir, gen), "error": outcome},
            )
            return False
        size, seconds = outcome
        self.stats.inc_value("openclaw/checkpoint/snapshots")
        self.stats.set_value("openclaw/checkpoint/snapshot_bytes", size)
        self.stats.set_value("openclaw/checkpoint/snapshot_seconds", round(seconds, 3))
        if self._prev_snapshot_gen is not None:
            self._delete_old(keep_from=self._prev_snapshot_gen)
        self._prev_snapshot_gen = gen
        return True

    def _delete_old(self, keep_from: int) -> None:
        """Keep the previous snapshot and its journals (the fallback), drop anything older."""
        snaps, journals = generations(self.dir)
        for g in snaps:
            if g < keep_from:
                snapshot_path(self.dir, g).unlink(missing_ok=True)
        for g in journals:
            if g < keep_from:
                journal_path(self.dir, g).unlink(missing_ok=True)

    def _health_snapshot(self) -> Any:
        registry = self._health_registry()
        if registry is None:
            return None
        try:
            data = json.loads(json.dumps(registry.snapshot()))  # a copy: it may be written by a thread
        except (TypeError, ValueError) as exc:
            logger.warning("Checkpoint: the health registry's snapshot is not JSON-safe (%(error)s); "
                           "not saved", {"error": exc})
            return None
        return data

    # ------------------------------------------------------------ inspect

    def pending_by_domain(self) -> dict[str, int]:
        """Live requests per domain (for metrics and tests)."""
        counts: dict[str, int] = {}
        for entry in self._live.values():
            if entry.request is not None:
                host = urlparse_cached(entry.request).hostname or ""
            else:
                host = urlparse(json.loads(entry.data).get("url", "")).hostname or ""
            counts[host] = counts.get(host, 0) + 1
        return counts


def _json_safe_stats(stats: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in stats.items():
        if value is None or isinstance(value, (str, bool, int, float)):
            out[key] = value
        else:
            out[key] = str(value)
    return out
