"""The scheduler when things go wrong (issue 17, items 8, 9, 10): real schedulers, crawls, Redis and SIGKILL."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from test_schedule_run import _just_missed, make_project, schedulers, site, successes, wait_for, write_tasks

from scrapy_openclaw.schedule.history import JsonlHistory, RedisHistory
from scrapy_openclaw.schedule.locks import redis_client

__all__ = ["schedulers"]  # the fixture, imported for these tests


def alive(pid: int) -> bool:
    """Whether *pid* runs (a zombie waiting for a reaper counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def test_task_with_policy_setting_runs(chaos_server: Any, tmp_path: Path, schedulers: Any) -> None:
    server = chaos_server(site(pages=2))
    project = make_project(tmp_path / "proj")
    tasks = write_tasks(
        project / "tasks.yaml",
        f"""
        tasks:
          pol:
            spider: chaos
            interval: 2
            args: {{start_urls: "{server.start_urls[0]}"}}
            settings:
              OPENCLAW_POLICY: {{defaults: {{health: {{burst: 3}}, retry: {{network: {{max_attempts: 2}}}}}}}}
    """,
    )
    history = JsonlHistory(project / "openclaw-schedule" / "history.jsonl")
    sched = schedulers(project, tasks)
    wait_for(lambda: successes(history.runs(), "pol"), 90, "a successful window", lambda: sched.log)
    assert sched.stop() == 0
    assert "must be a mapping" not in sched.log


@pytest.mark.crawl  # runs a crawl or a subprocess
def test_crashing_window_is_recorded_failed_not_running(tmp_path: Path, schedulers: Any) -> None:
    project = make_project(tmp_path / "proj")
    (project / "not-a-dir").write_text("a file where the window's checkpoint directory should go")
    tasks = write_tasks(
        project / "tasks.yaml",
        """
        tasks:
          broken:
            spider: chaos
            interval: 2
            checkpoint_dir: not-a-dir
    """,
    )
    history = JsonlHistory(project / "openclaw-schedule" / "history.jsonl")
    sched = schedulers(project, tasks)
    failed = wait_for(
        lambda: [r for r in history.runs("broken") if r.outcome == "failed"], 60, "a failed window", lambda: sched.log
    )
    assert sched.stop() == 0
    assert "scheduler error" in failed[0].reason
    assert all(r.outcome != "running" for r in history.runs("broken"))


def test_scheduler_waits_for_redis_then_schedules(
    chaos_server: Any, redis_server: Any, tmp_path: Path, schedulers: Any
) -> None:
    server = chaos_server(site(pages=1))
    project = make_project(tmp_path / "proj")
    tasks = write_tasks(
        project / "tasks.yaml",
        f"""
        tasks:
          later:
            spider: chaos
            interval: 2
            args: {{start_urls: "{server.start_urls[0]}"}}
    """,
    )
    url = redis_server.url
    redis_server.stop()
    sched = schedulers(project, tasks, f"REDIS_URL={url}")
    wait_for(lambda: sched.log.count("Cannot read the run history") >= 2, 30, "two retries", lambda: sched.log)
    redis_server.start()
    history = RedisHistory(redis_client(url), "openclaw:schedule:history")
    wait_for(lambda: successes(history.runs(), "later"), 90, "a window after Redis came back", lambda: sched.log)
    assert sched.stop() == 0
    assert "reachable again; scheduling" in sched.log


def test_sigkilled_scheduler_takes_its_crawl_along(chaos_server: Any, tmp_path: Path, schedulers: Any) -> None:
    server = chaos_server(site(pages=80, latency=0.3))
    project = make_project(tmp_path / "proj")
    history = JsonlHistory(project / "openclaw-schedule" / "history.jsonl")
    task = f"""
        tasks:
          long:
            spider: chaos
            cron: "{_just_missed(history, "long")}"
            args: {{start_urls: "{server.start_urls[0]}"}}
            settings: {{CONCURRENT_REQUESTS: 2}}
    """
    # the first scheduler runs the window as it starts; the second only finds it left running
    tasks = write_tasks(project / "tasks.yaml", task + "        run_missed: true\n")
    first = schedulers(project, tasks, name="first")
    run = wait_for(lambda: next((r for r in history.runs("long") if r.pid), None), 60, "the crawl", lambda: first.log)
    time.sleep(1.0)  # the crawl is under way
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(10)
    wait_for(lambda: not alive(run.pid), 30, f"crawl {run.pid} to end after its scheduler died")
    # what the dead scheduler left (beside the earlier window _just_missed wrote)
    assert [r.outcome for r in history.runs("long") if r.window == run.window] == ["running"]

    second = schedulers(project, write_tasks(project / "tasks-second.yaml", task), name="second")
    left = wait_for(
        lambda: [r for r in history.runs("long") if r.outcome == "interrupted"],
        30,
        "the stale window to be marked",
        lambda: second.log,
    )
    assert second.stop() == 0
    assert "ended without finishing it" in left[0].reason and left[0].window == run.window
    assert f"was left running by {run.node}" in second.log


def test_lost_lock_stops_the_crawl(chaos_server: Any, redis_server: Any, tmp_path: Path, schedulers: Any) -> None:
    server = chaos_server(site(pages=80, latency=0.3))
    project = make_project(tmp_path / "proj")
    client = redis_client(redis_server.url)
    history = RedisHistory(client, "openclaw:schedule:history")
    tasks = write_tasks(
        project / "tasks.yaml",
        f"""
        tasks:
          locked:
            spider: chaos
            cron: "{_just_missed(history, "locked")}"
            run_missed: true
            args: {{start_urls: "{server.start_urls[0]}"}}
            settings: {{CONCURRENT_REQUESTS: 2}}
    """,
    )
    sched = schedulers(project, tasks, f"REDIS_URL={redis_server.url}", "OPENCLAW_SCHEDULE_LOCK_TTL=3")
    run = wait_for(lambda: next((r for r in history.runs("locked") if r.pid), None), 60, "the crawl", lambda: sched.log)
    key = f"openclaw:schedule:lock:locked:{run.window}"
    client.set(key, "another-node", px=60_000)  # another node took the window over
    wait_for(lambda: not alive(run.pid), 40, "the crawl to be stopped", lambda: sched.log)
    assert "lost the lock of window" in sched.log and "stopping its crawl" in sched.log
    assert client.get(key) == "another-node"  # never deleted by the old owner
    assert sched.stop() == 0
    assert not successes(history.runs(), "locked")
    assert os.path.exists(project / "openclaw-schedule" / "locked")
