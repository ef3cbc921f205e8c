"""The tasks file of ``scrapy openclaw-schedule``: YAML, validated once, into frozen ``Task``s.

The schema is docs/examples/tasks.yaml, explained in docs/scheduled.md. Errors
name the file, the line and the key path (``tasks.nightly.cron``), like the
policy file; the YAML reading and line tracking are :mod:`scrapy_openclaw.yamlconfig`'s.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from scrapy_openclaw.exceptions import OpenClawConfigError
from scrapy_openclaw.policy import PolicySet
from scrapy_openclaw.yamlconfig import Where, read_yaml

_TASK_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$")
_SETTING_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
_ARG_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Spider argument carrying the incremental cursor (JSON); reserved.
CURSOR_ARG = "openclaw_cursor"


@dataclass(frozen=True)
class Task:
    """One validated task of the tasks file."""

    id: str
    spider: str
    cron: str | None = None
    interval: int | None = None
    timezone: str = "UTC"
    settings: dict[str, Any] = field(default_factory=dict)
    args: dict[str, Any] = field(default_factory=dict)
    max_attempts: int = 3
    retry_backoff: float = 30.0
    retry_backoff_max: float = 600.0
    timeout: float | None = None
    incremental: bool = False
    initial_cursor: Any = None
    run_missed: bool = False
    checkpoint_dir: str | None = None

    # -- windows -------------------------------------------------------------

    def next_window(self, after: float) -> float:
        """The first scheduled time (UNIX s) strictly after *after*."""
        if self.interval is not None:
            return (math.floor(after / self.interval) + 1) * self.interval
        start = datetime.fromtimestamp(after, ZoneInfo(self.timezone))
        return float(croniter(self.cron, start).get_next(float))

    def windows(self, after: float, until: float, limit: int) -> list[float]:
        """Scheduled times in ``(after, until]``, at most the last *limit* of them."""
        out: list[float] = []
        when = self.next_window(after)
        steps = 0
        while when <= until and steps < 100 * limit:  # bounded even for a very dense cron
            out.append(when)
            if len(out) > limit:
                out.pop(0)
            when = self.next_window(when)
            steps += 1
        return out

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before attempt ``attempt + 1`` (``attempt`` >= 1 just failed)."""
        return min(self.retry_backoff_max, self.retry_backoff * 2 ** (attempt - 1))

    def describe(self) -> str:
        return f"cron {self.cron!r} ({self.timezone})" if self.cron else f"every {self.interval}s"


def window_id(when: float) -> str:
    """The name of a window: its scheduled time in UTC, ``20240101T030000Z``."""
    return datetime.fromtimestamp(when, timezone.utc).strftime("%Y%m%dT%H%M%SZ")


# --- loading and validation -------------------------------------------------

_NUMBERS: dict[str, tuple[type, float, float | None]] = {
    "interval": (int, 1, None),
    "max_attempts": (int, 1, 1000),
    "retry_backoff": (float, 0, 86400 * 7),
    "retry_backoff_max": (float, 0, 86400 * 7),
    "timeout": (float, 0.1, None),
}
_BOOLS = ("incremental", "run_missed")
_KNOWN = sorted(
    {
        "spider",
        "cron",
        "interval",
        "timezone",
        "settings",
        "args",
        "initial_cursor",
        "checkpoint_dir",
        *_NUMBERS,
        *_BOOLS,
    }
)


def load_tasks(path: str | Path) -> list[Task]:
    """Read and validate a tasks file; ``OpenClawConfigError`` with file, line and key on any problem."""
    path = Path(path)
    data, lines = read_yaml(path, kind="tasks file")
    return parse_tasks(data, Where(str(path), lines))


def parse_tasks(data: Any, where: Where) -> list[Task]:
    if not isinstance(data, dict):
        where.fail((), "the tasks file must be a mapping with 'tasks' (and optionally 'defaults')")
    for key in data:
        if key not in ("defaults", "tasks"):
            where.fail((key,), "unknown key (expected 'defaults' or 'tasks')")
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        where.fail(("defaults",), "must be a mapping of task keys")
    for key in ("spider", "cron", "interval"):
        if key in defaults:
            where.fail(("defaults", key), "is per task; it cannot be a default")
    _check_keys(defaults, ("defaults",), where)
    tasks = data.get("tasks")
    if not isinstance(tasks, dict) or not tasks:
        where.fail(("tasks",), "must be a non-empty mapping of task id to task")
    out = []
    for task_id, raw in tasks.items():
        path = ("tasks", task_id)
        if not isinstance(task_id, str) or not _TASK_ID.match(task_id):
            where.fail(path, f"bad task id {task_id!r} (letters, digits, '_', '-', '.'; at most 100)")
        if not isinstance(raw, dict):
            where.fail(path, f"must be a mapping, got {type(raw).__name__}")
        _check_keys(raw, path, where)
        merged = {**defaults, **raw}
        merged["settings"] = {**(defaults.get("settings") or {}), **(raw.get("settings") or {})}
        merged["args"] = {**(defaults.get("args") or {}), **(raw.get("args") or {})}
        if "spider" not in raw:
            where.fail(path, "missing key 'spider'")
        if ("cron" in raw) == ("interval" in raw):
            where.fail(path, "needs exactly one of 'cron' and 'interval'")
        if merged.get("retry_backoff_max", Task.retry_backoff_max) < merged.get("retry_backoff", Task.retry_backoff):
            where.fail((*path, "retry_backoff_max"), "must be >= retry_backoff")
        if "cron" in raw:
            tz = merged.get("timezone", "UTC")
            try:
                croniter(raw["cron"], datetime.now(ZoneInfo(tz))).get_next(float)
            except (ValueError, KeyError, TypeError) as exc:  # croniter's errors are ValueErrors
                where.fail((*path, "cron"), f"bad cron expression {raw['cron']!r}: {exc}")
        if merged.get("interval") is not None:
            merged["interval"] = int(merged["interval"])
        out.append(Task(id=task_id, **merged))
    return out


