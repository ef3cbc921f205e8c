"""Item pipelines that write themselves, and the output states a checkpoint records.

:func:`durable_writer` opts a pipeline into exactly-once output (the
:class:`DurableWriter` hooks); :func:`parse_outputs` validates the feed and
writer states read back from a checkpoint file, which is untrusted input.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from scrapy_openclaw import runtime

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

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
        if ok and key.startswith(("feed:", "next:")):
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
