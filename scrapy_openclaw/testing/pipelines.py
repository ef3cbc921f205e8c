"""Item pipelines for kill -9 tests and benchmarks."""

from __future__ import annotations

import json
import os
from typing import Any

from scrapy_openclaw.checkpoint.feeds import durable_writer


class FlushedItemsPipeline:
    """Appends each item as a JSON line to the file ``FLUSHED_ITEMS_FILE``.

    With the checkpoint on it opts into exactly-once output
    (:func:`~scrapy_openclaw.checkpoint.feeds.durable_writer`): items are written
    when their page is done, fsynced in the checkpoint's group commit, and a
    resume cuts the file back to the byte offset of the last durable commit.
    Without it, each item is flushed to the OS as it passes (a kill loses none
    that passed, but a re-fetched page writes its items again).
    """

    def __init__(self, path: str, crawler: Any = None):
        self.file = open(path, "ab")
        self.durable = durable_writer(crawler, "FlushedItemsPipeline", self)

    @classmethod
    def from_crawler(cls, crawler: Any) -> FlushedItemsPipeline:
        return cls(crawler.settings.get("FLUSHED_ITEMS_FILE"), crawler)

    def process_item(self, item: Any) -> Any:
        if not self.durable:
            self.durable_write(item)
            self.file.flush()
        return item

    # the durable_writer hook
    def durable_open(self, marker: Any) -> None:
        if isinstance(marker, int) and 0 <= marker <= os.fstat(self.file.fileno()).st_size:
            self.file.truncate(marker)
            self.file.seek(0, os.SEEK_END)

    def durable_write(self, item: Any) -> None:
        if self.file.closed:
            raise RuntimeError(f"FlushedItemsPipeline: item after close: {item!r}"[:300])
        self.file.write(json.dumps(dict(item)).encode("utf-8") + b"\n")

    def durable_sync(self, fsync: bool) -> int:
        if self.file.closed:  # the checkpoint's last commit comes after the pipelines close
            return self._final
        self.file.flush()
        if fsync:
            os.fsync(self.file.fileno())
        return self.file.tell()

    def close_spider(self) -> None:
        self._final = self.durable_sync(True)
        self.file.close()
