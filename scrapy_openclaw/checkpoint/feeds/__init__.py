"""Durable feeds: with the checkpoint on, an item is in each local feed exactly once after ``kill -9``.

Items wait for their page to be done; the group commit fsyncs the feeds before
the journal record that marks those pages done and holds each feed's offset, to
which a resume cuts the feed back (docs/checkpoint.md). The exporter is here;
:mod:`.files` has the file, :mod:`.outputs` the holding, :mod:`.writers` the opt-in.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlparse

from scrapy.exporters import CsvItemExporter, JsonItemExporter
from scrapy.extensions.feedexport import FeedExporter, FileFeedStorage

from scrapy_openclaw.checkpoint.feeds.files import DurableFile, DurableFileFeedStorage
from scrapy_openclaw.checkpoint.feeds.outputs import DurableFeeds
from scrapy_openclaw.checkpoint.feeds.writers import MAX_MARKER_CHARS, DurableWriter, durable_writer, parse_outputs
from scrapy_openclaw.redact import mask_uri
from scrapy_openclaw.scrapy_internals import continue_json_array

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.extensions.feedexport import FeedSlot

__all__ = [
    "MAX_MARKER_CHARS",
    "DurableFeedExporter",
    "DurableFeeds",
    "DurableFile",
    "DurableFileFeedStorage",
    "DurableWriter",
    "durable_writer",
    "parse_outputs",
]

logger = logging.getLogger(__name__)


def _template_regex(template: str) -> re.Pattern[str]:
    """Names a feed URI template can produce (placeholders match anything but ``/``)."""
    parts = re.split(r"%\([^)]+\)[-+ #0]*(?:\d+|\*)?(?:\.(?:\d+|\*))?[diouxXeEfFgGcrsa]", template)
    return re.compile("[^/]*".join(re.escape(p) for p in parts) + r"\Z")


def _local_path(uri: str) -> str | None:
    """The path of a local file feed URI, None for other schemes (same rule as FileFeedStorage)."""
    scheme = urlparse(uri).scheme
    if scheme not in ("", "file"):
        return None
    return FileFeedStorage(uri).path


class DurableFeedExporter(FeedExporter):
    """Scrapy's ``FeedExporter`` whose local file feeds are durable with the checkpoint on.

    Without ``OPENCLAW_CHECKPOINT_DIR`` it is Scrapy's exporter, unchanged. Scrapy's feed
    export internals are touched here only, by subclassing (``FeedExporter._start_new_batch``,
    ``FeedSlot`` attributes; checked against Scrapy 2.14 .. 2.19, notes at each use), and
    through :func:`scrapy_openclaw.scrapy_internals.continue_json_array`. The add-on puts
    it in place of Scrapy's; to configure by hand::

        EXTENSIONS = {"scrapy.extensions.feedexport.FeedExporter": None,
                      "scrapy_openclaw.checkpoint.feeds.DurableFeedExporter": 0}
    """

    def __init__(self, crawler: Crawler):
        super().__init__(crawler)
        self.durable = DurableFeeds.for_crawler(crawler)
        self.durable.exporter = self
        self.durable._connect()  # when the checkpoint was built first
        self._durable_templates: set[str] = set()
        self._spider: Spider | None = None

    def open_spider(self, spider: Spider) -> None:
        self._spider = spider
        if self.durable.active:
            self._durable_templates = self._choose_durable(spider)
        super().open_spider(spider)
        if not self._durable_templates:
            return
        recorded = self.durable.recovered_feeds
        slots = []
        for slot in self.slots:  # none has opened its file yet: replace the resumed ones
            state = recorded.get(slot.uri_template)
            if slot.uri_template in self._durable_templates and state is not None:
                slot = self._resume_slot(slot, state, spider)
            slots.append(slot)
        self.slots = slots

    def _choose_durable(self, spider: Spider) -> set[str]:
        durable, other = set(), []
        for template, options in self.feeds.items():
            scheme = urlparse(template).scheme
            # 2.14/2.19: FEED_STORAGES maps a scheme to the class; "" and "file" are local
            cls = self.storages.get(scheme, self.storages.get("file"))
            if scheme in ("", "file") and cls is FileFeedStorage and not options.get("postprocessing"):
                durable.add(template)
            else:
                why = (
                    "postprocessing cannot be cut back"
                    if options.get("postprocessing")
                    else f"{getattr(cls, '__name__', cls)} cannot be truncated and appended"
                )
                other.append(f"{mask_uri(template)} ({why})")
        if other:
            logger.warning(
                "Checkpoint: feed(s) %(feeds)s are not durable: after a crash their items may be lost "
                "or written twice (local file feeds without postprocessing are exactly-once)",
                {"feeds": "; ".join(other)},
                extra={"spider": spider},
            )
        return durable

    def _resume_slot(self, slot: FeedSlot, state: dict[str, Any], spider: Spider) -> FeedSlot:
        template = slot.uri_template
        uri = state["uri"]
        if not _template_regex(template).match(uri) or _local_path(uri) is None:
            logger.warning(
                "Checkpoint: recorded feed URI %(uri)r does not match FEEDS key %(t)r; not resumed",
                {"uri": mask_uri(uri), "t": mask_uri(template)},
                extra={"spider": spider},
            )
            return slot
        options = dict(self.feeds[template])
        fmt = options["format"]
        offset, items = state["offset"], state["items"]
        path = Path(_local_path(uri) or "")
        if offset is not None and items and issubclass(self.exporters[fmt], CsvItemExporter):
            # the header is on disk already: keep its columns, do not write it again
            kwargs = dict(options.get("item_export_kwargs") or {})
            kwargs["include_headers_line"] = False
            options["item_export_kwargs"] = kwargs
            if not options.get("fields"):
                options["fields"] = _csv_header(path, options.get("encoding") or "utf-8")
        # 2.14/2.19: _start_new_batch(batch_id, uri, feed_options, spider, uri_template) -> FeedSlot
        new = self._start_new_batch(
            batch_id=state["batch"], uri=uri, feed_options=options, spider=spider, uri_template=template
        )
        if offset is None:  # the batch was started but its file never opened
            return new
        storage = new.storage
        assert isinstance(storage, DurableFileFeedStorage)
        storage.offset = offset
        new.itemcount = items
        # open now: the header an exporter writes at start is already on disk (discarded);
        # a JSON array with items continues after a comma
        file = storage.open(spider)
        file.base_items = items
        file.discard = offset > 0
        new.start_exporting()
        file.discard = False
        file.mark_item()
        if items and isinstance(new.exporter, JsonItemExporter):
            continue_json_array(new.exporter)
        self.durable._recorded[f"feed:{template}"] = (uri, state["batch"])
        logger.info(
            "Checkpoint: feed %(uri)s resumed at byte %(offset)d (%(items)d items, batch %(batch)d)",
            {"uri": uri, "offset": offset, "items": items, "batch": state["batch"]},
            extra={"spider": spider},
        )
        return new

    def _start_new_batch(
        self, batch_id: int, uri: str, feed_options: dict[str, Any], spider: Spider, uri_template: str
    ) -> FeedSlot:
        slot = super()._start_new_batch(
            batch_id=batch_id, uri=uri, feed_options=feed_options, spider=spider, uri_template=uri_template
        )
        if uri_template in self._durable_templates:
            # FeedSlot.storage is a plain attribute in 2.14 and 2.19; FileFeedStorage.path/.write_mode too
            plain: Any = slot.storage  # a FileFeedStorage: durable templates are local file feeds
            start = self._journaled_start(uri_template, batch_id, uri)
            overwrite = start is None and (
                getattr(plain, "write_mode", "ab") == "wb" or self._unrecorded_batch(uri_template, batch_id)
            )
            storage: Any = DurableFileFeedStorage(
                plain.path, overwrite, start, self.durable
            )  # (Any: its open() returns a DurableFile, not typed as IO[bytes])
            slot.storage = storage
        return slot

    def _journaled_start(self, template: str, batch_id: int, uri: str) -> int | None:
        """Where a resumed crawl's new batch starts when the interrupted run journaled its start
        (``next:`` in :meth:`DurableFeeds.bases`): cut back to it, keeping what was there before."""
        start = self.durable.recovered_next.get(template)
        if start is None or start["batch"] != batch_id or start["uri"] != uri:
            return None
        offset = start.get("offset")
        return offset if isinstance(offset, int) else None

    def _unrecorded_batch(self, template: str, batch_id: int) -> bool:
        """A batch after the one the journal recorded last, opened by a resumed crawl: its file, if
        any, was written by the interrupted run after that record (a batch started and finished
        between two commits), pages the resume fetches again; it starts empty, not appended to."""
        if not self.durable.resumed or not self.feeds[template].get("batch_item_count"):
            return False
        state = self.durable.recovered_feeds.get(template)
        if state is None:
            return True
        # (recorded before its file was opened: what the file holds came after the record too)
        return batch_id > state["batch"] or (batch_id == state["batch"] and state["offset"] is None)

    def item_scraped(self, item: Any, spider: Spider, response: Any = None) -> None:
        if not self.durable.active:
            super().item_scraped(item, spider)
        # else: DurableFeeds holds it until its page is done, then calls export()

    def export(self, item: Any) -> None:
        before = list(self.slots)
        super().item_scraped(item, cast("Spider", self._spider))  # set by open_spider, before any item
        for slot in self.slots:
            file = getattr(slot.storage, "file", None)
            if isinstance(file, DurableFile):
                file.mark_item()
        for slot in before:
            if slot not in self.slots:  # a finished batch: its trailer now, so the commit makes it whole
                slot.finish_exporting()
                file = getattr(slot.storage, "file", None)
                if isinstance(file, DurableFile):
                    file.complete = True

    async def close_spider(self, spider: Spider) -> None:
        self.durable.release_all()
        await super().close_spider(spider)

    def feed_states(self) -> dict[str, dict[str, Any]]:
        """The current batch of each durable feed: URI, batch id, resume offset, items."""
        out = {}
        for slot in self.slots:
            if slot.uri_template not in self._durable_templates:
                continue
            file = getattr(slot.storage, "file", None)
            out[slot.uri_template] = {
                "uri": slot.uri,
                "batch": slot.batch_id,
                "offset": file.items_end if isinstance(file, DurableFile) else None,
                "items": slot.itemcount,
            }
        return out


def _csv_header(path: Path, encoding: str) -> list[str] | None:
    import csv

    try:
        with open(path, encoding=encoding, newline="") as f:
            return next(csv.reader([f.readline()]), None) or None
    except (OSError, UnicodeDecodeError):
        return None
