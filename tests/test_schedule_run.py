"""``scrapy openclaw-schedule`` end to end: real scheduler processes, real crawls, the chaos site, Redis."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from scrapy_openclaw.schedule.cursor import FileCursors
from scrapy_openclaw.schedule.history import JsonlHistory, RedisHistory, RunRecord
from scrapy_openclaw.schedule.locks import redis_client
from scrapy_openclaw.schedule.scheduler import MISSED_GRACE
from scrapy_openclaw.testing.chaos import ChaosConfig, HostConfig, reachable_urls
from scrapy_openclaw.testing.servers import stop_process, subprocess_env

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

SPIDERS = '''
import scrapy


class CursorSpider(scrapy.Spider):
    """Fetches /page/<cursor> and moves the cursor on by one."""

    name = "cursor"

    def __init__(self, *args, start_urls="", **kwargs):
        super().__init__(*args, **kwargs)
        self.base = start_urls.rstrip("/")

    async def start(self):
        yield scrapy.Request(f"{self.base}/page/{self.openclaw_cursor}")

    def parse(self, response):
        yield {"cursor": self.openclaw_cursor, "url": response.url}
        self.openclaw_cursor += 1
'''


def make_project(root: Path) -> Path:
    """A tiny Scrapy project: ChaosSpider plus CursorSpider, the add-on on, fast checkpoints."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "scrapy.cfg").write_text("[settings]\ndefault = schedproj_settings\n", encoding="utf-8")
    (root / "schedproj_settings.py").write_text(
        textwrap.dedent("""
        BOT_NAME = "schedproj"
        SPIDER_MODULES = ["scrapy_openclaw.testing.spiders", "schedproj_spiders"]
        ADDONS = {"scrapy_openclaw.Addon": 100}
        TELNETCONSOLE_ENABLED = False
        LOG_LEVEL = "INFO"
        OPENCLAW_CHECKPOINT_FLUSH = 0.2
        OPENCLAW_CHECKPOINT_SNAPSHOT_INTERVAL = 1.0
        OPENCLAW_DLQ_URI = "dead-letters.jsonl"
    """),
        encoding="utf-8",
    )
    (root / "schedproj_spiders.py").write_text(SPIDERS, encoding="utf-8")
    return root


def site(pages: int, latency: float = 0.0) -> ChaosConfig:
    return ChaosConfig(
        hosts=(
            HostConfig(address="127.0.0.2", pages=pages, links_per_page=3, latency=latency, latency_jitter=latency / 2),
        ),
        seed=5,
    )


class SchedulerProcess:
    """``scrapy openclaw-schedule TASKS`` in the project dir; stopped with SIGTERM (bounded)."""

    def __init__(self, project: Path, tasks: Path, *settings: str, name: str = "scheduler"):
        self.log_path = project / f"{name}.log"
        cmd = [
            sys.executable,
            "-m",
            "scrapy",
            "openclaw-schedule",
            str(tasks),
            "-s",
            "OPENCLAW_SCHEDULE_STOP_TIMEOUT=20",
        ]
        for s in settings:
            cmd += ["-s", s]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                cmd, cwd=project, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=subprocess_env()
            )

    def stop(self) -> int:
        return stop_process(self.proc, timeout=40)

    @property
    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")


@pytest.fixture
def schedulers() -> Iterator[Callable[..., SchedulerProcess]]:
    started: list[SchedulerProcess] = []

    def start(*args: Any, **kwargs: Any) -> SchedulerProcess:
        started.append(SchedulerProcess(*args, **kwargs))
        return started[-1]

    yield start
    for sched in started:
        sched.stop()


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, log: Callable[[], str] = lambda: "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{log()[-4000:]}")


def write_tasks(path: Path, body: str) -> Path:
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return path


def page_hits(truth: dict[str, Any]) -> dict[str, int]:
    """Path -> times the site answered it with 200."""
    counts: dict[str, int] = {}
    for host in truth["hosts"].values():
        for r in host["requests"]:
            if r["status"] == 200:
                counts[r["path"]] = counts.get(r["path"], 0) + 1
    return counts


