"""Unit tests of the schedule pieces: tasks file, window locks (real Redis, lock files), history."""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from scrapy.settings import Settings

from scrapy_openclaw.errors import OpenClawConfigError
from scrapy_openclaw.schedule.history import JsonlHistory, RedisHistory, RunRecord, late_window, missed_windows
from scrapy_openclaw.schedule.locks import FileLocks, RedisLocks, redis_client
from scrapy_openclaw.schedule.scheduler import MISSED_GRACE, RUN_STATS_EXTENSION, Scheduler, crawl_command
from scrapy_openclaw.schedule.tasks import Task, load_tasks, window_id


def tasks_file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "tasks.yaml"
    path.write_text(textwrap.dedent(body).lstrip("\n"), encoding="utf-8")
    return path


def error_of(tmp_path: Path, body: str) -> str:
    path = tasks_file(tmp_path, body)
    with pytest.raises(OpenClawConfigError) as info:
        load_tasks(path)
    return str(info.value).replace(str(path), "FILE")


# --- tasks file ---------------------------------------------------------------


def test_valid_tasks_file_with_defaults(tmp_path: Path) -> None:
    path = tasks_file(
        tmp_path,
        """
        defaults:
          max_attempts: 5
          settings: {LOG_LEVEL: INFO}
        tasks:
          nightly:
            spider: products
            cron: "0 3 * * *"
            timezone: Europe/Paris
            settings: {CONCURRENT_REQUESTS: 4}
            timeout: 3600
          inc:
            spider: feed
            interval: 1800
            max_attempts: 2
            incremental: true
            initial_cursor: {since: "2024-01-01"}
            run_missed: true
    """,
    )
    nightly, inc = load_tasks(path)
    assert nightly == Task(
        id="nightly",
        spider="products",
        cron="0 3 * * *",
        timezone="Europe/Paris",
        settings={"LOG_LEVEL": "INFO", "CONCURRENT_REQUESTS": 4},
        max_attempts=5,
        timeout=3600,
    )
    assert inc.interval == 1800 and inc.max_attempts == 2 and inc.incremental and inc.run_missed
    assert inc.initial_cursor == {"since": "2024-01-01"}


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("tasks:\n  a: {spider: s, interval: [1\n", "FILE, line 3: invalid YAML"),
        (
            "tasks:\n  a:\n    spider: s\n    interval: 5\n    colour: red\n",
            "FILE, line 5: key tasks.a.colour: unknown key",
        ),
        (
            "tasks:\n  a:\n    spider: s\n    cron: '61 * * * *'\n",
            "FILE, line 4: key tasks.a.cron: bad cron expression '61 * * * *'",
        ),
        (
            "tasks:\n  a:\n    spider: s\n    cron: '* * * * *'\n    interval: 60\n",
            "FILE, line 2: key tasks.a: needs exactly one of 'cron' and 'interval'",
        ),
        ("tasks:\n  a:\n    spider: s\n", "FILE, line 2: key tasks.a: needs exactly one of 'cron' and 'interval'"),
        ("tasks:\n  a:\n    interval: 5\n", "FILE, line 2: key tasks.a: missing key 'spider'"),
        (
            "tasks:\n  a:\n    spider: s\n    interval: 2.5\n",
            "FILE, line 4: key tasks.a.interval: must be a whole number",
        ),
        ("tasks:\n  a:\n    spider: s\n    interval: 0\n", "FILE, line 4: key tasks.a.interval: out of range"),
        (
            "tasks:\n  a:\n    spider: s\n    interval: 5\n    max_attempts: '3'\n",
            "FILE, line 5: key tasks.a.max_attempts: must be a number",
        ),
        (
            "tasks:\n  a:\n    spider: s\n    cron: '* * * * *'\n    timezone: Mars/Olympus\n",
            "FILE, line 5: key tasks.a.timezone: unknown time zone",
        ),
        (
            "tasks:\n  a:\n    spider: s\n    interval: 5\n    args: {openclaw_cursor: 1}\n",
            "FILE, line 5: key tasks.a.args.openclaw_cursor: reserved",
        ),
        (
            "defaults:\n  cron: '* * * * *'\ntasks:\n  a: {spider: s, interval: 5}\n",
            "FILE, line 2: key defaults.cron: is per task",
        ),
        ("jobs: {}\n", "FILE, line 1: key jobs: unknown key"),
        ("tasks: []\n", "FILE, line 1: key tasks: must be a non-empty mapping"),
        ("tasks:\n  'bad id!': {spider: s, interval: 5}\n", "FILE, line 2: key tasks.bad id!: bad task id"),
    ],
)
def test_tasks_file_errors_name_file_line_key(tmp_path: Path, body: str, expected: str) -> None:
    assert expected in error_of(tmp_path, body)


def test_missing_tasks_file(tmp_path: Path) -> None:
    with pytest.raises(OpenClawConfigError, match="cannot read"):
        load_tasks(tmp_path / "nope.yaml")


