"""Where the scheduler keeps window locks, run history and cursors: Redis with ``REDIS_URL``, else files."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy_openclaw.schedule.cursor import FileCursors, RedisCursors
from scrapy_openclaw.schedule.history import JsonlHistory, RedisHistory
from scrapy_openclaw.schedule.locks import FileLocks, RedisLocks, redis_client

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings


def open_stores(settings: BaseSettings, state_dir: Path, lock_ttl: float, *, prefix: str) -> tuple[Any, Any, Any]:
    """(locks, history, cursors): in Redis with ``REDIS_URL`` (keys under *prefix*), else under *state_dir*."""
    url = settings.get("REDIS_URL")
    if url:
        client = redis_client(url)
        return (
            RedisLocks(client, prefix=prefix, ttl=lock_ttl),
            RedisHistory(client, f"{prefix}:history"),
            RedisCursors(client, prefix),
        )
    return FileLocks(state_dir / "locks"), JsonlHistory(state_dir / "history.jsonl"), FileCursors(state_dir)