def successes(runs: list[RunRecord], task: str) -> list[RunRecord]:
    return [r for r in runs if r.task == task and r.outcome == "success"]


def test_task_fires_on_time_and_status_reports_it(chaos_server: Any, tmp_path: Path, schedulers: Any) -> None:
    server = chaos_server(site(pages=5))
    project = make_project(tmp_path / "proj")
    tasks = write_tasks(
        project / "tasks.yaml",
        f"""
        tasks:
          every3:
            spider: chaos
            interval: 3
            args: {{start_urls: "{server.start_urls[0]}"}}
    """,
    )
    history = JsonlHistory(project / "openclaw-schedule" / "history.jsonl")
    sched = schedulers(project, tasks)
    runs = wait_for(
        lambda: len(successes(history.runs(), "every3")) >= 2 and history.runs(),
        90,
        "two successful runs",
        lambda: sched.log,
    )
    assert sched.stop() == 0
    done = successes(runs, "every3")
    for run in done:
        assert run.scheduled % 3 == 0  # windows aligned to the interval
        assert run.start is not None and 0 <= run.start - run.scheduled < 10  # fired at its time
        assert run.attempts == 1 and run.exit_status == "0" and run.finish_reason == "finished"
        assert run.items == len(reachable_urls(server.config, server.urls).ok) and run.dead_letters == 0
        assert Path(run.checkpoint_dir).name == run.window
    assert "Scheduler stopped" in sched.log

    out = subprocess.run(
        [sys.executable, "-m", "scrapy", "openclaw-schedule", "status", str(tasks)],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=60,
        env=subprocess_env(),
    )
    assert out.returncode == 0, out.stderr
    assert "every3" in out.stdout and "success" in out.stdout and done[0].window in out.stdout


def _once_soon(seconds: float) -> str:
    """A cron rule (seconds field last) that fires once, *seconds* from now (UTC)."""
    at = datetime.now(timezone.utc) + timedelta(seconds=seconds)
    return f"{at.minute} {at.hour} {at.day} {at.month} * {at.second}"


def _just_missed(history: Any, task: str) -> str:
    """A cron rule that fired once, a little more than MISSED_GRACE ago, over a history that
    knows the task (an earlier window, failed): with ``run_missed: true`` the scheduler runs
    that window as it starts, however long starting took (a window still to come can pass
    while a busy machine starts the scheduler, and then it never fires)."""
    history.append(RunRecord(task, time.time() - 3600.0, outcome="failed", reason="an earlier window"))
    return _once_soon(-(MISSED_GRACE + 5.0))


