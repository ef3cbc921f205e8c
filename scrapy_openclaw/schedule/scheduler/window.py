"""One window of a task: take its lock, run the crawl attempts, record the outcome.

Every attempt runs ``scrapy crawl`` with the window's checkpoint directory, so
a retry resumes rather than starts over; a window still running when the next
one is due is skipped (after a grace period that lets a free node take it).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from scrapy.utils.asyncio import call_later, create_looping_call
from twisted.internet.threads import deferToThread

from scrapy_openclaw._files import private_dir
from scrapy_openclaw.paths import resolve_path
from scrapy_openclaw.schedule.extension import PARENT_ENV
from scrapy_openclaw.schedule.history import RunRecord
from scrapy_openclaw.schedule.scheduler.command import crawl_command
from scrapy_openclaw.schedule.scheduler.crawls import CrawlControl, WindowRun, _CrawlProtocol
from scrapy_openclaw.schedule.tasks import Task, window_id

logger = logging.getLogger(__name__)

#: Crawl finish reasons that mean "stopped before the end": the window is retried.
UNFINISHED_REASONS = ("shutdown", "cancelled")
#: A node still busy with a task's previous window waits this long (s) before recording the new
#: window as skipped, so that a free node takes it first.
SKIP_GRACE = 1.0


class WindowRunner(CrawlControl):
    """Part of the Scheduler: running (or skipping) one window, attempt by attempt."""

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

    async def _run_window(self, task: Task, when: float) -> None:
        wid = window_id(when)
        lock = self.locks.lock(task.id, wid)
        if not await deferToThread(lock.acquire):
            logger.info(
                "Task %(task)s: window %(window)s is run (or was run) elsewhere; not running it",
                {"task": task.id, "window": wid},
            )
            return
        base = (
            resolve_path(task.checkpoint_dir, setting=f"checkpoint_dir of task {task.id}")
            if task.checkpoint_dir
            else self.state_dir / task.id
        )
        record = RunRecord(task.id, when, start=time.time(), node=self.node, checkpoint_dir=str(base / wid))
        run = WindowRun(task, record, lock, base / wid, self.state_dir / task.id / f"{wid}.run.json")
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

    async def _attempts(self, run: WindowRun) -> None:
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
            _take_report(record, status, reason, report)
            if ok:
                await self._succeeded(run, attempt, report)
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
                await self._retry_later(run, attempt, reason)
        record.outcome = "failed"
        logger.error(
            "Task %(task)s: window %(window)s FAILED after %(n)d attempt(s): %(reason)s",
            {"task": task.id, "window": record.window, "n": record.attempts, "reason": record.reason},
        )

    async def _succeeded(self, run: WindowRun, attempt: int, report: dict[str, Any]) -> None:
        """Record the success and, for an incremental task, store the cursor the crawl reported."""
        task, record = run.task, run.record
        record.outcome, record.reason = "success", None
        if task.incremental and "cursor" in report:
            await deferToThread(self.cursors.set, task.id, report["cursor"])
        logger.info(
            "Task %(task)s: window %(window)s succeeded (attempt %(n)d, %(items)s items)",
            {"task": task.id, "window": record.window, "n": attempt, "items": record.items},
        )

    async def _retry_later(self, run: WindowRun, attempt: int, reason: str | None) -> None:
        """Record the failed attempt and wait the task's backoff (cut short by a stop or a lost lock)."""
        task, record = run.task, run.record
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

    async def _attempt(self, run: WindowRun, attempt: int) -> tuple[bool, str, str | None, dict[str, Any]]:
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


def _take_report(record: RunRecord, status: str, reason: str | None, report: dict[str, Any]) -> None:
    """Copy an attempt's exit status, reason and reported figures into the window's record."""
    record.exit_status, record.reason = status, reason
    stats = report.get("stats") or {}
    record.finish_reason = report.get("finish_reason")
    record.items = stats.get("item_scraped_count", 0) if report else record.items
    record.dead_letters = stats.get("openclaw/dlq/count", 0) if report else record.dead_letters


def _read_report(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except ValueError as exc:
        logger.error("Unreadable run report %(path)s: %(error)s", {"path": path, "error": exc})
        return {}
