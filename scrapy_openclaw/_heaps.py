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
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator

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
