"""The foreground scheduler: fires each task's windows as ``scrapy crawl`` subprocesses.

Everything runs on the Twisted reactor; the blocking calls (Redis, lock files,
history) go to its thread pool. The lifecycle (start, catch-up, stale windows,
timers, stop) is here; :mod:`.window` runs one window and :mod:`.crawls` its
crawl process. What a window, a stop or an outage does: docs/scheduled.md.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy.utils.asyncio import call_later, create_looping_call
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.threads import deferToThread

from scrapy_openclaw.paths import resolve_path
from scrapy_openclaw.schedule.history import UNFINISHED, RunRecord, late_window, missed_windows
from scrapy_openclaw.schedule.metrics import ScheduleMetrics
from scrapy_openclaw.schedule.scheduler.backends import open_stores
from scrapy_openclaw.schedule.scheduler.command import RUN_STATS_EXTENSION, crawl_command, setting_text
from scrapy_openclaw.schedule.scheduler.crawls import WindowRun
from scrapy_openclaw.schedule.scheduler.window import SKIP_GRACE, UNFINISHED_REASONS, WindowRunner
from scrapy_openclaw.schedule.tasks import Task, window_id
from scrapy_openclaw.settings import OpenClawSettings

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy.settings import BaseSettings

__all__ = [
    "MISSED_GRACE",
    "RUN_STATS_EXTENSION",
    "SKIP_GRACE",
    "START_RETRY_FIRST",
    "START_RETRY_MAX",
    "UNFINISHED_REASONS",
    "Scheduler",
    "WindowRun",
    "crawl_command",
    "install_signal_handlers",
    "open_stores",
    "setting_text",
]

logger = logging.getLogger(__name__)

#: A window is reported missed only once it is this many seconds old (a live node may be recording it).
MISSED_GRACE = 5.0
#: Retries of the history at start (Redis unreachable): first wait and cap, seconds.
START_RETRY_FIRST = 1.0
START_RETRY_MAX = 30.0


class Scheduler(WindowRunner):
    """Runs *tasks* until :meth:`stop`; ``start()`` on the reactor."""

    def __init__(self, tasks: list[Task], settings: BaseSettings, *, cwd: str | Path | None = None):
        from twisted.internet import reactor

        self.reactor = reactor
        self.tasks = tasks
        self.settings = settings
        self.config = OpenClawSettings.from_settings(settings)
        self.cwd = str(cwd or os.getcwd())
        self.state_dir = resolve_path(self.config.schedule_state_dir, setting="OPENCLAW_SCHEDULE_STATE_DIR")
        self.lock_ttl = self.config.schedule_lock_ttl
        self.stop_timeout = self.config.schedule_stop_timeout
        self.node = f"{socket.gethostname()}:{os.getpid()}"
        self.locks, self.history, self.cursors = open_stores(
            settings, self.state_dir, self.lock_ttl, prefix=self.config.schedule_redis_prefix
        )
        self.metrics = ScheduleMetrics()
        self.running = {}  # task id -> its active run
        self._runs: list[Deferred[None]] = []
        self._timers: dict[str, Any] = {}
        self.stopping = False
        self._stopped: Deferred[Any] | None = None
        self._reaper: Any = None
        self._reaping: Deferred[None] | None = None  # the reap a looping-call tick started, while it runs

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
            self.metrics.listen(self.reactor, port, self.config.metrics_host, self.config.allowed_hosts)
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
        await self._catch_up(runs)
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

    def _reap_periodically(self) -> None:
        """A looping-call tick: start a reap unless the last one is still running.

        Returns nothing: Scrapy's asyncio looping call refuses a function that
        returns a Deferred or a coroutine (and stops).
        """
        if self._reaping is not None:
            return

        async def reap() -> None:
            try:
                runs = await deferToThread(self.history.runs)
            except Exception:  # reported by the runs themselves; try again next time
                return
            await self._reap_stale(runs)

        def done(result: Any) -> Any:
            self._reaping = None
            return result

        self._reaping = Deferred.fromCoroutine(reap())
        self._reaping.addBoth(done)
        self._reaping.addErrback(self._log_failure, "checking for stale windows")

    async def _catch_up(self, runs: list[RunRecord]) -> None:
        """Record the windows missed while down, then run the late or missed one.

        The ``missed`` records are written before any window starts: a record
        still in the thread pool could land after the run's own ``running``
        record and hide it (status, and the reaper, read the latest record).
        """
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
                    await self._record_async(
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
            late = late_window(task, runs, now, MISSED_GRACE)
            if late is not None:  # (the newest window; one task runs one window at a time)
                logger.info(
                    "Task %(task)s: window %(window)s passed %(ago).1fs before the scheduler started; running it now",
                    {"task": task.id, "window": window_id(late), "ago": now - late},
                )
                self._launch(task, late)
            elif task.run_missed and candidates:
                latest = max(candidates)
                logger.info(
                    "Task %(task)s: running the missed window %(window)s once (run_missed)",
                    {"task": task.id, "window": window_id(latest)},
                )
                self._launch(task, latest)
            self._arm(task, now)

    def stop(self) -> Deferred[Any]:
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
        stopped: Deferred[Any] = DeferredList(list(self._runs), consumeErrors=True)
        self._stopped = stopped
        stopped.addCallback(lambda _: self.metrics.stop_listening())
        stopped.addCallback(lambda _: logger.info("Scheduler stopped"))
        return stopped

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

        def forget(result: Any) -> Any:
            self._runs.remove(d)
            return result

        d.addBoth(forget)


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
