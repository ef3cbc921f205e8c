"""``scrapy openclaw-schedule TASKS.yaml`` (foreground scheduler) and ``... status [TASKS.yaml]``.

The command is thin: it validates the tasks file (a bad one exits 2 with the
file, line and key), then runs :class:`~scrapy_openclaw.schedule.scheduler.Scheduler`
on the Twisted reactor until SIGTERM/SIGINT (a second signal kills the
running crawls). ``status`` reads the run history (jsonl or, with
``REDIS_URL``, Redis); given the tasks file it also lists the windows missed
since the last recorded run and the next window of each task.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError

from scrapy_openclaw.commands.addon_check import check_crawl_command
from scrapy_openclaw.exceptions import OpenClawConfigError
from scrapy_openclaw.paths import resolve_path
from scrapy_openclaw.settings import OpenClawSettings, validate_settings

if TYPE_CHECKING:
    import argparse

    from scrapy_openclaw.schedule.tasks import Task


def _print_tasks(per_task: list[dict[str, Any]]) -> None:
    """One row a task: its schedule, next window, last success, outcomes, windows missed now."""
    rows = [
        [
            t["task"],
            t["schedule"],
            _when(t["next"]),
            _when(t["last_success"]),
            " ".join(f"{k}={v}" for k, v in sorted(t["outcomes"].items())) or "-",
            str(t["missed_now_count"]),
        ]
        for t in per_task
    ]
    print(_table(rows, ["TASK", "SCHEDULE", "NEXT (UTC)", "LAST SUCCESS", "OUTCOMES", "MISSED NOW"]))
    for t in per_task:
        if t["missed_now"]:
            print(f"{t['task']}: missed since the last recorded run: {', '.join(t['missed_now'])}")
    print()


def _print_runs(names: list[str], runs: list[Any], limit: int) -> None:
    """The last *limit* runs of each task named (none when *limit* is 0)."""
    rows = []
    for name in names:
        mine = [r for r in runs if r.task == name][-max(limit, 0) :] if limit else []
        rows += [
            [
                r.task,
                r.window,
                r.outcome,
                str(r.attempts),
                r.exit_status or "-",
                _when(r.start),
                _when(r.end),
                "-" if r.items is None else str(r.items),
                "-" if r.dead_letters is None else str(r.dead_letters),
                r.reason or "",
            ]
            for r in mine
        ]
    print(_table(rows, ["TASK", "WINDOW", "OUTCOME", "ATTEMPTS", "EXIT", "START", "END", "ITEMS", "DEAD", "REASON"]))


def _when(ts: float | None) -> str:
    if not ts:
        return "-"
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _table(rows: list[list[str]], headers: list[str]) -> str:
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines)


class Command(ScrapyCommand):
    requires_project = False
    requires_crawler_process = False
    default_settings = {"LOG_ENABLED": True}

    def __init__(self) -> None:
        super().__init__()
        check_crawl_command()  # Scrapy builds every command for every `scrapy` run: the one place that always runs

    def syntax(self) -> str:
        return "TASKS.yaml | status [TASKS.yaml]"

    def short_desc(self) -> str:
        return "Run scheduled crawls from a tasks file (foreground), or show run history"

    def long_desc(self) -> str:
        return (
            "Run the tasks of TASKS.yaml in the foreground, each window as a `scrapy crawl` subprocess "
            "(retried with backoff, resuming from its checkpoint); SIGTERM/SIGINT stops cleanly. "
            "`status [TASKS.yaml]` shows the run history and missed windows."
        )

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--json", action="store_true", help="status: print JSON")
        parser.add_argument("--limit", type=int, default=10, help="status: runs shown per task (default 10)")

    def run(self, args: list[str], opts: Any) -> None:
        if not args:
            raise UsageError("expected TASKS.yaml or `status [TASKS.yaml]`")
        if args[0] == "status":
            if len(args) > 2:
                raise UsageError("status takes at most one tasks file")
            self._status(args[1] if len(args) == 2 else None, opts)
            return
        if len(args) != 1:
            raise UsageError("expected one tasks file")
        self._run_scheduler(self._load(args[0]))

    def _load(self, path: str) -> list[Task]:
        from scrapy_openclaw.schedule.tasks import load_tasks

        try:
            validate_settings(self.settings)
            return load_tasks(path)
        except OpenClawConfigError as exc:
            raise UsageError(str(exc), print_help=False) from None

    # ------------------------------------------------------------------ run

    def _run_scheduler(self, tasks: list[Task]) -> None:
        from scrapy.utils.log import configure_logging
        from scrapy.utils.reactor import install_reactor, is_reactor_installed

        settings = self.settings
        assert settings is not None  # (scrapy's cmdline sets it before run())
        configure_logging(settings)
        if not is_reactor_installed() and settings.get("TWISTED_REACTOR"):
            install_reactor(settings["TWISTED_REACTOR"], settings.get("ASYNCIO_EVENT_LOOP"))
        from twisted.internet import reactor as installed_reactor

        from scrapy_openclaw.schedule.scheduler import Scheduler, install_signal_handlers

        # (zope interface methods take no self: without a zope plugin mypy misreads IReactorCore)
        reactor: Any = installed_reactor
        scheduler = Scheduler(tasks, settings)

        def stop_reactor() -> None:
            if reactor.running:
                reactor.stop()

        reactor.callWhenRunning(scheduler.start)
        # After startup: replaces Twisted's SIGINT/SIGTERM handlers, keeps its SIGCHLD one.
        reactor.addSystemEventTrigger("after", "startup", install_signal_handlers, scheduler, stop_reactor)
        reactor.run()

    # ------------------------------------------------------------------ status

    def _status(self, tasks_path: str | None, opts: Any) -> None:
        from scrapy_openclaw.schedule.history import summary
        from scrapy_openclaw.schedule.scheduler import open_stores

        tasks = self._load(tasks_path) if tasks_path else []
        assert self.settings is not None  # (scrapy's cmdline sets it before run())
        try:
            config = OpenClawSettings.from_settings(self.settings)
        except OpenClawConfigError as exc:
            raise UsageError(str(exc), print_help=False) from None
        state_dir = resolve_path(config.schedule_state_dir, setting="OPENCLAW_SCHEDULE_STATE_DIR")
        _locks, history, _cursors = open_stores(self.settings, state_dir, 60.0, prefix=config.schedule_redis_prefix)
        runs = history.runs()
        now = time.time()
        per_task = summary(tasks, runs, now - 5.0) if tasks else []
        if opts.json:
            print(
                json.dumps(
                    {"history": history.describe(), "tasks": per_task, "runs": [r.to_dict() for r in runs]},
                    indent=1,
                    sort_keys=True,
                )
            )
            return
        print(f"history: {history.describe()} ({len(runs)} run(s))")
        if per_task:
            _print_tasks(per_task)
        _print_runs([t.id for t in tasks] or sorted({r.task for r in runs}), runs, opts.limit)
