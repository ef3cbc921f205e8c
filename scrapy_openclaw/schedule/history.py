"""Run history of the scheduler: one record per window, in a jsonl file or a Redis list.

A run's record is appended when it starts (``running``) and again when it ends;
readers keep the last record per ``run_id`` (``<task>@<window>``). Windows nobody
fired are found by comparing the task's schedule with the history.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy_openclaw._files import open_private, private_dir
from scrapy_openclaw.schedule.tasks import window_id

if TYPE_CHECKING:
    import redis

    from scrapy_openclaw.schedule.tasks import Task

logger = logging.getLogger(__name__)

#: A Redis history keeps this many records (the oldest are trimmed).
REDIS_MAX_RECORDS = 100_000
#: At most this many missed windows are listed per task (the count says the rest).
MISSED_LIMIT = 100

FINAL = ("success", "failed", "missed", "skipped")
UNFINISHED = ("running", "interrupted")


@dataclass
class RunRecord:
    """What happened to one window of one task."""

    task: str
    scheduled: float  # the window's scheduled time, UNIX s
    outcome: str = "running"
    start: float | None = None
    end: float | None = None
    attempts: int = 0
    exit_status: str | None = None  # "0", "1", "signal 9", "timeout", ...
    reason: str | None = None  # why it failed / was skipped
    items: int | None = None
    dead_letters: int | None = None
    finish_reason: str | None = None  # the crawl's own (stats finish_reason)
    node: str | None = None
    pid: int | None = None  # of the running crawl process (None between attempts)
    checkpoint_dir: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def window(self) -> str:
        return window_id(self.scheduled)

    @property
    def run_id(self) -> str:
        return f"{self.task}@{self.window}"

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "window": self.window, **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunRecord:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


class History:
    """Append records; read the latest record of every run."""

    def append(self, record: RunRecord) -> None:
        raise NotImplementedError

    def raw(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    def runs(self, task: str | None = None) -> list[RunRecord]:
        """The latest record of each run, oldest window first."""
        latest: dict[str, dict[str, Any]] = {}
        for data in self.raw():
            if isinstance(data, dict) and "task" in data and "scheduled" in data:
                if task is None or data["task"] == task:
                    latest[f"{data['task']}@{data['scheduled']}"] = data
        records = []
        for data in latest.values():
            try:
                records.append(RunRecord.from_dict(data))
            except TypeError:
                logger.warning(
                    "Skipping a malformed history record in %(where)s: %(data)r",
                    {"where": self.describe(), "data": data},
                )
        return sorted(records, key=lambda r: (r.scheduled, r.task))


class JsonlHistory(History):
    """One JSON record per line, appended (O_APPEND: concurrent schedulers on one machine are fine)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def describe(self) -> str:
        return str(self.path)

    def append(self, record: RunRecord) -> None:
        private_dir(self.path.parent)
        line = (json.dumps(record.to_dict(), sort_keys=True) + "\n").encode("utf-8")
        fd = open_private(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def raw(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        out, bad = [], 0
        with open(self.path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    out.append(json.loads(line))
                except ValueError:
                    bad += 1
        if bad:
            logger.warning(
                "%(path)s: skipped %(n)d unreadable history line(s) (torn write?)", {"path": self.path, "n": bad}
            )
        return out


class RedisHistory(History):
    """A Redis list shared by every scheduler node."""

    def __init__(self, client: redis.Redis, key: str):
        self.client, self.key = client, key

    def describe(self) -> str:
        return f"Redis list {self.key}"

    def append(self, record: RunRecord) -> None:
        pipe = self.client.pipeline()
        pipe.rpush(self.key, json.dumps(record.to_dict(), sort_keys=True))
        pipe.ltrim(self.key, -REDIS_MAX_RECORDS, -1)
        pipe.execute()

    def raw(self) -> list[dict[str, Any]]:
        out = []
        for entry in self.client.lrange(self.key, 0, -1):
            try:
                out.append(json.loads(entry))
            except ValueError:
                logger.warning(
                    "%(key)s: skipping an unreadable history entry %(entry)r", {"key": self.key, "entry": entry[:200]}
                )
        return out


def missed_windows(task: Task, runs: list[RunRecord], now: float, limit: int = MISSED_LIMIT) -> tuple[list[float], int]:
    """Windows of *task* after its latest recorded window and up to *now* that nobody recorded.

    Returns (the last *limit* of them, how many there are in all, capped at 100·limit).
    A task without history has missed nothing (it is new).
    """
    mine = [r for r in runs if r.task == task.id]
    if not mine:
        return [], 0
    last = max(r.scheduled for r in mine)
    everything = task.windows(last, now, limit * 100)
    return everything[-limit:], len(everything)


def late_window(task: Task, runs: list[RunRecord], now: float, grace: float) -> float | None:
    """The window of *task* in the *grace* seconds before *now* that nobody recorded, if any: a
    scheduler starting now runs it late, as a timer that fired late would (too recent to call missed)."""
    recorded = {r.scheduled for r in runs if r.task == task.id}
    recent = [w for w in task.windows(now - grace, now, 1) if w not in recorded]
    return recent[-1] if recent else None


def summary(tasks: list[Task], runs: list[RunRecord], now: float) -> list[dict[str, Any]]:
    """Per task: last run, last success, counts by outcome, windows missed since the last record."""
    out = []
    for task in tasks:
        mine = [r for r in runs if r.task == task.id]
        counts: dict[str, int] = {}
        for r in mine:
            counts[r.outcome] = counts.get(r.outcome, 0) + 1
        successes = [r for r in mine if r.outcome == "success"]
        missed, n_missed = missed_windows(task, runs, now)
        out.append(
            {
                "task": task.id,
                "schedule": task.describe(),
                "next": task.next_window(now),
                "last": mine[-1].to_dict() if mine else None,
                "last_success": successes[-1].end if successes else None,
                "outcomes": counts,
                "missed_now": [window_id(w) for w in missed],
                "missed_now_count": n_missed,
            }
        )
    return out
