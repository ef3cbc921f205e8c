"""Item pipelines for kill -9 tests and benchmarks."""

from __future__ import annotations

import json
from typing import Any


class FlushedItemsPipeline:
    """Appends each item as a JSON line, flushed to the OS before the page counts as done.

    Scrapy's feed exporters keep items in memory until they close, so after a
    ``kill -9`` they lose what they held; a test that counts items after kills
    needs this instead. The file is the setting ``FLUSHED_ITEMS_FILE``.
    """

    def __init__(self, path: str):
        self.file = open(path, "a", encoding="utf-8")  # noqa: SIM115

    @classmethod
    def from_crawler(cls, crawler: Any) -> FlushedItemsPipeline:
        return cls(crawler.settings.get("FLUSHED_ITEMS_FILE"))

    def process_item(self, item: Any) -> Any:
        self.file.write(json.dumps(dict(item)) + "\n")
        self.file.flush()
        return item

    def close_spider(self) -> None:
        self.file.close()
