"""The incremental cursor of a task: one JSON value kept between runs (file or Redis).

The contract with the spider (``-a openclaw_cursor=<JSON>`` in, the final
``spider.openclaw_cursor`` out, stored only after a successful run) is in
docs/scheduled.md, "Incremental crawls".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy_openclaw._files import atomic_write, private_dir

if TYPE_CHECKING:
    import redis

_MISSING = object()


class FileCursors:
    """``<state dir>/<task>/cursor.json``, replaced atomically."""

    def __init__(self, state_dir: str | Path):
        self.state_dir = Path(state_dir)

    def path(self, task_id: str) -> Path:
        return self.state_dir / task_id / "cursor.json"

    def get(self, task_id: str, default: Any = None) -> Any:
        path = self.path(task_id)
        if not path.exists():
            return default
        return json.loads(path.read_text(encoding="utf-8"))["value"]

    def set(self, task_id: str, value: Any) -> None:
        path = self.path(task_id)
        private_dir(path.parent)
        atomic_write(path, json.dumps({"value": value}).encode("utf-8"))


class RedisCursors:
    """``<prefix>:cursor:<task>`` holding ``{"value": ...}``, shared by every node."""

    def __init__(self, client: redis.Redis, prefix: str):
        self.client, self.prefix = client, prefix

    def get(self, task_id: str, default: Any = None) -> Any:
        raw = self.client.get(f"{self.prefix}:cursor:{task_id}")
        return default if raw is None else json.loads(raw)["value"]

    def set(self, task_id: str, value: Any) -> None:
        self.client.set(f"{self.prefix}:cursor:{task_id}", json.dumps({"value": value}))