def test_killed_run_is_retried_and_resumes_from_checkpoint(chaos_server: Any, tmp_path: Path, schedulers: Any) -> None:
    pages = 60
    server = chaos_server(site(pages=pages, latency=0.15))
    project = make_project(tmp_path / "proj")
    history = JsonlHistory(project / "openclaw-schedule" / "history.jsonl")
    tasks = write_tasks(
        project / "tasks.yaml",
        f"""
        tasks:
          big:
            spider: chaos
            cron: "{_just_missed(history, "big")}"
            run_missed: true
            args: {{start_urls: "{server.start_urls[0]}"}}
            settings: {{CONCURRENT_REQUESTS: 4}}
            max_attempts: 3
            retry_backoff: 0.5
    """,
    )
    sched = schedulers(project, tasks)
    first = wait_for(
        lambda: next((r for r in history.runs() if r.pid and r.attempts == 1), None),
        60,
        "the first attempt",
        lambda: sched.log,
    )
    wait_for(lambda: len(page_hits(server.truth())) >= pages // 2, 60, "half the pages", lambda: sched.log)
    os.kill(first.pid, signal.SIGKILL)

    final = wait_for(
        lambda: next((r for r in successes(history.runs(), "big")), None),
        120,
        "the retried run to succeed",
        lambda: sched.log,
    )
    assert sched.stop() == 0
    assert final.attempts == 2 and final.window == first.window
    assert "attempt 1/3 failed (the crawl exited with signal 9)" in sched.log
    hits = page_hits(server.truth())
    reachable = reachable_urls(server.config, server.urls).ok
    assert {server.start_urls[0].rstrip("/") + path for path in hits} == set(reachable)  # nothing lost
    assert final.items is not None and final.items >= len(reachable) // 2  # stats carried over the resume
    twice = sum(n - 1 for n in hits.values())
    # Resumed, not restarted: re-fetched at most the in-flight requests plus the last unflushed
    # journal batch (4 in flight; ~0.2 s of fetches), far below the ~30 a restart would repeat.
    assert twice <= 15, hits


def test_two_schedulers_on_one_redis_run_each_window_once(
    chaos_server: Any, redis_server: Any, tmp_path: Path, schedulers: Any
) -> None:
    server = chaos_server(site(pages=1))
    project = make_project(tmp_path / "proj")
    tasks = write_tasks(
        project / "tasks.yaml",
        f"""
        tasks:
          shared:
            spider: chaos
            interval: 2
            args: {{start_urls: "{server.start_urls[0]}"}}
    """,
    )
    redis_setting = f"REDIS_URL={redis_server.url}"
    nodes = [
        schedulers(project, tasks, redis_setting, f"OPENCLAW_SCHEDULE_STATE_DIR=node{i}", name=f"node{i}")
        for i in range(2)
    ]
    history = RedisHistory(redis_client(redis_server.url), "openclaw:schedule:history")
    wait_for(
        lambda: len(successes(history.runs(), "shared")) >= 4,
        120,
        "four successful windows",
        lambda: nodes[0].log + nodes[1].log,
    )
    for node in nodes:
        assert node.stop() == 0
    runs = history.runs()
    ran = [r for r in runs if r.outcome in ("success", "failed", "interrupted")]
    # Ground truth: every crawl fetches "/" once; at most one crawl per window (the last may
    # have been interrupted by the stop before its fetch).
    assert len(successes(runs, "shared")) <= page_hits(server.truth())["/"] <= len(ran)
    raw = history.raw()
    starts = [d for d in raw if d["outcome"] == "running"]
    assert all(len({d["node"] for d in starts if d["window"] == w}) == 1 for w in {d["window"] for d in starts})


@pytest.mark.crawl  # runs a crawl or a subprocess
def test_malformed_tasks_file_gives_file_line_key(tmp_path: Path) -> None:
    project = make_project(tmp_path / "proj")
    tasks = write_tasks(
        project / "tasks.yaml",
        """
        tasks:
          nightly:
            spider: chaos
            cron: "0 3 * * * * * *"
    """,
    )
    out = subprocess.run(
        [sys.executable, "-m", "scrapy", "openclaw-schedule", str(tasks)],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=60,
        env=subprocess_env(),
    )
    assert out.returncode == 2
    assert f"{tasks}, line 5: key tasks.nightly.cron: bad cron expression" in out.stderr


def test_incremental_cursor_carries_over_between_runs(chaos_server: Any, tmp_path: Path, schedulers: Any) -> None:
    server = chaos_server(site(pages=20))
    project = make_project(tmp_path / "proj")
    tasks = write_tasks(
        project / "tasks.yaml",
        f"""
        tasks:
          inc:
            spider: cursor
            interval: 2
            incremental: true
            initial_cursor: 1
            args: {{start_urls: "{server.start_urls[0]}"}}
    """,
    )
    state = project / "openclaw-schedule"
    history = JsonlHistory(state / "history.jsonl")
    sched = schedulers(project, tasks)
    wait_for(lambda: len(successes(history.runs(), "inc")) >= 3, 90, "three runs", lambda: sched.log)
    assert sched.stop() == 0
    n = len(successes(history.runs(), "inc"))
    assert FileCursors(state).get("inc") == 1 + n
    hits = page_hits(server.truth())
    # run k fetched /page/k: each run started where the previous one stopped (a run the stop
    # interrupted may have fetched the next page without moving the cursor)
    expected = {f"/page/{k}": 1 for k in range(1, 1 + n)}
    assert {k: v for k, v in hits.items() if k in expected} == expected
    assert {k: v for k, v in hits.items() if k not in expected} in ({}, {f"/page/{1 + n}": 1})