def test_windows_interval_and_cron() -> None:
    every = Task(id="a", spider="s", interval=60)
    assert every.next_window(120.0) == 180.0 and every.next_window(121.5) == 180.0
    assert every.windows(100.0, 400.0, limit=10) == [120.0, 180.0, 240.0, 300.0, 360.0]
    assert every.windows(100.0, 400.0, limit=2) == [300.0, 360.0]
    nightly = Task(id="n", spider="s", cron="0 3 * * *")
    start = 1704067200.0  # 2024-01-01T00:00:00Z
    assert window_id(nightly.next_window(start)) == "20240101T030000Z"
    paris = Task(id="p", spider="s", cron="0 3 * * *", timezone="Europe/Paris")
    assert window_id(paris.next_window(start)) == "20240101T020000Z"
    assert Task(id="b", spider="s", interval=1, retry_backoff=2, retry_backoff_max=5).backoff(3) == 5


def test_crawl_command_merges_extensions_and_passes_settings(tmp_path: Path) -> None:
    task = Task(
        id="a",
        spider="s",
        interval=5,
        settings={"CONCURRENT_REQUESTS": 4, "RETRY_ENABLED": False, "EXTENSIONS": {"my.Ext": 5}},
        args={"start_urls": "http://x/", "n": 3},
        incremental=True,
    )
    settings = Settings({"EXTENSIONS": {"project.Ext": 1}})
    argv = crawl_command(
        task, settings, checkpoint_dir=tmp_path / "w", run_file=tmp_path / "w.run.json", cursor={"page": 2}
    )
    pairs = [(argv[i], argv[i + 1]) for i in range(5, len(argv), 2)]
    assert argv[1:5] == ["-m", "scrapy", "crawl", "s"]
    assert ("-s", "CONCURRENT_REQUESTS=4") in pairs and ("-s", "RETRY_ENABLED=False") in pairs
    ext = json.loads(next(v for k, v in pairs if v.startswith("EXTENSIONS="))[len("EXTENSIONS=") :])
    assert ext == {"project.Ext": 1, "my.Ext": 5, RUN_STATS_EXTENSION: 10_000}
    assert ("-s", f"OPENCLAW_CHECKPOINT_DIR={tmp_path / 'w'}") in pairs
    assert ("-a", "n=3") in pairs and ("-a", 'openclaw_cursor={"page": 2}') in pairs


# --- locks --------------------------------------------------------------------


def test_redis_lock_semantics(redis_server: Any) -> None:
    client = redis_client(redis_server.url)
    node_a = RedisLocks(client, prefix="t", ttl=30)
    node_b = RedisLocks(redis_client(redis_server.url), prefix="t", ttl=30)
    a, b = node_a.lock("task", "W1"), node_b.lock("task", "W1")
    assert a.acquire() and not b.acquire()
    assert a.extend() and not b.extend()
    assert not b.release(finished=True)  # not the owner: nothing deleted
    assert client.get(a.key) == a.token
    assert a.release(finished=True)
    assert not node_b.lock("task", "W1").acquire()  # done: the window never runs again
    assert node_b.lock("task", "W2").acquire()  # another window is independent

    c, d = node_a.lock("task", "W3"), node_b.lock("task", "W3")
    assert c.acquire() and c.release(finished=False)  # interrupted: free for a resume
    assert d.acquire() and d.release(finished=True)


def test_redis_lock_expires_and_old_owner_cannot_release(redis_server: Any) -> None:
    client = redis_client(redis_server.url)
    locks = RedisLocks(client, prefix="t", ttl=1)
    old, new = locks.lock("task", "W"), locks.lock("task", "W")
    assert old.acquire()
    assert 0 < client.pttl(old.key) <= 1000
    deadline = time.monotonic() + 10
    while client.exists(old.key) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert new.acquire()
    assert not old.extend() and not old.release(finished=True)  # compare-and-delete: new owner's lock stays
    assert client.get(new.key) == new.token
    assert not client.exists(old.done_key)


def test_file_lock_semantics(tmp_path: Path) -> None:
    node_a, node_b = FileLocks(tmp_path / "locks"), FileLocks(tmp_path / "locks")
    a, b = node_a.lock("task", "W1"), node_b.lock("task", "W1")
    assert a.acquire() and not b.acquire()
    assert a.extend() and not b.extend()
    assert not b.release(finished=True)
    assert a.release(finished=True)
    assert not node_b.lock("task", "W1").acquire()  # done
    c = node_a.lock("task", "W2")
    assert c.acquire() and c.release(finished=False)
    d = node_b.lock("task", "W2")
    assert d.acquire()  # interrupted windows can be taken again
    d.release(finished=True)
    assert sorted(p.name for p in (tmp_path / "locks").iterdir()) == ["task.W1.done", "task.W2.done"]


# --- history ------------------------------------------------------------------


