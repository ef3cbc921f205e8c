"""The foreground scheduler: fires each task's windows as ``scrapy crawl`` subprocesses.

Everything runs on the Twisted reactor: window timers and backoffs are
``call_later`` timers, crawls are ``reactor.spawnProcess`` children, and the
blocking calls (Redis, lock files, history) go to the reactor's thread pool.

A window's life: take the window lock (one run per window across nodes) ->
record ``running`` -> attempt 1 .. ``max_attempts``: ``scrapy crawl SPIDER``
with ``OPENCLAW_CHECKPOINT_DIR=<base>/<window>`` (the same directory for every
attempt, so a retry resumes from the checkpoint rather than starting over)
and ``RunStatsExtension`` reporting stats and the cursor -> success, or
failed with the reason (logged as an error) -> release the lock, record.

Stopping (SIGTERM/SIGINT): no new windows or attempts; running crawls get
SIGTERM (Scrapy's graceful stop, a final checkpoint) and
``OPENCLAW_SCHEDULE_STOP_TIMEOUT`` seconds before SIGKILL; their windows are
recorded ``interrupted`` and their locks released so they can be resumed.

Failure modes: history/locks unreachable at start (Redis down) is retried
with a bounded backoff; a scheduler killed outright takes its crawls with it
(see ``RunStatsExtension``) and the window it left ``running`` is marked
``interrupted`` once its lock is free again; a window whose lock is lost
(taken over, or not extended within its TTL) has its crawl stopped, so no
window runs twice.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy.utils.asyncio import call_later, create_looping_call
from twisted.internet import error as terror
from twisted.internet import protocol
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.threads import deferToThread

from scrapy_openclaw._files import open_private, private_dir
from scrapy_openclaw.schedule.cursor import FileCursors, RedisCursors
from scrapy_openclaw.schedule.extension import PARENT_ENV
from scrapy_openclaw.schedule.history import UNFINISHED, JsonlHistory, RedisHistory, RunRecord, missed_windows
from scrapy_openclaw.schedule.locks import FileLocks, RedisLocks, redis_client
from scrapy_openclaw.schedule.metrics import ScheduleMetrics
from scrapy_openclaw.schedule.tasks import CURSOR_ARG, Task, window_id
from scrapy_openclaw.settings import OpenClawSettings, read_setting

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy.settings import BaseSettings

logger = logging.getLogger(__name__)

RUN_STATS_EXTENSION = "scrapy_openclaw.schedule.RunStatsExtension"
#: Crawl finish reasons that mean "stopped before the end": the window is retried.
UNFINISHED_REASONS = ("shutdown", "cancelled")
#: A window is reported missed only once it is this many seconds old (a live node may be recording it).
MISSED_GRACE = 5.0
#: A node still busy with a task's previous window waits this long (s) before recording the new
#: window as skipped, so that a free node takes it first.
SKIP_GRACE = 1.0
#: Retries of the history at start (Redis unreachable): first wait and cap, seconds.
START_RETRY_FIRST = 1.0
START_RETRY_MAX = 30.0


class _CrawlProtocol(protocol.ProcessProtocol):
    """Copies the crawl's output to its log file; fires ``ended`` with the exit status."""

    def __init__(self, log_path: Path):
        self.log = os.fdopen(open_private(log_path, os.O_WRONLY | os.O_APPEND), "ab")  # closed in processEnded
        self.ended: Deferred[str] = Deferred()

    def outReceived(self, data: bytes) -> None:
        self.log.write(data)

    errReceived = outReceived

    def processEnded(self, reason: Any) -> None:
        self.log.close()
        value = reason.value
        if isinstance(value, terror.ProcessDone):
            status = "0"
        elif getattr(value, "signal", None) is not None:
            status = f"signal {value.signal}"
        else:
            status = str(getattr(value, "exitCode", "?"))
        self.ended.callback(status)


@dataclass
class _Run:
    task: Task
    record: RunRecord
    lock: Any
    window_dir: Path
    run_file: Path
    process: Any = None
    timed_out: bool = False
    timers: list[Any] = field(default_factory=list)
    sleeping: Deferred[None] | None = None
    extended_at: float = field(default_factory=time.monotonic)
    lost: str | None = None  # why the window lock was lost (the crawl is being stopped)


