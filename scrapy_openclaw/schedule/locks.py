"""One run per window: a lock per (task id, scheduled time), across nodes or on one machine.

With ``REDIS_URL`` several scheduler nodes run the same tasks file, so each
firing takes a Redis lock (compare-and-delete in Lua on release); without Redis,
:class:`FileLocks` does the same on one machine. A window that ran to an end
also leaves a *done* mark, so a node that fires late does not run it again.
"""

from __future__ import annotations

import fcntl
import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from scrapy_openclaw._files import atomic_write, open_private, private_dir
from scrapy_openclaw.distributed import lua

if TYPE_CHECKING:
    import redis

#: Redis remembers a finished window this long (s): far beyond any clock skew.
DONE_TTL = 7 * 86400


def redis_client(url: str) -> redis.Redis:
    """A redis-py client for the scheduler's state, with bounded timeouts."""
    import redis

    return redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=10, decode_responses=True)


class WindowLock(Protocol):
    """The lock of one window. ``acquire`` once; ``extend`` while running; ``release`` once.

    Every call blocks (a Redis round trip, file I/O): the scheduler runs them in a
    thread, never on the reactor. ``release(finished=True)`` leaves the window's done
    mark; an interrupted window leaves none, so it can be resumed.
    """

    key: str
    token: str

    def acquire(self) -> bool: ...

    def extend(self) -> bool: ...

    def release(self, finished: bool) -> bool: ...


class RedisLocks:
    """Factory of :class:`RedisWindowLock` on one Redis."""

    def __init__(self, client: redis.Redis, *, prefix: str, ttl: float):
        self.client, self.prefix, self.ttl_ms = client, prefix, max(1, int(ttl * 1000))
        self._acquire = client.register_script(lua.LOCK_ACQUIRE)
        self._extend = client.register_script(lua.LOCK_EXTEND)
        self._release = client.register_script(lua.LOCK_RELEASE)

    def lock(self, task_id: str, window: str) -> RedisWindowLock:
        return RedisWindowLock(self, task_id, window)

    def describe(self) -> str:
        return f"Redis locks ({self.prefix}:lock:*)"


class RedisWindowLock:
    """``<prefix>:lock:<task>:<window>``, taken with ``SET NX PX`` and a random token.

    Extended while the run lasts and released only if it still holds the token
    (compare-and-delete in Lua), so a lock that expired and was taken by another
    node is never deleted by its old owner.
    """

    def __init__(self, owner: RedisLocks, task_id: str, window: str):
        self.owner = owner
        self.key = f"{owner.prefix}:lock:{task_id}:{window}"
        self.done_key = f"{owner.prefix}:done:{task_id}:{window}"
        self.token = secrets.token_hex(16)

    def acquire(self) -> bool:
        return bool(self.owner._acquire(keys=[self.key, self.done_key], args=[self.token, self.owner.ttl_ms]))

    def extend(self) -> bool:
        return bool(self.owner._extend(keys=[self.key], args=[self.token, self.owner.ttl_ms]))

    def release(self, finished: bool) -> bool:
        return bool(
            self.owner._release(
                keys=[self.key, self.done_key],
                args=[self.token, "1" if finished else "0", DONE_TTL * 1000],
            )
        )


class FileLocks:
    """Factory of :class:`FileWindowLock` under one directory (one machine)."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)

    def lock(self, task_id: str, window: str) -> FileWindowLock:
        return FileWindowLock(self.directory, task_id, window)

    def describe(self) -> str:
        return f"lock files in {self.directory}"


class FileWindowLock:
    """A lock file held with ``fcntl.flock``: the kernel releases it if its holder dies."""

    def __init__(self, directory: Path, task_id: str, window: str):
        self.path = directory / f"{task_id}.{window}.lock"
        self.done_path = directory / f"{task_id}.{window}.done"
        self.key = str(self.path)
        self.token = secrets.token_hex(16)
        self._fd: int | None = None

    def acquire(self) -> bool:
        if self._fd is not None:
            raise RuntimeError(f"{self.path}: already acquired")
        private_dir(self.path.parent)
        for _ in range(3):  # the holder may unlink the file between our open and flock
            if self.done_path.exists():
                return False
            fd = open_private(self.path, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # we locked a file its owner has just released and unlinked
                os.close(fd)
                continue
            if self.done_path.exists():  # finished between our first check and the flock
                os.close(fd)
                return False
            os.ftruncate(fd, 0)
            os.write(fd, f"{self.token} {os.getpid()}\n".encode())
            self._fd = fd
            return True
        return False

    def extend(self) -> bool:
        return self._fd is not None  # held as long as this process keeps the descriptor

    def release(self, finished: bool) -> bool:
        fd, self._fd = self._fd, None
        if fd is None:
            return False
        try:
            if finished:
                atomic_write(self.done_path, (self.token + "\n").encode())
            self.path.unlink(missing_ok=True)  # while still locked: a late opener sees another inode
        finally:
            os.close(fd)
        return True
