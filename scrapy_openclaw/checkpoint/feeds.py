"""Durable feeds: with the checkpoint on, an item is in each local feed exactly once after ``kill -9``.

How: items are held per request until the checkpoint sees the request finish,
then exported; the checkpoint's group commit writes and fsyncs the feed files
*before* the journal record that marks those pages done, and that record
carries each feed's byte offset. A resume truncates each feed to the offset
of the last durable record and appends (``-O`` overwrites only when a new
crawl starts). Item pipelines that write themselves opt in with
:func:`durable_writer`.

Scrapy's feed export internals are touched here only, by subclassing
(``FeedExporter._start_new_batch``, ``FeedSlot`` attributes; checked against
Scrapy 2.14 .. 2.19, notes at each use) and through
:func:`scrapy_openclaw.scrapy_internals.continue_json_array`.
"""

from __future__ import annotations

import io
import logging
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlparse

from scrapy import signals
from scrapy.exporters import CsvItemExporter, JsonItemExporter
from scrapy.extensions.feedexport import FeedExporter, FileFeedStorage
from scrapy.http import Response

from scrapy_openclaw import runtime
from scrapy_openclaw._files import fsync_dir
from scrapy_openclaw.redact import mask_uri
from scrapy_openclaw.scrapy_internals import continue_json_array

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.extensions.feedexport import FeedSlot

logger = logging.getLogger(__name__)

#: Largest marker (as JSON) an opted-in pipeline may record.
MAX_MARKER_CHARS = 1000


class DurableWriter(Protocol):
    """The hook for an item pipeline that writes items itself (see :func:`durable_writer`)."""

    def durable_open(self, marker: Any) -> None:
        """Cut the output back to *marker* (what :meth:`durable_sync` last returned and the
        checkpoint recorded); None for a new crawl (keep what is there)."""

    def durable_write(self, item: Any) -> None:
        """Write an item whose page is finished (instead of writing in ``process_item``)."""

    def durable_sync(self, fsync: bool) -> Any:
        """Write what is buffered (and fsync if asked); return the marker to resume from
        (a byte offset, a key: JSON-safe, small)."""


class DurableFile(io.RawIOBase):
    """The file object a durable feed's exporter writes to.

    Writes stay in memory until :meth:`sync` (called by the group commit), so
    the file on disk never holds bytes of a page the journal may not record.
    ``items_end`` is the position after the last complete item: the offset a
    resume truncates to (a JSON or XML trailer written at close lies beyond it).
    """

    def __init__(self, path: Path, offset: int | None, overwrite: bool):
        super().__init__()
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0), 0o666)
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
            finally:  # a failed write (disk full) keeps only what did not reach the file
                del self._buffer[:written]
                self._unsynced = self._unsynced or written > 0
        if fsync and self._unsynced:
            os.fsync(self._fd)
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

    def open(self, spider: Spider) -> DurableFile:
        if self.file is not None:  # opened early by a resume
            return self.file
        self.file = DurableFile(Path(self.path), self.offset, self.overwrite)
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
        file.close()


DurableFileFeedStorage.__name__ = DurableFileFeedStorage.__qualname__ = FileFeedStorage.__name__


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

    Without ``OPENCLAW_CHECKPOINT_DIR`` it is Scrapy's exporter, unchanged. The
    add-on puts it in place of Scrapy's; to configure by hand::

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
            plain = slot.storage
            slot.storage = DurableFileFeedStorage(
                plain.path, getattr(plain, "write_mode", "ab") == "wb", None, self.durable
            )  # type: ignore[attr-defined]
        return slot

    def item_scraped(self, item: Any, spider: Spider, response: Any = None) -> None:
        if not self.durable.active:
            super().item_scraped(item, spider)
        # else: DurableFeeds holds it until its page is done, then calls export()

    def export(self, item: Any) -> None:
        before = list(self.slots)
        super().item_scraped(item, self._spider)
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


