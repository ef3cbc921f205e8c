"""A disk that refuses the checkpoint's writes (full, past a file size limit, read-only): stop once.

Retrying would only keep fetching pages that cannot be recorded, buffer their
records and log an error per commit. So the first refused write (the journal, a
durable feed, a snapshot) stops the crawl and later ones are only counted; what
is on disk stays a consistent prefix, so a resume loses and repeats nothing.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from scrapy.utils.defer import deferred_from_coro

from scrapy_openclaw import runtime
from scrapy_openclaw.scrapy_internals import engine_of

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

REASON = "checkpoint_unwritable"
#: errors that say the disk will not take the write, however often it is tried
REFUSALS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM})


def refuses(exc: BaseException) -> bool:
    """Whether *exc* is the disk refusing a write (not a passing I/O error)."""
    return isinstance(exc, OSError) and exc.errno in REFUSALS


def describe_space(path: Path) -> str:
    """Free space on *path*'s filesystem, and the process's file size limit if it has one."""
    parts = []
    where = path
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        usage = shutil.disk_usage(where)
        parts.append(f"{_size(usage.free)} free of {_size(usage.total)} on its filesystem")
    except OSError:
        pass
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if soft != resource.RLIM_INFINITY:
            parts.append(f"file size limit {_size(soft)} (RLIMIT_FSIZE)")
    except (ImportError, OSError, ValueError):  # (no resource module on Windows)
        pass
    if not os.access(where, os.W_OK):
        parts.append("not writable")
    return "; ".join(parts) or "free space unknown"


def _size(n: int) -> str:
    for unit in ("bytes", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} bytes"  # pragma: no cover


class DiskRefusal:
    """One per crawler: the first refused write stops the crawl; the rest are counted."""

    def __init__(self, crawler: Crawler):
        self.crawler = crawler
        self.first: tuple[Path, OSError] | None = None  #: the write that stopped the crawl

    @classmethod
    def for_crawler(cls, crawler: Crawler) -> DiskRefusal:
        return runtime.shared(crawler, "disk_refusal", lambda: cls(crawler))

    def report(self, path: Path | str, exc: OSError) -> None:
        path = Path(path)
        self.crawler.stats.inc_value("openclaw/checkpoint/refused_writes")
        if self.first is not None:
            logger.debug("Checkpoint: write to %(path)s refused too (%(error)s)", {"path": path, "error": exc})
            return
        self.first = (path, exc)
        logger.error(
            "Checkpoint: cannot write %(path)s: %(error)s (%(space)s); stopping the crawl. Free space "
            "(or make it writable) and run the same command again: it resumes, nothing lost or repeated",
            {"path": path, "error": exc.strerror or exc, "space": describe_space(path)},
            extra={"spider": self.crawler.spider},
        )
        engine = engine_of(self.crawler)
        if engine is not None and getattr(engine, "running", False):
            deferred_from_coro(engine.close_spider_async(reason=REASON))

    @property
    def stopped(self) -> bool:
        return self.first is not None
