"""The crawl's durable outputs: items held until their page is finished, then written and synced.

:class:`DurableFeeds` is what the checkpoint drives: it holds each request's
items until the request finishes, exports them to the durable feeds and the
opted-in pipelines, and returns every output's resume point in each group
commit so the journal can record it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.http import Response

from scrapy_openclaw import runtime
from scrapy_openclaw.checkpoint.feeds.files import DurableFile

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler

    from scrapy_openclaw.checkpoint.feeds import DurableFeedExporter
    from scrapy_openclaw.checkpoint.feeds.writers import DurableWriter


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
        #: a feed's next batch whose start the journal holds, but not yet its first items' pages
        self.recovered_next: dict[str, dict[str, Any]] = {}
        self._recovered_writers: dict[str, dict[str, Any]] = {}
        self._writers: dict[str, tuple[DurableWriter, list[int]]] = {}  # name -> (writer, [items])
        self._recorded: dict[str, tuple[str, int]] = {}  # feed key -> (uri, batch) the journal has
        self._journaled: set[str] = set()  # feed keys the journal has a resume point for
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
        self.recovered_next = {k[5:]: v for k, v in recovered.items() if k.startswith("next:")} if resumed else {}
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
        the next write could not cut them back.

        A feed's first file is its resume point (``feed:``). Once the journal has one, a
        later batch's start is kept apart (``next:``): until the done record of this commit,
        the resume point is still the batch recorded last, whose file (or the batches
        between) this commit's write may take past it with items of pages not yet done (a
        resume cuts those off and fetches the pages again, and the next batch starts again
        where this says)."""
        out, self._unrecorded = self._unrecorded, {}
        if self.exporter is not None:
            for template, st in self.exporter.feed_states().items():
                key = f"feed:{template}"
                file = self._file_of(template)
                if file is not None and self._recorded.get(key) != (st["uri"], st["batch"]):
                    start = {**st, "offset": file.base, "items": file.base_items}
                    known = key in self._journaled or template in self.recovered_feeds
                    out[f"next:{template}" if known else key] = start
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
            if key.startswith("feed:"):
                self._journaled.add(key)
                if st.get("offset") is not None:
                    self._recorded[key] = (st["uri"], st["batch"])