def _check_keys(raw: dict[str, Any], path: tuple, where: Where) -> None:
    for key, value in raw.items():
        kpath = (*path, key)
        if key not in _KNOWN:
            where.fail(kpath, f"unknown key (known: {', '.join(_KNOWN)})")
        if key in _NUMBERS:
            if key == "timeout" and value is None:
                continue
            kind, lo, hi = _NUMBERS[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                where.fail(kpath, f"must be a number, got {value!r}")
            if kind is int and not float(value).is_integer():
                where.fail(kpath, f"must be a whole number, got {value!r}")
            if value < lo or (hi is not None and value > hi):
                where.fail(kpath, f"out of range: {value!r} is not within [{lo}, {'inf' if hi is None else hi}]")
        elif key in _BOOLS:
            if not isinstance(value, bool):
                where.fail(kpath, f"must be true or false, got {value!r}")
        elif key == "spider":
            if not isinstance(value, str) or not value.strip() or value.startswith("-"):
                where.fail(kpath, f"must be a spider name, got {value!r}")
        elif key == "cron":
            if not isinstance(value, str) or not croniter.is_valid(value):
                where.fail(kpath, f"bad cron expression {value!r} (5 fields, or 6 with seconds last)")
        elif key == "timezone":
            try:
                ZoneInfo(value if isinstance(value, str) else "")
            except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: "America" is a directory
                where.fail(kpath, f"unknown time zone {value!r} (use an IANA name like Europe/Paris)")
        elif key in ("settings", "args"):
            if not isinstance(value, dict):
                where.fail(kpath, "must be a mapping")
            pattern = _SETTING_NAME if key == "settings" else _ARG_NAME
            for name in value:
                if not isinstance(name, str) or not pattern.match(name):
                    where.fail((*kpath, name), f"bad {'setting' if key == 'settings' else 'argument'} name {name!r}")
                if key == "args" and name == CURSOR_ARG:
                    where.fail((*kpath, name), "reserved for the incremental cursor (use 'incremental')")
                if key == "settings" and name == "OPENCLAW_CHECKPOINT_DIR":
                    where.fail((*kpath, name), "set by the scheduler per window (use 'checkpoint_dir')")
                _check_json(value[name], (*kpath, name), where)
                if key == "settings":
                    _check_setting(name, value[name], (*kpath, name), where)
        elif key == "initial_cursor":
            _check_json(value, kpath, where)
        elif key == "checkpoint_dir":
            if value is not None and (not isinstance(value, str) or not value):
                where.fail(kpath, f"must be a directory path, got {value!r}")


def _check_json(value: Any, path: tuple, where: Where) -> None:
    """Values passed to the crawl as JSON (args, settings, the cursor) must be JSON data.

    A YAML date (``2024-01-01`` unquoted), a ``!!binary`` value or ``.inf``
    would pass the schema and then fail every window when the command line is
    built; refused here instead, with the place to quote it.
    """
    stack = [(value, path)]
    while stack:
        item, at = stack.pop()
        if isinstance(item, dict):
            for k, v in item.items():
                if not isinstance(k, str):
                    where.fail((*at, k), f"keys must be text, got {type(k).__name__} {k!r} (quote it)")
                stack.append((v, (*at, k)))
        elif isinstance(item, list):
            stack.extend((v, (*at, i)) for i, v in enumerate(item))
        elif isinstance(item, float) and not math.isfinite(item):
            where.fail(at, f"must be a finite number, got {item!r}")
        elif not (item is None or isinstance(item, (str, int, float, bool))):
            where.fail(at, f"a {type(item).__name__} cannot be passed to the crawl (quote it to pass text): {item!r}")


def _check_setting(name: str, value: Any, path: tuple, where: Where) -> None:
    """What the crawl would refuse at start (every window) is refused now."""
    from scrapy.settings import Settings, default_settings

    if isinstance(getattr(default_settings, name, None), dict) or name == "OPENCLAW_POLICY":
        if isinstance(value, str):
            try:
                value = json.loads(value) if value.strip() else {}
            except ValueError as exc:
                where.fail(path, f"must be a mapping or a JSON object, got {value[:80]!r} ({exc})")
        if not isinstance(value, dict):
            where.fail(path, f"must be a mapping, got {type(value).__name__}")
    if name.startswith("OPENCLAW_"):
        try:
            PolicySet.from_settings(Settings({name: value}))  # validates every OPENCLAW_* setting too
        except OpenClawConfigError as exc:
            where.fail(path, str(exc))
