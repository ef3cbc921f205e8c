"""The ``scrapy crawl`` command line of one scheduled attempt.

The task's settings become ``-s`` values Scrapy's typed getters read back
unchanged, its arguments ``-a`` values; ``RunStatsExtension`` is added last so
that it reports the stats and the cursor the crawl left.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy_openclaw.schedule.tasks import CURSOR_ARG, Task

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

RUN_STATS_EXTENSION = "scrapy_openclaw.schedule.RunStatsExtension"


def crawl_command(
    task: Task,
    settings: BaseSettings,
    *,
    checkpoint_dir: Path,
    run_file: Path,
    cursor: Any = None,
    python: str = sys.executable,
) -> list[str]:
    """The ``scrapy crawl`` command line of one attempt."""
    argv = [python, "-m", "scrapy", "crawl", task.spider]
    extensions = _component_dict(settings.getdict("EXTENSIONS"))
    for name, value in task.settings.items():
        if name == "EXTENSIONS":
            extensions.update(_component_dict(value))
        else:
            argv += ["-s", f"{name}={setting_text(value)}"]
    extensions[RUN_STATS_EXTENSION] = 10_000  # last: it reports the stats the others left
    argv += [
        "-s",
        f"EXTENSIONS={json.dumps(extensions)}",
        "-s",
        f"OPENCLAW_CHECKPOINT_DIR={checkpoint_dir}",
        "-s",
        f"OPENCLAW_SCHEDULE_RUN_FILE={run_file}",
    ]
    for name, value in task.args.items():
        argv += ["-a", f"{name}={value if isinstance(value, str) else json.dumps(value)}"]
    if task.incremental:
        argv += ["-a", f"{CURSOR_ARG}={json.dumps(cursor)}"]
    return argv


def setting_text(value: Any) -> str:
    """A ``-s`` value Scrapy's typed getters read back as *value*."""
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value)


def _component_dict(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        value = json.loads(value) if value.strip() else {}
    return {k if isinstance(k, str) else f"{k.__module__}.{k.__qualname__}": v for k, v in dict(value).items()}