class Scheduler:
    """Runs *tasks* until :meth:`stop`; ``start()`` on the reactor."""

    def __init__(self, tasks: list[Task], settings: BaseSettings, *, cwd: str | Path | None = None):
        from twisted.internet import reactor

        self.reactor = reactor
        self.tasks = tasks
        self.settings = settings
        self.config = OpenClawSettings.from_settings(settings)
        self.cwd = str(cwd or os.getcwd())
        self.state_dir = Path(self.config.schedule_state_dir)
        if not self.state_dir.is_absolute():
            self.state_dir = Path(self.cwd) / self.state_dir
        self.lock_ttl = self.config.schedule_lock_ttl
        self.stop_timeout = self.config.schedule_stop_timeout
        self.node = f"{socket.gethostname()}:{os.getpid()}"
        self.locks, self.history, self.cursors = open_stores(settings, self.state_dir, self.lock_ttl)
        self.metrics = ScheduleMetrics()
        self.running: dict[str, _Run] = {}  # task id -> its active run
        self._runs: list[Deferred[None]] = []
        self._timers: dict[str, Any] = {}
        self.stopping = False
        self._stopped: Deferred[None] | None = None
        self._reaper: Any = None

    # ------------------------------------------------------------------ start / stop

    def start(self) -> Deferred[None]:
        """Report missed windows, start the metrics endpoint, arm every task's timer."""
        logger.info(
            "Scheduler started: %(n)d task(s); state in %(dir)s; %(locks)s; history in %(history)s",
            {
                "n": len(self.tasks),
                "dir": self.state_dir,
                "locks": self.locks.describe(),
                "history": self.history.describe(),
            },
        )
        port = self.config.schedule_metrics_port
        if port:
            self.metrics.listen(self.reactor, port, self.config.metrics_host)
        d = Deferred.fromCoroutine(self._start())
        d.addErrback(self._log_failure, "starting")
        return d

    async def _start(self) -> None:
        delay = START_RETRY_FIRST
        while True:
            try:
                runs = await deferToThread(self.history.runs)
                break
            except Exception as exc:  # Redis unreachable, say: keep trying, never give up silently
                if self.stopping:
                    return
                logger.error(
                    "Cannot read the run history from %(where)s (%(error)s); retrying in %(delay).0fs",
                    {"where": self.history.describe(), "error": exc, "delay": delay},
                )
                await self._sleep_plain(delay)
                delay = min(START_RETRY_MAX, delay * 2)
            if self.stopping:
                return
        if delay > START_RETRY_FIRST:
            logger.info("Run history %(where)s is reachable again; scheduling", {"where": self.history.describe()})
        await self._reap_stale(runs)
        if self.stopping:
            return
        self._catch_up(runs)
        self._reaper = create_looping_call(self._reap_periodically)
        self._reaper.start(max(1.0, self.lock_ttl), now=False)

    async def _reap_stale(self, runs: list[RunRecord]) -> None:
        """Windows left ``running`` by a scheduler that died: once their lock is free, ``interrupted``."""
        ours = {t.id for t in self.tasks}
        mine = {(run.task.id, run.record.window) for run in self.running.values()}
        for r in runs:
            if r.outcome != "running" or r.task not in ours or (r.task, r.window) in mine:
                continue
            lock = self.locks.lock(r.task, r.window)
            try:
                if not await deferToThread(lock.acquire):
                    continue  # its scheduler still holds it (alive, or its lock has not expired yet)
            except Exception as exc:
                logger.warning("Cannot check window %(run)s (%(error)s)", {"run": r.run_id, "error": exc})
                return
            try:
                latest = [x for x in await deferToThread(self.history.runs, r.task) if x.window == r.window]
                if latest and latest[-1].outcome == "running":
                    r.outcome, r.pid, r.end = "interrupted", None, time.time()
                    r.reason = f"its scheduler ({r.node}) ended without finishing it (lock expired)"
                    logger.warning(
                        "Task %(task)s: window %(window)s was left running by %(node)s, which is gone; "
                        "recorded as interrupted",
                        {"task": r.task, "window": r.window, "node": r.node},
                    )
                    await self._record_async(r)
            finally:
                await deferToThread(lock.release, False)

    def _reap_periodically(self) -> Deferred[None]:
        async def reap() -> None:
            try:
                runs = await deferToThread(self.history.runs)
            except Exception:  # reported by the runs themselves; try again next time
                return
            await self._reap_stale(runs)

        d = Deferred.fromCoroutine(reap())
        d.addErrback(self._log_failure, "checking for stale windows")
        return d

    def _catch_up(self, runs: list[RunRecord]) -> None:
        now = time.time()
        self.metrics.seed(runs)
        for task in self.tasks:
            missed, total = missed_windows(task, runs, now - MISSED_GRACE)
            unfinished = [r for r in runs if r.task == task.id and r.outcome in UNFINISHED]
            if total:
                logger.warning(
                    "Task %(task)s: %(n)d window(s) missed while the scheduler was down (latest %(last)s)",
                    {"task": task.id, "n": total, "last": window_id(missed[-1])},
                )
                for when in missed:
                    self._record(
                        RunRecord(
                            task.id, when, outcome="missed", node=self.node, reason="the scheduler was not running"
                        )
                    )
                    self.metrics.outcome(task.id, "missed")
            for r in unfinished:
                logger.warning(
                    "Task %(task)s: window %(window)s was left %(outcome)s (node %(node)s)",
                    {"task": task.id, "window": r.window, "outcome": r.outcome, "node": r.node},
                )
            candidates = [*missed, *(r.scheduled for r in unfinished)]
            if task.run_missed and candidates:
                latest = max(candidates)
                logger.info(
                    "Task %(task)s: running the missed window %(window)s once (run_missed)",
                    {"task": task.id, "window": window_id(latest)},
                )
                self._launch(task, latest)
            self._arm(task, now)

    def stop(self) -> Deferred[None]:
        """Stop firing; SIGTERM running crawls, SIGKILL them after the stop timeout; fires when all ended."""
        if self._stopped is not None:
            return self._stopped
        self.stopping = True
        if self._reaper is not None and self._reaper.running:
            self._reaper.stop()
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        logger.info(
            "Scheduler stopping: %(n)d running crawl(s) get SIGTERM and %(t)ss to checkpoint",
            {"n": len(self.running), "t": self.stop_timeout},
        )
        for run in list(self.running.values()):
            if run.sleeping is not None and not run.sleeping.called:
                run.sleeping.callback(None)
            self._terminate(run, kill_after=self.stop_timeout)
        self._stopped = DeferredList(list(self._runs), consumeErrors=True)
        self._stopped.addCallback(lambda _: self.metrics.stop_listening())
        self._stopped.addCallback(lambda _: logger.info("Scheduler stopped"))
        return self._stopped

    def kill_all(self) -> None:
        """Second signal: SIGKILL every crawl now."""
        for run in self.running.values():
            self._signal(run, signal.SIGKILL)

    # ------------------------------------------------------------------ timers

    def _arm(self, task: Task, now: float) -> None:
        if self.stopping:
            return
        when = task.next_window(now)
        self._timers[task.id] = call_later(max(0.0, when - time.time()), self._fire, task, when)

    def _fire(self, task: Task, when: float) -> None:
        self._timers.pop(task.id, None)
        self._arm(task, max(when, time.time()))  # a window we were late for is missed, not queued
        self._launch(task, when)

    def _launch(self, task: Task, when: float) -> None:
        if self.stopping:
            return
        if task.id in self.running:
            # Give a free node the chance to take this window first, then skip it if nobody did.
            previous = self.running[task.id].record.window
            coro: Any = self._skip_window(task, when, previous)
        else:
            coro = self._run_window(task, when)
        d = Deferred.fromCoroutine(coro)
        d.addErrback(self._log_failure, f"task {task.id} window {window_id(when)}")
        self._runs.append(d)
        d.addBoth(lambda result: (self._runs.remove(d), result)[1])

    # ------------------------------------------------------------------ one window

    async def _skip_window(self, task: Task, when: float, previous: str) -> None:
        await self._sleep_plain(SKIP_GRACE)
        lock = self.locks.lock(task.id, window_id(when))
        if self.stopping or not await deferToThread(lock.acquire):
            return  # another node runs it (or the stop came first: the window counts as missed)
        logger.warning(
            "Task %(task)s: window %(window)s skipped, the run of %(previous)s is still going",
            {"task": task.id, "window": window_id(when), "previous": previous},
        )
        await self._record_async(
            RunRecord(
                task.id, when, outcome="skipped", node=self.node, reason=f"the run of window {previous} was still going"
            )
        )
        self.metrics.outcome(task.id, "skipped")
        await deferToThread(lock.release, True)

    async def _sleep_plain(self, delay: float) -> None:
        wake: Deferred[None] = Deferred()
        call_later(delay, wake.callback, None)
        await wake

    async def _run_window(self, task: Task, when: float) -> None:
        wid = window_id(when)
        lock = self.locks.lock(task.id, wid)
        if not await deferToThread(lock.acquire):
            logger.info(
                "Task %(task)s: window %(window)s is run (or was run) elsewhere; not running it",
                {"task": task.id, "window": wid},
            )
            return
        base = Path(task.checkpoint_dir) if task.checkpoint_dir else self.state_dir / task.id
        if not base.is_absolute():
            base = Path(self.cwd) / base
        record = RunRecord(task.id, when, start=time.time(), node=self.node, checkpoint_dir=str(base / wid))
        run = _Run(task, record, lock, base / wid, self.state_dir / task.id / f"{wid}.run.json")
        if task.id in self.running:  # a catch-up and a timer raced for the lock's thread hop
            await deferToThread(lock.release, False)
            return
        self.running[task.id] = run
        self.metrics.started(task.id)
        extender = create_looping_call(self._extend, run)
        extender.start(max(0.5, self.lock_ttl / 3), now=False)
        try:
            await self._attempts(run)
        except Exception as exc:  # a bug or a bad value: the window fails, it never stays "running"
            record.outcome, record.reason = "failed", f"scheduler error: {type(exc).__name__}: {exc}"
            logger.error(
                "Task %(task)s: window %(window)s FAILED: %(reason)s",
                {"task": task.id, "window": wid, "reason": record.reason},
                exc_info=True,
            )
        finally:
            if extender.running:
                extender.stop()
            del self.running[task.id]
            record.end, record.pid = time.time(), None
            if run.lost is None:  # else another node may own the window now: its record, not ours
                await self._record_async(record)
            self.metrics.outcome(task.id, record.outcome, record.end)
            try:
                await deferToThread(lock.release, record.outcome in ("success", "failed"))
            except Exception as exc:  # Redis down: the lock expires by itself after the TTL
                logger.error(
                    "Task %(task)s: cannot release the lock of %(window)s: %(error)s",
                    {"task": task.id, "window": wid, "error": exc},
                )

    async def _attempts(self, run: _Run) -> None:
        task, record = run.task, run.record
        for attempt in range(1, task.max_attempts + 1):
            if self.stopping:
                record.outcome, record.reason = "interrupted", "the scheduler stopped"
                return
            if run.lost is not None:
                record.outcome, record.reason = "interrupted", f"lost the window lock: {run.lost}"
                return
            record.attempts = attempt
            ok, status, reason, report = await self._attempt(run, attempt)
            if run.lost is not None:
                record.outcome, record.reason = "interrupted", f"lost the window lock: {run.lost}"
                return
            record.exit_status, record.reason = status, reason
            stats = report.get("stats") or {}
            record.finish_reason = report.get("finish_reason")
            record.items = stats.get("item_scraped_count", 0) if report else record.items
            record.dead_letters = stats.get("openclaw/dlq/count", 0) if report else record.dead_letters
            if ok:
                record.outcome, record.reason = "success", None
                if task.incremental and "cursor" in report:
                    await deferToThread(self.cursors.set, task.id, report["cursor"])
                logger.info(
                    "Task %(task)s: window %(window)s succeeded (attempt %(n)d, %(items)s items)",
                    {"task": task.id, "window": record.window, "n": attempt, "items": record.items},
                )
                return
            if self.stopping:
                record.outcome = "interrupted"
                logger.warning(
                    "Task %(task)s: window %(window)s interrupted by the stop (%(reason)s); "
                    "its checkpoint is kept in %(dir)s",
                    {"task": task.id, "window": record.window, "reason": reason, "dir": run.window_dir},
                )
                return
            if attempt < task.max_attempts:
                delay = task.backoff(attempt)
                logger.warning(
                    "Task %(task)s: window %(window)s attempt %(n)d/%(max)d failed (%(reason)s); "
                    "retrying in %(delay).1fs, resuming from its checkpoint",
                    {
                        "task": task.id,
                        "window": record.window,
                        "n": attempt,
                        "max": task.max_attempts,
                        "reason": reason,
                        "delay": delay,
                    },
                )
                await self._record_async(record)
                await self._sleep(run, delay)
        record.outcome = "failed"
        logger.error(
            "Task %(task)s: window %(window)s FAILED after %(n)d attempt(s): %(reason)s",
            {"task": task.id, "window": record.window, "n": record.attempts, "reason": record.reason},
        )

    async def _attempt(self, run: _Run, attempt: int) -> tuple[bool, str, str | None, dict[str, Any]]:
        """One ``scrapy crawl``; (succeeded, exit status, why not, the RunStatsExtension report)."""
        task = run.task
        private_dir(run.window_dir)
        run.run_file.unlink(missing_ok=True)
        cursor = None
        if task.incremental:
            cursor = await deferToThread(self.cursors.get, task.id, task.initial_cursor)
        argv = crawl_command(task, self.settings, checkpoint_dir=run.window_dir, run_file=run.run_file, cursor=cursor)
        log_path = run.window_dir.with_name(f"{run.window_dir.name}.log")
        proto = _CrawlProtocol(log_path)
        proto.log.write(f"\n=== attempt {attempt}: {' '.join(argv)}\n".encode())
        run.timed_out = False
        env = {**os.environ, PARENT_ENV: str(os.getpid())}  # the crawl stops if we die (RunStatsExtension)
        run.process = self.reactor.spawnProcess(proto, argv[0], argv, env=env, path=self.cwd)
        run.record.pid = run.process.pid
        await self._record_async(run.record)
        logger.info(
            "Task %(task)s: window %(window)s attempt %(n)d started (pid %(pid)s, checkpoint %(dir)s)",
            {"task": task.id, "window": run.record.window, "n": attempt, "pid": run.process.pid, "dir": run.window_dir},
        )
        if task.timeout:
            run.timers.append(call_later(task.timeout, self._on_timeout, run))
        try:
            status = await proto.ended
        finally:
            for timer in run.timers:
                timer.cancel()
            run.timers.clear()
            run.process, run.record.pid = None, None
        report = await deferToThread(_read_report, run.run_file)
        if run.timed_out:
            return False, status, f"timed out after {task.timeout}s (exit {status})", report
        if status != "0":
            return False, status, f"the crawl exited with {status}", report
        if not report:
            return False, status, "the crawl left no run report (did RunStatsExtension load?)", report
        if report.get("finish_reason") in UNFINISHED_REASONS:
            return False, status, f"the crawl stopped early ({report['finish_reason']})", report
        if task.incremental and "cursor" not in report:
            return False, status, f"the cursor could not be saved: {report.get('cursor_error')}", report
        return True, status, None, report

    # ------------------------------------------------------------------ helpers

    def _on_timeout(self, run: _Run) -> None:
        logger.error(
            "Task %(task)s: window %(window)s attempt timed out after %(t)ss; stopping the crawl",
            {"task": run.task.id, "window": run.record.window, "t": run.task.timeout},
        )
        run.timed_out = True
        self._terminate(run, kill_after=self.stop_timeout)

    def _terminate(self, run: _Run, kill_after: float) -> None:
        if run.process is None:
            return
        self._signal(run, signal.SIGTERM)
        run.timers.append(call_later(kill_after, self._signal, run, signal.SIGKILL))

    def _signal(self, run: _Run, signum: int) -> None:
        if run.process is None:
            return
        try:
            run.process.signalProcess(signum)
        except terror.ProcessExitedAlready:
            pass

    def _extend(self, run: _Run) -> None:
        d = deferToThread(run.lock.extend)

        def check(held: bool) -> None:
            if held:
                run.extended_at = time.monotonic()
            else:
                self._lose_lock(run, "another node took it over or it expired")

        def failed(failure: Any) -> None:
            unheld = time.monotonic() - run.extended_at
            if unheld > self.lock_ttl:  # it has expired by now: another node may take the window
                self._lose_lock(run, f"not extended for {unheld:.0f}s ({failure.getErrorMessage()})")
            else:
                logger.warning(
                    "Task %(task)s: cannot extend the lock of window %(window)s (%(error)s); retrying",
                    {"task": run.task.id, "window": run.record.window, "error": failure.getErrorMessage()},
                )

        d.addCallbacks(check, failed)

    def _lose_lock(self, run: _Run, why: str) -> None:
        """The window may run elsewhere now: stop our crawl rather than run it twice."""
        if run.lost is not None:
            return
        run.lost = why
        logger.error(
            "Task %(task)s: lost the lock of window %(window)s (%(key)s): %(why)s; stopping its crawl "
            "so that the window does not run twice",
            {"task": run.task.id, "window": run.record.window, "key": run.lock.key, "why": why},
        )
        if run.sleeping is not None and not run.sleeping.called:
            run.sleeping.callback(None)
        self._terminate(run, kill_after=self.stop_timeout)

    async def _sleep(self, run: _Run, delay: float) -> None:
        wake: Deferred[None] = Deferred()
        run.sleeping = wake
        timer = call_later(delay, lambda: wake.called or wake.callback(None))
        try:
            await wake
        finally:
            timer.cancel()
            run.sleeping = None

    def _record(self, record: RunRecord) -> None:
        d = deferToThread(self.history.append, record)
        d.addErrback(self._log_failure, f"recording {record.run_id} in {self.history.describe()}")

    async def _record_async(self, record: RunRecord) -> None:
        data = RunRecord.from_dict(record.to_dict())  # a copy: the thread must not see later changes
        try:
            await deferToThread(self.history.append, data)
        except Exception as exc:  # history is best effort: the run itself goes on
            logger.error(
                "Cannot record %(run)s in %(where)s: %(error)s",
                {"run": record.run_id, "where": self.history.describe(), "error": exc},
            )

    @staticmethod
    def _log_failure(failure: Any, what: str) -> None:
        logger.error(
            "Scheduler error while %(what)s: %(error)s",
            {"what": what, "error": failure.getErrorMessage()},
            exc_info=(failure.type, failure.value, failure.getTracebackObject()),
        )


