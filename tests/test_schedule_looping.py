"""Every looping call the package starts survives its ticks; the scheduler's reaper runs past its lock TTL.

Scrapy's ``create_looping_call`` gives an ``AsyncioLoopingCall`` on the
asyncio reactor, which stops (and raises ``TypeError`` into the loop) when its
function returns a Deferred or a coroutine; Twisted's ``LoopingCall`` would
have waited for it. So each function we loop must return nothing.
"""

from __future__ import annotations

import ast
import re
import time
from pathlib import Path
from typing import Any

import pytest

from scrapy_openclaw.schedule.history import JsonlHistory, RunRecord
from scrapy_openclaw.testing.chaos import reachable_urls
from tests.test_schedule_run import SchedulerProcess, make_project, site, successes, wait_for, write_tasks

PACKAGE = Path(__file__).resolve().parents[1] / "scrapy_openclaw"
TROUBLE = ("Task exception was never retrieved", "Traceback", "AsyncioLoopingCall", "Unhandled error")


def _looping_functions() -> list[tuple[str, str]]:
    """(module file, looped function name) for every create_looping_call / LoopingCall in the package."""
    found = []
    pattern = re.compile(r"(?:create_looping_call|LoopingCall)\(\s*([\w.]+)")
    for path in sorted(PACKAGE.rglob("*.py")):
        for match in pattern.finditer(path.read_text(encoding="utf-8")):
            found.append((str(path.relative_to(PACKAGE)), match.group(1).rsplit(".", 1)[-1]))
    return found


#: Every function the package loops, by module; ``func`` in the checkpoint extension loops two.
LOOPED = {
    ("metrics/logtable.py", "log"): ["log"],
    ("dlq/pipeline.py", "_sync"): ["_sync"],
    ("control/channel.py", "poll"): ["poll"],
    ("schedule/scheduler/__init__.py", "_reap_periodically"): ["_reap_periodically"],
    ("schedule/scheduler/window.py", "_extend"): ["_extend"],
    ("schedule/extension.py", "_check_parent"): ["_check_parent"],
    ("distributed/queue.py", "_tick"): ["_tick"],
    ("report/extension.py", "_tick"): ["_tick"],
    ("health/lag.py", "_sample"): ["_sample"],
    ("sites/extension.py", "_save_in_background"): ["_save_in_background"],
    ("health/notices.py", "check"): ["check"],
    ("checkpoint/extension/__init__.py", "func"): ["commit", "periodic_snapshot"],
}


def test_the_looped_functions_are_the_known_ones() -> None:
    """A new looping call must be listed in LOOPED (and so checked below)."""
    assert sorted(_looping_functions()) == sorted(LOOPED)


@pytest.mark.parametrize(("module", "name"), sorted(LOOPED))
def test_no_looped_function_returns_a_deferred_or_a_coroutine(module: str, name: str) -> None:
    """Each looped function is a plain ``def`` whose declared return (mypy holds it to it) is not awaitable."""
    names = set(LOOPED[(module, name)])
    defs: list[ast.FunctionDef | ast.AsyncFunctionDef] = []  # the module or a sibling (a mixin next to it)
    for path in sorted((PACKAGE / module).parent.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        defs += [
            n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name in names
        ]
    assert {d.name for d in defs} >= names, f"{module}: no def of {names}"
    for func in defs:
        assert isinstance(func, ast.FunctionDef), f"{module}.{func.name} is async"
        assert func.returns is not None, f"{module}.{func.name} declares no return type"
        declared = ast.unparse(func.returns)
        assert not re.search(r"Deferred|Coroutine|Awaitable|Future", declared), f"{module}.{func.name} -> {declared}"


def _log(sched: SchedulerProcess) -> Any:
    return lambda: sched.log


def test_scheduler_reaper_ticks_past_the_lock_ttl(tmp_path: Path) -> None:
    """Windows a dead scheduler left running are reaped by the periodic reaper, tick after tick, cleanly.

    Each stale record is written after the scheduler started (the reap at start
    cannot see it), so only a periodic tick can record it interrupted.
    """
    project = make_project(tmp_path / "proj")
    tasks = write_tasks(
        project / "tasks.yaml",
        """
        tasks:
          hourly:
            spider: chaos
            interval: 3600
            args: {start_urls: "http://127.0.0.1:9/"}
    """,
    )
    history = JsonlHistory(project / "openclaw-schedule" / "history.jsonl")
    sched = SchedulerProcess(project, tasks, "OPENCLAW_SCHEDULE_LOCK_TTL=1")
    try:
        wait_for(lambda: "Scheduler started" in sched.log, 60, "the scheduler to start", _log(sched))
        past = int(time.time()) // 3600 * 3600 - 3600 * 24
        for n in range(3):
            window = past - 3600 * n
            history.append(RunRecord("hourly", window, outcome="running", start=time.time(), node="gone:1"))
            wait_for(
                lambda w=window: any(r.scheduled == w and r.outcome == "interrupted" for r in history.runs("hourly")),
                60,
                f"the reaper to record stale window {n} interrupted",
                _log(sched),
            )
    finally:
        code = sched.stop()
    log = sched.log
    assert code == 0, log[-4000:]
    assert log.count("which is gone; recorded as interrupted") == 3, log[-4000:]
    for text in TROUBLE:
        assert text not in log, log[-4000:]


def test_scheduled_crawl_under_a_short_lock_ttl_is_clean(chaos_server: Any, tmp_path: Path) -> None:
    """A window's crawl outlives several lock extensions (TTL 1 s: every 0.5 s); nothing throws."""
    server = chaos_server(site(pages=15, latency=0.3))
    project = make_project(tmp_path / "proj")
    tasks = write_tasks(
        project / "tasks.yaml",
        f"""
        tasks:
          every3:
            spider: chaos
            interval: 3
            args: {{start_urls: "{server.start_urls[0]}"}}
            settings: {{CONCURRENT_REQUESTS: 1, LOGSTATS_INTERVAL: 0.5}}
    """,
    )
    history = JsonlHistory(project / "openclaw-schedule" / "history.jsonl")
    sched = SchedulerProcess(project, tasks, "OPENCLAW_SCHEDULE_LOCK_TTL=1")
    try:
        runs = wait_for(lambda: successes(history.runs(), "every3"), 120, "a successful run", _log(sched))
    finally:
        code = sched.stop()
    assert code == 0, sched.log[-4000:]
    run = runs[0]
    assert run.start is not None and run.end is not None
    crawl_log = Path(run.checkpoint_dir).with_name(f"{run.window}.log").read_text(encoding="utf-8", errors="replace")
    assert run.items == len(reachable_urls(server.config, server.urls).ok)
    for text in TROUBLE:
        assert text not in sched.log, sched.log[-4000:]
        assert text not in crawl_log, crawl_log[-4000:]
