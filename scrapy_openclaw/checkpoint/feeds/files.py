"""The file a durable feed writes to: buffered until the group commit, cut back on resume.

:class:`DurableFile` keeps an exporter's bytes in memory until the checkpoint
syncs them, and knows the offset after the last complete item;
:class:`DurableFileFeedStorage` puts it in place of Scrapy's ``FileFeedStorage``.
"""

from __future__ import annotations

import io
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy.extensions.feedexport import FileFeedStorage

from scrapy_openclaw._files import FILE_MODE, fsync_dir, open_private
from scrapy_openclaw.checkpoint.refusal import DiskRefusal, refuses
from scrapy_openclaw.settings import OpenClawSettings

if TYPE_CHECKING:
    from scrapy import Spider

    from scrapy_openclaw.checkpoint.feeds.outputs import DurableFeeds

logger = logging.getLogger(__name__)


class DurableFile(io.RawIOBase):
    """The file object a durable feed's exporter writes to.

    Writes stay in memory until :meth:`sync` (called by the group commit), so
    the file on disk never holds bytes of a page the journal may not record.
    ``items_end`` is the position after the last complete item: the offset a
    resume truncates to (a JSON or XML trailer written at close lies beyond it).
    """

    def __init__(self, path: Path, offset: int | None, overwrite: bool, *, mode: int = FILE_MODE):
        super().__init__()
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        # private unless OPENCLAW_FEED_FILE_MODE says otherwise; never written through a symlink
        self._fd = open_private(path, os.O_WRONLY | os.O_APPEND, mode=mode)
        size = os.fstat(self._fd).st_size
        self.missing = 0  #: bytes the checkpoint recorded that are no longer in the file
        if offset is not None:
            if size < offset:
                self.missing = offset - size
            else:
                os.ftruncate(self._fd, offset)
        elif overwrite:
            os.ftruncate(self._fd, 0)
        self.base = os.fstat(self._fd).st_size  #: size when opened (after truncation)
        self.position = self.base  #: bytes written so far, buffered ones included
        self.items_end = self.base
        self._buffer = bytearray()
        self.discard = False  #: swallow writes (a resumed exporter's header, already on disk)
        self.complete = False  #: a finished batch: its trailer is written too
        self.base_items = 0  #: the slot's item count when the file was opened
        self._unsynced = False
        fsync_dir(path.parent)

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:  # type: ignore[override]
        n = len(data)
        if not self.discard:
            self._buffer += data
            self.position += n
        return n

    def flush(self) -> None:  # the group commit writes, not the exporter
        pass

    def mark_item(self) -> None:
        self.items_end = self.position

    def sync(self, fsync: bool) -> None:
        if self._fd < 0:
            return
        if self._buffer:
            written = 0
            try:
                with memoryview(self._buffer) as view:
                    while written < len(view):
                        written += os.write(self._fd, view[written:])
            except OSError as exc:  # (os.write names no file: the caller's message needs it)
                raise OSError(exc.errno, exc.strerror, str(self.path)) from None
            finally:  # a failed write (disk full) keeps only what did not reach the file
                del self._buffer[:written]
                self._unsynced = self._unsynced or written > 0
        if fsync and self._unsynced:
            try:
                os.fsync(self._fd)
            except OSError as exc:
                raise OSError(exc.errno, exc.strerror, str(self.path)) from None
            self._unsynced = False

    def close(self) -> None:
        if self._fd >= 0:
            try:
                self.sync(fsync=True)
            finally:
                os.close(self._fd)
                self._fd = -1
        super().close()


class DurableFileFeedStorage(FileFeedStorage):
    """Stands in for Scrapy's ``FileFeedStorage`` in a durable feed (same path and mode).

    Its ``__name__`` is Scrapy's class name, so the stats monitors watch keep
    their keys (``feedexport/success_count/FileFeedStorage``).
    """

    def __init__(self, path: str, overwrite: bool, offset: int | None, feeds: DurableFeeds):  # noqa: PLW0231
        self.path = path  # type: ignore[assignment]
        self.write_mode = "wb" if overwrite else "ab"
        self.overwrite = overwrite
        self.offset = offset
        self.feeds = feeds
        self.file: DurableFile | None = None

    # (a DurableFile is a binary file object, a RawIOBase; Scrapy's typing asks for IO[bytes])
    def open(self, spider: Spider) -> DurableFile:  # type: ignore[override]
        if self.file is not None:  # opened early by a resume
            return self.file
        mode = OpenClawSettings.for_crawler(self.feeds.crawler).feed_file_mode
        self.file = DurableFile(Path(self.path), self.offset, self.overwrite, mode=mode)
        if self.file.missing:
            logger.warning(
                "Durable feed %(path)s is %(n)d bytes shorter than the checkpoint recorded (changed "
                "outside the crawl?); appending after what is left",
                {"path": self.path, "n": self.file.missing},
                extra={"spider": spider},
            )
        self.feeds.opened(self.file)
        return self.file

    def store(self, file: Any) -> None:
        try:
            file.close()
        except OSError as exc:
            if not refuses(exc):
                raise
            # its items are not recorded done: the resume fetches those pages again and writes them then
            DiskRefusal.for_crawler(self.feeds.crawler).report(self.path, exc)


DurableFileFeedStorage.__name__ = DurableFileFeedStorage.__qualname__ = FileFeedStorage.__name__
