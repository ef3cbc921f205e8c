"""Crawl-side helpers for the dead-letter tests (imported by crawl subprocesses as
``tests.dlq_helpers``; the repo root is on their path)."""

from __future__ import annotations

import re
from typing import Any

from scrapy_openclaw.errors import ItemValidationError


class ValidatingPipeline:
    """Drops items of the pages listed in ``DLQ_TEST_INVALID_PATHS`` with an ItemValidationError,
    and those in ``DLQ_TEST_FILTERED_PATHS`` with a plain DropItem (not a dead letter)."""

    def __init__(self, invalid: list[str], filtered: list[str]):
        self.invalid, self.filtered = set(invalid), set(filtered)

    @classmethod
    def from_crawler(cls, crawler: Any) -> ValidatingPipeline:
        settings = crawler.settings
        return cls(settings.getlist("DLQ_TEST_INVALID_PATHS"), settings.getlist("DLQ_TEST_FILTERED_PATHS"))

    def process_item(self, item: Any, spider: Any = None) -> Any:
        from scrapy.exceptions import DropItem

        path = "/" + re.sub(r"^https?://[^/]+/?", "", item["url"])
        if path in self.invalid:
            raise ItemValidationError(f"invalid item at {path}: price is missing")
        if path in self.filtered:
            raise DropItem(f"filtered {path}")
        return item