def _history_roundtrip(history: Any) -> None:
    history.append(RunRecord("a", 60.0, start=61.0, attempts=1, pid=123))
    history.append(
        RunRecord(
            "a", 60.0, outcome="success", start=61.0, end=70.0, attempts=2, exit_status="0", items=7, dead_letters=1
        )
    )
    history.append(RunRecord("b", 60.0, outcome="failed", reason="the crawl exited with 1"))
    history.append(RunRecord("a", 120.0, outcome="interrupted"))
    runs = history.runs()
    assert [(r.task, r.scheduled, r.outcome) for r in runs] == [
        ("a", 60.0, "success"),
        ("b", 60.0, "failed"),
        ("a", 120.0, "interrupted"),
    ]
    first = runs[0]
    assert (first.attempts, first.items, first.dead_letters, first.run_id) == (2, 7, 1, "a@19700101T000100Z")
    assert [r.scheduled for r in history.runs("a")] == [60.0, 120.0]


def test_jsonl_history(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    history = JsonlHistory(tmp_path / "h" / "history.jsonl")
    _history_roundtrip(history)
    with open(history.path, "a", encoding="utf-8") as f:
        f.write('{"task": "a", "sched')  # a torn last line
    assert len(history.runs()) == 3
    assert "skipped 1 unreadable history line" in caplog.text


def test_redis_history(redis_server: Any) -> None:
    _history_roundtrip(RedisHistory(redis_client(redis_server.url), "t:history"))


def test_a_window_just_before_the_start_is_run_late_not_lost() -> None:
    """A daily run at 03:00:00 and a node restarted at 03:00:02: too recent to call missed (a live
    node may be recording it), so the starting scheduler runs it, unless somebody recorded it."""
    task = Task(id="a", spider="s", interval=60)
    grace = 5.0
    assert late_window(task, [], now=362.0, grace=grace) == 360.0  # a new task too
    assert late_window(task, [RunRecord("a", 300.0, outcome="success")], now=362.0, grace=grace) == 360.0
    assert late_window(task, [RunRecord("a", 360.0, outcome="success")], now=362.0, grace=grace) is None
    assert late_window(task, [RunRecord("b", 360.0, outcome="success")], now=362.0, grace=grace) == 360.0
    assert late_window(task, [], now=366.0, grace=grace) is None  # older than the grace: missed_windows's
    assert missed_windows(task, [RunRecord("a", 300.0)], now=366.0 - grace) == ([360.0], 1)
    # the grace's edge belongs to one side only: missed, not also run late
    assert late_window(task, [], now=365.0, grace=grace) is None
    assert missed_windows(task, [RunRecord("a", 300.0)], now=365.0 - grace) == ([360.0], 1)


def test_missed_windows_from_history() -> None:
    task = Task(id="a", spider="s", interval=60)
    assert missed_windows(task, [], now=1000.0) == ([], 0)  # a new task has missed nothing
    runs = [RunRecord("a", 120.0, outcome="success"), RunRecord("b", 900.0, outcome="success")]
    assert missed_windows(task, runs, now=400.0) == ([180.0, 240.0, 300.0, 360.0], 4)
    assert missed_windows(task, runs, now=400.0, limit=2) == ([300.0, 360.0], 4)
    assert missed_windows(task, [RunRecord("a", 360.0)], now=400.0) == ([], 0)


@pytest_twisted.ensureDeferred
async def test_missed_records_are_written_before_the_missed_window_runs(tmp_path: Path) -> None:
    """A window both missed and run once (``run_missed``): its ``missed`` record must land before
    the run's ``running`` one. Written from the thread pool unawaited, it once landed after,
    and status and the reaper read the latest record (a flaky SIGKILL test found it)."""
    task = Task(id="a", spider="s", interval=60, run_missed=True)
    seen_at_launch: list[list[str]] = []

    class Recording(Scheduler):
        def _launch(self, task: Task, when: float) -> None:
            seen_at_launch.append([r.outcome for r in self.history.runs(task.id) if r.scheduled == when])

    sched = Recording([task], Settings({"OPENCLAW_SCHEDULE_STATE_DIR": str(tmp_path / "state")}), cwd=tmp_path)
    history = sched.history
    history.append(RunRecord("a", time.time() - 300.0, outcome="success"))
    write = history.append

    def slow_missed(record: RunRecord) -> None:  # a busy disk: the missed records take a while
        if record.outcome == "missed":
            time.sleep(0.05)
        write(record)

    history.append = slow_missed  # type: ignore[method-assign]
    # (a window less than MISSED_GRACE old is run late, not recorded missed: start past it)
    since_window = time.time() % 60
    if since_window < MISSED_GRACE + 1.0:
        time.sleep(MISSED_GRACE + 1.0 - since_window)
    try:
        await sched._catch_up(history.runs())
    finally:
        for timer in sched._timers.values():
            timer.cancel()
    assert seen_at_launch == [["missed"]]
