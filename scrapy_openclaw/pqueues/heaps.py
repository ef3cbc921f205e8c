"""The per-domain request store behind :class:`~scrapy_openclaw.pqueues.DeadlinePriorityQueue`.

Why this shape
==============

Effective priority of a pending request at time ``t``::

    e(t) = p                                   no deadline
    e(t) = max(p, B + (t - D) * B / W + p)     deadline D, aging window W, boost B
         = max(p, B + (t - k) * B / W)         with the static key k = D - p * W / B

i.e. from ``D - W`` on, the request gains ``B`` priority points over the
window, linearly, and at ``D`` the expired policy takes over (front of the
queue, or dead letter). The aging line has the same slope ``B / W`` for every
request of a domain (``W`` is a per-domain policy, ``B`` a crawl setting), so
the order of the lines never changes as time passes: a heap keyed by the
static "virtual time" ``k`` always has the request with the highest line on
top. And since ``e`` is the *max* of the static priority and the line, the
request with the highest ``e`` is either the top of the priority buckets or
the top of the aging heap; comparing those two at pop time is exact.

So a deadline request is indexed twice (bucket and aging heap) and once more in
the queue's global expiry heap (keyed by ``D``); whichever index hands it out
first marks the shared :class:`Timed` entry dead, and the other copies are
skipped lazily when they reach a top. Requests without a deadline (the common
case) sit only in a bucket: a deque per priority, exactly like Scrapy's own
``ScrapyPriorityQueue`` + memory queue, so they cost one deque slot each and
keep Scrapy's LIFO/FIFO order within a priority. Push and pop are O(log n).

Across domains, :class:`DomainIndex` keeps each domain with pending work in
three heaps by its top request in each index (bucket priority, aging key per
aging slope, expired deadline) and a round-robin rank. A pop compares the
tops of those heaps, so it costs O(log domains), not a scan. A change to a
domain's tops makes a new entry and leaves the old one behind, to be dropped
when it surfaces (lazy deletion).
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from scrapy import Request

#: Score tiers: an expired request boosted to the front beats any priority.
TIER_EXPIRED = 2
TIER_NORMAL = 1


class Timed:
    """A deadline-carrying request; shared by the bucket, aging and expiry indexes."""

    __slots__ = ("deadline", "live", "owner", "request", "seq")

    def __init__(self, request: Request, deadline: float, seq: int, owner: DomainQueue):
        self.request = request
        self.deadline = deadline
        self.seq = seq
        self.owner = owner
        self.live = True


def _is_dead(item: Any) -> bool:
    return type(item) is Timed and not item.live


class DomainQueue:
    """The pending requests of one domain (download slot)."""

    __slots__ = (
        "_best",
        "aging",
        "entries",
        "parked",
        "rank",
        "boost",
        "buckets",
        "count",
        "domain",
        "expired",
        "expired_mode",
        "lifo",
        "prios",
        "slope",
        "start_lifo",
    )

    def __init__(
        self,
        domain: str,
        *,
        window: float,
        boost: float,
        expired_mode: str,
        lifo: bool,
        start_lifo: bool,
    ):
        self.domain = domain
        self.boost = boost
        self.slope = boost / window  # priority points gained per second of aging
        self.expired_mode = expired_mode
        self.lifo = lifo
        self.start_lifo = start_lifo
        # bucket key (-priority, 1 for start requests else 0) -> deque of Request | Timed
        self.buckets: dict[tuple[int, int], deque[Any]] = {}
        self.prios: list[tuple[int, int]] = []  # heap of bucket keys
        self.aging: list[tuple[float, int, Timed]] = []  # heap by static key k
        self.expired: deque[Timed] = deque()  # boosted, in deadline order
        self.count = 0  # live requests
        self._best: Any = None  # cached best() while only buckets hold requests
        # the DomainIndex's bookkeeping: its current entry per index (None: not indexed), why
        # the queue parked the domain (None: not parked), the round-robin rank (lower: sooner)
        self.entries: list[Any] | None = None
        self.parked: Any = None
        self.rank = 0

    def __len__(self) -> int:
        return self.count

    def push(self, request: Request, *, start: bool, timed: Timed | None = None) -> None:
        key = (-request.priority, 1 if start else 0)
        bucket = self.buckets.get(key)
        if bucket is None:
            bucket = self.buckets[key] = deque()
            heapq.heappush(self.prios, key)
        bucket.append(request if timed is None else timed)
        self._best = None
        if timed is not None:
            static_key = timed.deadline - request.priority / self.slope
            heapq.heappush(self.aging, (static_key, timed.seq, timed))
        self.count += 1

    # --- tops (dead entries are dropped as they surface) --------------------

    def _bucket_top(self) -> tuple[tuple[int, int], deque[Any], bool] | None:
        while self.prios:
            key = self.prios[0]
            bucket = self.buckets[key]
            lifo = self.start_lifo if key[1] else self.lifo
            while bucket and _is_dead(bucket[-1] if lifo else bucket[0]):
                if lifo:
                    bucket.pop()
                else:
                    bucket.popleft()
            if bucket:
                return key, bucket, lifo
            heapq.heappop(self.prios)
            del self.buckets[key]
        return None

    def _aging_top(self) -> tuple[float, int, Timed] | None:
        while self.aging and not self.aging[0][2].live:
            heapq.heappop(self.aging)
        return self.aging[0] if self.aging else None

    def _expired_top(self) -> Timed | None:
        while self.expired and not self.expired[0].live:
            self.expired.popleft()
        return self.expired[0] if self.expired else None

    def best(self, now: float) -> tuple[tuple[int, float, int], str] | None:
        """The score of the request :meth:`take` would return, and where it sits.

        Scores compare across domains: higher is more urgent; at equal
        priority a start request ranks below other requests (Scrapy's order).
        """
        if self.count <= 0:
            return None
        if self._best is not None:
            return self._best
        entry = self._expired_top()
        if entry is not None:
            return (TIER_EXPIRED, -entry.deadline, 0), "expired"
        top = self._bucket_top()
        best = None
        if top is not None:
            key = top[0]
            best = ((TIER_NORMAL, float(-key[0]), -key[1]), "bucket")
        aging = self._aging_top()
        if aging is not None:
            line = self.boost + (now - aging[0]) * self.slope
            if best is None or line > best[0][1]:
                best = ((TIER_NORMAL, line, 0), "aging")
        elif not self.expired:
            self._best = best  # static until the next push or take
        return best

    def take(self, where: str, *, remove: bool = True) -> Request:
        """Hand out (or with ``remove=False`` only show) the top request of *where*."""
        item: Any
        if remove:
            self._best = None
        if where == "expired":
            item = self.expired[0]
            if remove:
                self.expired.popleft()
        elif where == "aging":
            item = self.aging[0][2]
            if remove:
                heapq.heappop(self.aging)
        else:
            top = self._bucket_top()
            assert top is not None
            _, bucket, lifo = top
            item = bucket[-1] if lifo else bucket[0]
            if remove:
                if lifo:
                    bucket.pop()
                else:
                    bucket.popleft()
        if remove:
            if type(item) is Timed:
                item.live = False
            self.count -= 1
        return item.request if type(item) is Timed else item

    def boost_expired(self, entry: Timed) -> None:
        """Send a live deadline entry whose deadline passed to the front."""
        self.expired.append(entry)
        self._best = None

    def discard(self, entry: Timed) -> None:
        """Forget a live deadline entry (dropped as expired); its copies die lazily."""
        entry.live = False
        self.count -= 1
        self._best = None

    def requests(self) -> Iterator[Request]:
        """Every live request, in no particular order (for persistence and state)."""
        for bucket in self.buckets.values():
            for item in bucket:
                if type(item) is Timed:
                    if item.live:
                        yield item.request
                else:
                    yield item


#: DomainQueue.entries positions (and the ``where`` of :meth:`DomainQueue.take`).
_BUCKET, _AGING, _EXPIRED = 0, 1, 2
_WHERE = ("bucket", "aging", "expired")


class DomainIndex:
    """The domains with pending work, by urgency: the most urgent in O(log domains).

    Urgency is what a scan over :meth:`DomainQueue.best` would compare:
    ``(score, -busy, -rank)``, busy being the slot's active downloads. Entries
    are immutable tuples ``(static key..., rank, seq, dq)``, live while
    ``dq.entries[index] is entry``; the queue re-keys a domain whenever its
    tops or rank change, so a live entry is always exact. Busy changes with
    no event the queue sees, so it is not in the key: among the entries that
    tie on the top score (a subtree at the heap's root), the pick walks them
    in rank order and stops at the first idle domain. Only domains with
    active downloads are walked past, so this stays cheap however many
    domains tie.
    """

    def __init__(self) -> None:
        self.buckets: list[tuple[Any, ...]] = []  # (-priority, start, rank, seq, dq)
        self.aging: dict[float, list[tuple[Any, ...]]] = {}  # slope -> heap of (k, rank, seq, dq)
        self.expired: list[tuple[Any, ...]] = []  # (deadline, rank, seq, dq)
        self.size = 0  # domains indexed
        self._seq = itertools.count()

    def __len__(self) -> int:
        return self.size

    @staticmethod
    def _scores(dq: DomainQueue) -> tuple[Any, Any, Any]:
        """The domain's static key in each index (None: nothing there)."""
        bucket = dq._bucket_top()
        aging = dq._aging_top()
        expired = dq._expired_top()
        return (
            bucket[0] if bucket is not None else None,
            aging[0] if aging is not None else None,
            expired.deadline if expired is not None else None,
        )

    def key(self, dq: DomainQueue, *, force: bool = False) -> None:
        """(Re)index *dq* under its current tops; *force*: also when only its rank changed."""
        entries = dq.entries
        if entries is None:
            entries = dq.entries = [None, None, None]
            self.size += 1
            force = True
        for index, score in enumerate(self._scores(dq)):
            old = entries[index]
            if score is None:
                entries[index] = None
                continue
            if not force and old is not None and _static(old, index) == score:
                continue
            seq = next(self._seq)
            if index == _BUCKET:
                entry: tuple[Any, ...] = (score[0], score[1], dq.rank, seq, dq)
                heap = self.buckets
            else:
                entry = (score, dq.rank, seq, dq)
                heap = self.aging.setdefault(dq.slope, []) if index == _AGING else self.expired
            entries[index] = entry
            if heap and heap[0] is old:  # (the domain just served: one sift instead of two)
                heapq.heapreplace(heap, entry)
            else:
                heapq.heappush(heap, entry)
            if len(heap) > 2 * self.size + 64:
                _compact(heap, index)

    def unkey(self, dq: DomainQueue) -> None:
        """Take *dq* out (its entries die where they lie)."""
        if dq.entries is not None:
            dq.entries = None
            self.size -= 1

    def _heaps(self) -> Iterator[tuple[int, list[tuple[Any, ...]]]]:
        yield _EXPIRED, self.expired
        yield _BUCKET, self.buckets
        for heap in self.aging.values():
            yield _AGING, heap

    def pick(self, now: float, busy_of: Callable[[str], int]) -> tuple[DomainQueue, str] | None:
        """The most urgent indexed domain and where its top request sits."""
        best: tuple[Any, ...] | None = None
        for index, heap in self._heaps():
            while heap and not _live(heap[0], index):
                heapq.heappop(heap)
            if not heap:
                continue
            top = heap[0]
            if index == _BUCKET:
                score: tuple[Any, ...] = (TIER_NORMAL, float(-top[0]), -top[1])
            elif index == _AGING:
                dq = top[-1]
                score = (TIER_NORMAL, dq.boost + (now - top[0]) * dq.slope, 0)
            else:
                score = (TIER_EXPIRED, -top[0], 0)
            if best is None or score > best[0]:  # (a tie: the bucket, as DomainQueue.best)
                best = (score, index, heap)
        if best is None:
            return None
        _, index, heap = best
        return _least_busy(heap, index, busy_of), _WHERE[index]

    def entries_total(self) -> int:
        """Heap entries held, live or stale (for memory reporting)."""
        return len(self.buckets) + len(self.expired) + sum(len(h) for h in self.aging.values())


def _live(entry: tuple[Any, ...], index: int) -> bool:
    entries = entry[-1].entries
    return entries is not None and entries[index] is entry


def _static(entry: tuple[Any, ...], index: int) -> Any:
    """The static key an entry was made for (entries end in ``rank, seq, dq``)."""
    return entry[0:2] if index == _BUCKET else entry[0]


def _least_busy(heap: list[tuple[Any, ...]], index: int, busy_of: Callable[[str], int]) -> DomainQueue:
    """Among the live entries tying with the root's static key: the fewest active downloads,
    then the lowest rank. Best-first over the root's subtree of ties, in rank order, so the
    first idle domain ends the walk."""
    static = _static(heap[0], index)
    frontier = [(heap[0][-3], 0)]
    best: tuple[int, int, DomainQueue] | None = None
    size = len(heap)
    while frontier:
        rank, i = heapq.heappop(frontier)
        entry = heap[i]
        if _live(entry, index):
            dq = entry[-1]
            busy = busy_of(dq.domain)
            if best is None or (busy, rank) < best[:2]:
                best = (busy, rank, dq)
            if busy == 0:
                break
        for child in (2 * i + 1, 2 * i + 2):
            if child < size and _static(heap[child], index) == static:
                heapq.heappush(frontier, (heap[child][-3], child))
    assert best is not None  # the root is live
    return best[2]


def _compact(heap: list[tuple[Any, ...]], index: int) -> None:
    """Drop the stale entries of *heap* (in place): they never outnumber the live ones for long."""
    heap[:] = [e for e in heap if _live(e, index)]
    heapq.heapify(heap)