class DurableFeeds:
    """The crawl's durable outputs (feeds and opted-in pipelines), driven by the checkpoint.

    The checkpoint calls :meth:`activate` when it starts, :meth:`page_finished` for every
    finished request and :meth:`sync` in each group commit; the journal stores what
    :meth:`sync` returns.
    """

    def __init__(self, crawler: Crawler):
        self.crawler = crawler
        self.active = False
        self.resumed = False
        self.exporter: DurableFeedExporter | None = None
        self.recovered_feeds: dict[str, dict[str, Any]] = {}
        self._recovered_writers: dict[str, dict[str, Any]] = {}
        self._writers: dict[str, tuple[DurableWriter, list[int]]] = {}  # name -> (writer, [items])
        self._recorded: dict[str, tuple[str, int]] = {}  # feed key -> (uri, batch) the journal has
        self._files: list[DurableFile] = []
        self._unrecorded: dict[str, dict[str, Any]] = {}
        self._held: dict[Any, list[Any]] = {}
        self._in_flight: set[Any] = set()  # requests the engine slot holds (their items wait for them)
        self._connected = False

    @classmethod
    def for_crawler(cls, crawler: Crawler) -> DurableFeeds:
        return runtime.shared(crawler, "durable_feeds", lambda: cls(crawler))

    def activate(self, recovered: dict[str, dict[str, Any]], resumed: bool) -> None:
        self.active, self.resumed = True, resumed
        self.recovered_feeds = {k[5:]: v for k, v in recovered.items() if k.startswith("feed:")} if resumed else {}
        self._recovered_writers = {k[7:]: v for k, v in recovered.items() if k.startswith("writer:")} if resumed else {}
        if self.exporter is not None:
            self._connect()

    def _connect(self) -> None:
        """Hold items only when some output is durable (a crawl without one pays nothing)."""
        if self.active and not self._connected:
            self._connected = True
            self.crawler.signals.connect(self._item_scraped, signal=signals.item_scraped)

    # ---------------------------------------------------------- writers

    def register_writer(self, name: str, writer: DurableWriter) -> bool:
        if not self.active:
            return False
        state = self._recovered_writers.get(name)
        writer.durable_open(state["marker"] if state else None)
        self._writers[name] = (writer, [state["items"] if state else 0])
        self._connect()
        if state is None:  # its starting point goes to the journal before any item of ours
            self._unrecorded[f"writer:{name}"] = {"marker": writer.durable_sync(False), "items": 0}
        return True

    # ------------------------------------------------------------ items

    def opened(self, file: DurableFile) -> None:
        self._files.append(file)

    def _item_scraped(self, item: Any, response: Any = None, spider: Any = None) -> None:
        request = response.request if isinstance(response, Response) else getattr(response, "request", None)
        if request is None or request not in self._in_flight:  # not tied to a page we will see finish
            self._export(item)
        else:
            self._held.setdefault(request, []).append(item)

    def page_started(self, request: Request) -> None:
        if self._connected:
            self._in_flight.add(request)

    def page_finished(self, request: Request) -> None:
        self._in_flight.discard(request)
        items = self._held.pop(request, None)
        if items:
            for item in items:
                self._export(item)

    def release_all(self) -> None:
        held, self._held = self._held, {}
        for items in held.values():
            for item in items:
                self._export(item)

    def _export(self, item: Any) -> None:
        if self.exporter is not None:
            self.exporter.export(item)
        for writer, count in self._writers.values():
            writer.durable_write(item)
            count[0] += 1

    # ------------------------------------------------------------- sync

    def bases(self) -> dict[str, dict[str, Any]]:
        """Outputs opened since the last commit, at their starting point (before any item of
        theirs reaches the disk): the journal must hold these first, or a crash right after
        the next write could not cut them back."""
        out, self._unrecorded = self._unrecorded, {}
        if self.exporter is not None:
            for template, st in self.exporter.feed_states().items():
                key = f"feed:{template}"
                file = self._file_of(template)
                if file is not None and self._recorded.get(key) != (st["uri"], st["batch"]):
                    out[key] = {**st, "offset": file.base, "items": file.base_items}
        return out

    def _file_of(self, template: str) -> DurableFile | None:
        assert self.exporter is not None
        for slot in self.exporter.slots:
            if slot.uri_template == template:
                file = getattr(slot.storage, "file", None)
                return file if isinstance(file, DurableFile) else None
        return None

    def sync(self, fsync: bool) -> dict[str, dict[str, Any]]:
        """Write (and fsync) every output; return each one's resume point, JSON-safe."""
        for file in self._files:
            file.sync(fsync)
        self._files = [f for f in self._files if not f.closed]
        states: dict[str, dict[str, Any]] = {}
        if self.exporter is not None:
            for template, st in self.exporter.feed_states().items():
                states[f"feed:{template}"] = st
        for name, (writer, count) in self._writers.items():
            states[f"writer:{name}"] = {"marker": writer.durable_sync(fsync), "items": count[0]}
        return states

    def recorded(self, states: dict[str, dict[str, Any]]) -> None:
        """The journal now holds *states* (after :meth:`bases` or :meth:`sync`)."""
        for key, st in states.items():
            if key.startswith("feed:") and st.get("offset") is not None:
                self._recorded[key] = (st["uri"], st["batch"])


def durable_writer(crawler: Crawler | None, name: str, writer: DurableWriter) -> bool:
    """Opt an item pipeline into exactly-once output under the checkpoint.

    Returns True when the checkpoint is on: the pipeline then writes nothing in
    ``process_item``; the checkpoint calls ``writer.durable_write(item)`` once the
    item's page is finished, ``writer.durable_sync(fsync)`` in each group commit
    (flush, fsync when asked, return a JSON-safe marker such as the byte offset)
    and, at start, ``writer.durable_open(marker)`` with the marker of the last
    durable commit (None for a new crawl) to cut the output back to it. False:
    no checkpoint, write as usual. *name* must be stable across runs.
    """
    if crawler is None:
        return False
    feeds = runtime.peek(crawler, "durable_feeds")
    return bool(feeds is not None and feeds.register_writer(name, writer))


def parse_outputs(value: Any) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Validate recorded output states (from a checkpoint file: untrusted); (good ones, problems)."""
    good: dict[str, dict[str, Any]] = {}
    bad: list[str] = []
    if not isinstance(value, dict):
        return good, ["feed states are not an object"]
    for key, st in value.items():
        ok = isinstance(key, str) and isinstance(st, dict) and _nonneg(st.get("items"))
        if ok and key.startswith("feed:"):
            ok = (
                isinstance(st.get("uri"), str)
                and _nonneg(st.get("batch"))
                and st["batch"] >= 1
                and (st.get("offset") is None or _nonneg(st.get("offset")))
            )
        elif ok and key.startswith("writer:"):
            import json

            try:
                ok = len(json.dumps(st.get("marker"))) <= MAX_MARKER_CHARS
            except (TypeError, ValueError):
                ok = False
        else:
            ok = False
        if ok:
            good[key] = st
        else:
            bad.append(str(key)[:100])
    return good, bad


def _nonneg(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
