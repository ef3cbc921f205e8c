"""A worker's items on their way to Redis, once each, with their page's acknowledgement.

``pipelines.RedisItemPipeline`` hands each item to the queue with the lease of its page;
the items wait for the page to finish and go to Redis in the round that acknowledges it,
with a mark of the page, in one script (``lua/items.lua``), so a page fetched again after a
worker died is not written twice. On one Redis the items go in the same pipeline as the
acknowledgement; on a cluster (the items list lives on one node, the page on another) the
acknowledgement waits for the round after the items are in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scrapy_openclaw.exceptions import OpenClawConfigError


def marks_key(items_key: str) -> str:
    """The hash of pages whose items are in *items_key*: in its cluster slot (the same hash tag).

    Redis Cluster hashes the text between the first ``{`` and the next ``}`` when it is not
    empty, the whole name otherwise; a name with a ``}`` but no such tag cannot be given one.
    """
    start = items_key.find("{")
    end = items_key.find("}", start + 1) if start != -1 else -1
    if end > start + 1:  # (a tag decides the slot: keep it first)
        return f"{items_key}:written"
    if "}" in items_key:
        raise OpenClawConfigError(
            f"setting REDIS_ITEMS_KEY: the items list {items_key!r} has a '}}' but no hash tag, so no "
            "key can share its Redis Cluster slot; use a name without braces, or with a tag ('{crawl}:items')"
        )
    return f"{{{items_key}}}:written"


@dataclass
class ItemWrite:
    """Items for one list: of one page (*page*: its lease id, the mark), or of none ("")."""

    key: str
    page: str
    payloads: list[str] = field(default_factory=list)
    #: its mark may go without an acknowledgement of its own: a failover's replay (the page's
    #: ack is replayed too), or a page acknowledged by the push of a copy the callback yielded
    acked: bool = False


class PageItems:
    """The items of this worker's pages until Redis has them (the reactor thread's).

    ``attached``: a held page's items, until the page is finished; ``pending``: writes for the
    next round; ``forget``: marks to remove. A page's mark is removed once its acknowledgement
    counted (``acked``) and its write left the writes a failover's replay would send again
    (``aged``, ``batching.REPLAY_WINDOW``): a mark removed before would let a replayed write
    in twice.
    """

    def __init__(self) -> None:
        self.attached: dict[str, list[tuple[str, str]]] = {}
        self.pending: list[ItemWrite] = []
        self.forget: dict[str, set[str]] = {}  # items key -> pages
        self._unacked: dict[str, str] = {}  # page -> items key: written, its ack not counted yet
        self._replayable: set[str] = set()  # pages whose write a replay would send again
        self._done: dict[str, str] = {}  # page -> items key: acknowledged, still replayable

    def attach(self, page: str, key: str, payload: str) -> None:
        self.attached.setdefault(page, []).append((key, payload))

    def loose(self, key: str, payload: str) -> None:
        """An item of no page this worker holds: written with the next round, without a mark."""
        if self.pending and self.pending[-1].key == key and not self.pending[-1].page:
            self.pending[-1].payloads.append(payload)
        else:
            self.pending.append(ItemWrite(key, "", [payload]))

    def finish(self, page: str, *, acked: bool = False) -> None:
        """The page is finished: its items go with the next round (before its acknowledgement)."""
        by_key: dict[str, ItemWrite] = {}
        for key, payload in self.attached.pop(page, ()):
            by_key.setdefault(key, ItemWrite(key, page, acked=acked)).payloads.append(payload)
        self.pending += by_key.values()

    def discard(self, page: str) -> None:
        """The page goes back to the queue unfinished: its items come again with its next fetch."""
        self.attached.pop(page, None)

    def owed(self) -> bool:
        return bool(self.pending or self.forget)

    def take(self) -> tuple[list[ItemWrite], dict[str, list[str]]]:
        """A round's writes and the marks it forgets."""
        return list(self.pending), {key: sorted(pages) for key, pages in self.forget.items() if pages}

    def confirmed(self, writes: list[ItemWrite], forgot: dict[str, list[str]], again: set[str]) -> int:
        """Redis has *writes* (the pages in *again* had theirs written before) and forgot *forgot*;
        the number of items written."""
        sent = {id(w) for w in writes}
        self.pending = [w for w in self.pending if id(w) not in sent]
        for key, pages in forgot.items():
            left = self.forget.get(key, set()).difference(pages)
            if left:
                self.forget[key] = left
            else:
                self.forget.pop(key, None)
        n = 0
        for write in writes:
            if write.page:
                self._replayable.add(write.page)
                if write.acked:
                    self._done[write.page] = write.key
                else:
                    self._unacked[write.page] = write.key
            if write.page not in again:
                n += len(write.payloads)
        return n

    def acked(self, pages: list[str], missed: set[str]) -> None:
        """These pages' acknowledgements reached Redis; those in *missed* did not count (another
        worker holds the page now: its mark stays, for that worker's items to find)."""
        for page in pages:
            key = self._unacked.pop(page, None)
            if key is None or page in missed:
                continue
            if page in self._replayable:
                self._done[page] = key
            else:
                self._forget(key, page)

    def aged(self, writes: list[ItemWrite]) -> None:
        """These writes left the replay window: a replay no longer sends them."""
        for write in writes:
            self._replayable.discard(write.page)
            key = self._done.pop(write.page, None)
            if key is not None:
                self._forget(key, write.page)

    def forget_now(self) -> None:
        """The worker leaves the crawl: the marks of its acknowledged pages go with its last round."""
        for page, key in self._done.items():
            self._forget(key, page)
        self._done.clear()
        self._replayable.clear()

    def replay(self, writes: list[ItemWrite]) -> None:
        """Writes a failed-over Redis may have lost: again, before anything newer (their acks are
        replayed too)."""
        self.pending[:0] = [ItemWrite(w.key, w.page, w.payloads, acked=True) for w in writes]

    def _forget(self, key: str, page: str) -> None:
        self.forget.setdefault(key, set()).add(page)