def open_stores(settings: BaseSettings, state_dir: Path, lock_ttl: float) -> tuple[Any, Any, Any]:
    """(locks, history, cursors): in Redis with ``REDIS_URL``, else under *state_dir*."""
    url = settings.get("REDIS_URL")
    if url:
        prefix = read_setting(settings, "OPENCLAW_SCHEDULE_REDIS_PREFIX")
        client = redis_client(url)
        return (
            RedisLocks(client, prefix=prefix, ttl=lock_ttl),
            RedisHistory(client, f"{prefix}:history"),
            RedisCursors(client, prefix),
        )
    return FileLocks(state_dir / "locks"), JsonlHistory(state_dir / "history.jsonl"), FileCursors(state_dir)


def crawl_command(
    task: Task,
    settings: BaseSettings,
    *,
    checkpoint_dir: Path,
    run_file: Path,
    cursor: Any = None,
    python: str = sys.executable,
) -> list[str]:
    """The ``scrapy crawl`` command line of one attempt."""
    argv = [python, "-m", "scrapy", "crawl", task.spider]
    extensions = _component_dict(settings.getdict("EXTENSIONS"))
    for name, value in task.settings.items():
        if name == "EXTENSIONS":
            extensions.update(_component_dict(value))
        else:
            argv += ["-s", f"{name}={setting_text(value)}"]
    extensions[RUN_STATS_EXTENSION] = 10_000  # last: it reports the stats the others left
    argv += [
        "-s",
        f"EXTENSIONS={json.dumps(extensions)}",
        "-s",
        f"OPENCLAW_CHECKPOINT_DIR={checkpoint_dir}",
        "-s",
        f"OPENCLAW_SCHEDULE_RUN_FILE={run_file}",
    ]
    for name, value in task.args.items():
        argv += ["-a", f"{name}={value if isinstance(value, str) else json.dumps(value)}"]
    if task.incremental:
        argv += ["-a", f"{CURSOR_ARG}={json.dumps(cursor)}"]
    return argv


