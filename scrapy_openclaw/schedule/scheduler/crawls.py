"""One crawl subprocess of a window: its output, its timeout, its signals and the window lock it holds.

A crawl gets SIGTERM (Scrapy's graceful stop, a final checkpoint) and, after
a grace period, SIGKILL; the window lock is extended while it runs, and a
lost lock stops the crawl so that no window runs twice.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scrapy.utils.asyncio import call_later
from twisted.internet import error as terror
from twisted.internet import protocol
from twisted.internet.defer import Deferred
from twisted.internet.threads import deferToThread

from scrapy_openclaw._files import open_private
from scrapy_openclaw.schedule.history import RunRecord
from scrapy_openclaw.schedule.scheduler.state import SchedulerState
from scrapy_openclaw.schedule.tasks import Task

logger = logging.getLogger(__name__)


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
class WindowRun:
    """A window being run: its record, its lock, its crawl process and timers."""

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


class CrawlControl(SchedulerState):
    """Part of the Scheduler: stopping crawls (timeout, SIGTERM then SIGKILL) and keeping the window lock."""

    def _on_timeout(self, run: WindowRun) -> None:
        logger.error(
            "Task %(task)s: window %(window)s attempt timed out after %(t)ss; stopping the crawl",
            {"task": run.task.id, "window": run.record.window, "t": run.task.timeout},
        )
        run.timed_out = True
        self._terminate(run, kill_after=self.stop_timeout)

    def _terminate(self, run: WindowRun, kill_after: float) -> None:
        if run.process is None:
            return
        self._signal(run, signal.SIGTERM)
        run.timers.append(call_later(kill_after, self._signal, run, signal.SIGKILL))

    def _signal(self, run: WindowRun, signum: int) -> None:
        if run.process is None:
            return
        try:
            run.process.signalProcess(signum)
        except terror.ProcessExitedAlready:
            pass

    def _extend(self, run: WindowRun) -> None:
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

    def _lose_lock(self, run: WindowRun, why: str) -> None:
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

    async def _sleep(self, run: WindowRun, delay: float) -> None:
        wake: Deferred[None] = Deferred()
        run.sleeping = wake

        def wake_up() -> None:
            if not wake.called:
                wake.callback(None)

        timer = call_later(delay, wake_up)
        try:
            await wake
        finally:
            timer.cancel()
            run.sleeping = None

    async def _sleep_plain(self, delay: float) -> None:
        wake: Deferred[None] = Deferred()
        call_later(delay, wake.callback, None)
        await wake
