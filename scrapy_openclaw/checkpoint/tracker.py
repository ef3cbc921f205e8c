"""Which requests are live (queued or in flight), and what changed since the last commit.

A pure in-memory tracker, fed by the request lifecycle hooks the checkpoint
extension wires (:mod:`scrapy_openclaw.lifecycle`), and read by the commit,
which turns its changes into journal records (:mod:`.records`). No I/O, no
reactor: a unit test drives it with plain Requests.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from scrapy.utils.httpobj import urlparse_cached

from scrapy_openclaw.checkpoint import records

if TYPE_CHECKING:
    from scrapy import Request

    from scrapy_openclaw.checkpoint.state import RecoveredState


class Entry:
    """A live request: state ("p" pending, "f" in flight), its JSON, fingerprint, object."""

    __slots__ = ("data", "flushed", "fp", "request", "state")

    def __init__(self, state: str, data: str, fp: str | None, request: Request | None, flushed: bool):
        self.state = state
        self.data = data
        self.fp = fp
        self.request = request
        self.flushed = flushed


class RequestTracker:
    """Live requests by id, the fingerprints seen, and the changes not journaled yet.

    *fingerprint* is the crawl's request fingerprinter; *serialise* turns a
    request into its JSON text (None if it cannot be stored); *filtering*
    says whether the crawl filters duplicates at all.
    """

    def __init__(
        self, fingerprint: Callable[[Request], bytes], serialise: Callable[[Request], str | None], *, filtering: bool
    ):
        self.fingerprint = fingerprint
        self.serialise = serialise
        self.filtering = filtering
        self.live: dict[int, Entry] = {}
        self.by_request: dict[Request, int] = {}
        self.seen: set[bytes] = set()
        self.start_seen: set[bytes] = set()
        self.restored_seen: frozenset[bytes] = frozenset()
        self.restored_start: frozenset[bytes] = frozenset()
        self.next_id = 1
        #: set while restored requests are handed to the engine (their data is already stored)
        self.restoring = False
        # changes since the last commit
        self._new: list[tuple[int, str | None]] = []  # (id, fp) scheduled
        self._changed: list[int] = []
        self._popped: list[int] = []
        self._done: list[int] = []
        self._start_new: list[str] = []
        self._seen_done: list[str] = []  # fingerprints for the next "done" record

    def adopt(self, recovered: RecoveredState) -> list[int]:
        """Take over the recovered live requests and fingerprints; the ids to restore, newest first."""
        for rid, (_state, data, fp) in recovered.requests.items():
            # in-flight requests are pending again: they will be re-fetched
            self.live[rid] = Entry("p", data, fp, None, flushed=True)
        self.seen = set(recovered.fingerprints)
        self.start_seen = set(recovered.start_fingerprints)
        if self.filtering:
            self.restored_seen = frozenset(self.seen)
        self.restored_start = frozenset(self.start_seen)
        self.next_id = recovered.next_id
        return sorted(recovered.requests, reverse=True)  # pop() from the end: oldest first

    @property
    def filters_restored(self) -> bool:
        """Whether :meth:`admit` has anything to refuse."""
        return bool(self.restored_seen or self.restored_start)

    # --- lifecycle events ---------------------------------------------------------------

    def admit(self, request: Request) -> bool:
        """False for what the runs before the resume already crawled."""
        if request in self.by_request:  # a restored request, or one we track coming back
            return True
        start = bool(request.meta.get("is_start_request"))
        if request.dont_filter and not start:
            return True
        fp = self.fingerprint(request)
        return not (fp in self.restored_seen or (start and fp in self.restored_start))

    def enqueued(self, request: Request, accepted: bool) -> None:
        rid = self.by_request.get(request)
        if rid is not None:  # the same object again (a delayed request released, a reschedule)
            if accepted:
                self.requeued(rid, request)
            else:
                self.finish(rid)
        elif accepted:
            self.new_request(request)

    def held(self, request: Request) -> None:
        rid = self.by_request.get(request)
        if rid is not None:
            self.requeued(rid, request)
        else:
            self.new_request(request)

    def requeued(self, rid: int, request: Request) -> None:
        entry = self.live[rid]
        entry.state = "p"
        if not self.restoring:
            data = self.serialise(request)
            if data is not None and data != entry.data:
                entry.data = data
                if entry.flushed:
                    self._changed.append(rid)

    def new_request(self, request: Request) -> None:
        fp = None
        if self.filtering:
            start = bool(request.meta.get("is_start_request"))
            if not request.dont_filter or start:
                fp_bytes = self.fingerprint(request)
                if start and fp_bytes not in self.start_seen:
                    self.start_seen.add(fp_bytes)
                    self._start_new.append(fp_bytes.hex())
                if not request.dont_filter:
                    self.seen.add(fp_bytes)
                    fp = fp_bytes.hex()
        self._track(request, fp)

    def _track(self, request: Request, fp: str | None) -> None:
        data = self.serialise(request)
        if data is None:
            if fp is not None:
                self._new.append((0, fp))  # keep the fingerprint, like the duplicate filter does
            return
        rid = self.next_id
        self.next_id += 1
        self.live[rid] = Entry("p", data, fp, request, flushed=False)
        self.by_request[request] = rid
        self._new.append((rid, fp))

    def restored(self, rid: int, request: Request) -> None:
        """A recovered request rebuilt and about to be crawled again."""
        self.live[rid].request = request
        self.by_request[request] = rid

    def popped(self, request: Request) -> None:
        rid = self.by_request.get(request)
        if rid is not None:
            entry = self.live[rid]
            entry.state = "f"
            if entry.flushed:
                self._popped.append(rid)

    def finished(self, request: Request) -> None:
        rid = self.by_request.get(request)
        if rid is not None and self.live[rid].state == "f":
            self.finish(rid)

    def finish(self, rid: int) -> None:
        entry = self.live.pop(rid)
        if entry.request is not None:
            self.by_request.pop(entry.request, None)
        if entry.flushed:
            self._done.append(rid)

    # --- what the commit writes ---------------------------------------------------------

    def take_changes(self) -> list[str]:
        """Journal records for requests scheduled, changed and popped since the last call
        (new requests before anything that refers to them)."""
        payloads: list[str] = []
        live = self.live
        for rid in self._changed:
            entry = live.get(rid)
            if entry is not None:
                payloads.append(records.live_record(rid, entry.state, entry.fp, entry.data))
        for rid, fp in self._new:
            entry = live.get(rid)
            if entry is not None:
                entry.flushed = True
                payloads.append(records.live_record(rid, entry.state, fp, entry.data))
            elif fp is not None:
                self._seen_done.append(fp)
        payloads += [records.start_seen_record(fp) for fp in self._start_new]
        payloads += [records.in_flight_record(rid) for rid in self._popped if rid in live]
        self._new, self._changed, self._popped, self._start_new = [], [], [], []
        return payloads

    def has_done(self) -> bool:
        return bool(self._done or self._seen_done)

    def take_done(self) -> tuple[list[int], list[str]]:
        """Ids finished and fingerprints seen-and-finished since the last call (for a "D" record)."""
        done, seen = self._done, self._seen_done
        self._done, self._seen_done = [], []
        return done, seen

    # --- inspect ------------------------------------------------------------------------

    def requests(self) -> list[tuple[int, str, str]]:
        """``(id, state, JSON)`` of every live request (for a snapshot)."""
        return [(rid, e.state, e.data) for rid, e in self.live.items()]

    def pending_by_domain(self) -> dict[str, int]:
        """Live requests per host."""
        counts: dict[str, int] = {}
        for entry in self.live.values():
            if entry.request is not None:
                host = urlparse_cached(entry.request).hostname or ""
            else:
                host = urlparse(json.loads(entry.data).get("url", "")).hostname or ""
            counts[host] = counts.get(host, 0) + 1
        return counts


def entry_url(entry: Entry) -> tuple[str, Any]:
    """The URL and the decoded JSON of a stored request (None when it is not JSON)."""
    try:
        data = json.loads(entry.data)
    except ValueError:
        data = None
    return (str(data.get("url", "")) if isinstance(data, dict) else ""), data
