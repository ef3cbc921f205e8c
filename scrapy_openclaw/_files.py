"""Files holding crawl data (requests, headers, cookies, items): private, replaced atomically.

Every file the package writes goes through here: created 0600 (directories we
create 0700, and a directory we use is checked with ``lstat``: never a symlink,
never writable by others), temp files created exclusively (``mkstemp`` in the target
directory, with a prefix no other program uses, so cleaning up never touches
someone else's ``*.tmp``), then fsync, rename and a directory fsync.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING

from scrapy_openclaw.exceptions import UnsafeDirectory

if TYPE_CHECKING:
    from collections.abc import Iterator

logger = logging.getLogger(__name__)

FILE_MODE = 0o600
DIR_MODE = 0o700
#: Temp files are ``.openclaw-<final name>.<random>.tmp``: :func:`is_temp` recognises only these.
TMP_PREFIX = ".openclaw-"
TMP_SUFFIX = ".tmp"


def private_dir(path: str | os.PathLike[str], *, setting: str = "") -> Path:
    """Create *path* and any missing parents with mode 0700, then :func:`check_dir` it."""
    path = Path(path)
    missing = []
    probe = path
    while not os.path.lexists(probe) and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):  # created meanwhile by another process
            directory.mkdir(mode=DIR_MODE)
    check_dir(path, setting=setting)
    return path


def check_dir(path: str | os.PathLike[str], *, setting: str = "") -> None:
    """Refuse a directory others could redirect or fill: a symlink, not a directory, or
    group/world-writable and not ours (one of ours that is too open is tightened to 0700).

    A sticky directory owned by root (``/tmp``) is accepted: others cannot rename or
    remove our files in it, and files are never opened through a symlink.
    """
    where = f"setting {setting}: " if setting else ""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise UnsafeDirectory(f"{where}{path} does not exist (removed while in use?)") from None
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeDirectory(
            f"{where}{path} is a symlink (refused: crawl data is never written through one); "
            "point the setting at the real directory"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirectory(f"{where}{path} is not a directory")
    mode = stat.S_IMODE(st.st_mode)
    if not mode & 0o022:
        return
    if st.st_uid == os.getuid():
        os.chmod(path, DIR_MODE, follow_symlinks=False)
        logger.warning(
            "Directory %(path)s was writable by others (mode %(mode)04o); tightened to 0700",
            {"path": path, "mode": mode},
        )
    elif not (mode & stat.S_ISVTX and st.st_uid == 0):
        raise UnsafeDirectory(
            f"{where}{path} is writable by others (mode {mode:04o}) and owned by uid {st.st_uid}, "
            f"not this user ({os.getuid()}): give the crawl a directory of its own"
        )


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def open_private(path: str | os.PathLike[str], flags: int, *, mode: int = FILE_MODE) -> int:
    """``os.open`` creating the file 0600 (or *mode*, the user's choice) when it does not exist
    (never widening an existing one).

    A symlink at *path* is refused (``O_NOFOLLOW``), never followed.
    """
    return _open(path, flags | os.O_CREAT, mode)


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
