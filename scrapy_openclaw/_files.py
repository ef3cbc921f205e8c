"""Files holding crawl data (requests, headers, cookies, items): private, replaced atomically.

Every file the package writes goes through here: created 0600 (directories we
create 0700), temp files created exclusively (``mkstemp`` in the target
directory, with a prefix no other program uses, so cleaning up never touches
someone else's ``*.tmp``), then fsync, rename and a directory fsync.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator

FILE_MODE = 0o600
DIR_MODE = 0o700
#: Temp files are ``.openclaw-<final name>.<random>.tmp``: :func:`is_temp` recognises only these.
TMP_PREFIX = ".openclaw-"
TMP_SUFFIX = ".tmp"


def private_dir(path: str | os.PathLike[str]) -> Path:
    """Create *path* and any missing parents with mode 0700 (existing ones are left as they are)."""
    path = Path(path)
    missing = []
    probe = path
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):  # created meanwhile by another process
            directory.mkdir(mode=DIR_MODE)
    return path


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def open_private(path: str | os.PathLike[str], flags: int) -> int:
    """``os.open`` creating the file 0600 when it does not exist (never widening an existing one).

    A symlink at *path* is refused (``O_NOFOLLOW``), never followed.
    """
    return _open(path, flags | os.O_CREAT, FILE_MODE)


def open_existing(path: str | os.PathLike[str], flags: int) -> int:
    """``os.open`` of a file that must exist, refusing a symlink at *path*."""
    return _open(path, flags, FILE_MODE)


def _open(path: str | os.PathLike[str], flags: int, mode: int) -> int:
    try:
        return os.open(path, flags | _NOFOLLOW, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP or (exc.errno == errno.ENOENT and os.path.islink(path)):
            raise OSError(exc.errno, f"{path} is a symlink (refused: files are never opened through one)") from None
        raise


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a rename or a new file in *path* durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def is_temp(name: str) -> bool:
    """Whether *name* is one of our temp files (safe to delete when found after a crash)."""
    return name.startswith(TMP_PREFIX) and name.endswith(TMP_SUFFIX)


@contextlib.contextmanager
def atomic_writer(
    path: str | os.PathLike[str],
    *,
    opener: Callable[[Path], IO[bytes]] | None = None,
) -> Iterator[IO[bytes]]:
    """Write *path* through an exclusive temp file in its directory; replace it only on success.

    The temp file is removed when the block raises. *opener* (tests) opens the
    temp file instead of the default, e.g. on a full disk.
    """
    path = Path(path)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f"{TMP_PREFIX}{path.name}.", suffix=TMP_SUFFIX)
    tmp = Path(name)
    try:
        if opener is not None:
            os.close(fd)
            f = opener(tmp)
        else:
            f = os.fdopen(fd, "wb")
        with f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)


def atomic_write(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace *path* with *data*: private, exclusive temp file, fsync, rename, directory fsync."""
    with atomic_writer(path) as f:
        f.write(data)