def setting_text(value: Any) -> str:
    """A ``-s`` value Scrapy's typed getters read back as *value*."""
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value)


def _component_dict(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        value = json.loads(value) if value.strip() else {}
    return {k if isinstance(k, str) else f"{k.__module__}.{k.__qualname__}": v for k, v in dict(value).items()}


def _read_report(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except ValueError as exc:
        logger.error("Unreadable run report %(path)s: %(error)s", {"path": path, "error": exc})
        return {}


def install_signal_handlers(scheduler: Scheduler, stop_reactor: Callable[[], None]) -> None:
    """First SIGTERM/SIGINT: clean stop then ``stop_reactor``; a second one: SIGKILL the crawls."""
    from scrapy.utils.ossignal import install_shutdown_handlers, signal_names

    def handler(signum: int, _frame: Any) -> None:
        name = signal_names.get(signum, signum)
        if scheduler.stopping:
            logger.info("Received %(signal)s again: killing the running crawls", {"signal": name})
            scheduler.reactor.callFromThread(scheduler.kill_all)
            return
        logger.info("Received %(signal)s: stopping the scheduler", {"signal": name})
        scheduler.reactor.callFromThread(lambda: scheduler.stop().addBoth(lambda _: stop_reactor()))

    install_shutdown_handlers(handler)
