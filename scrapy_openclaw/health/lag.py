"""CrawlerLag: how long the crawler's own event loop ran late, so its slowness is not read as a site's.

Download latencies and delivered rates are measured on the event loop. While the
crawler is busy (a slow callback, a garbage-collection pause, a machine whose
cores are taken), an answer that has arrived waits for it: the reading grows with
the crawler's trouble, not the site's. A short looping call notes how late each
of its ticks ran; the health registry subtracts the stall time inside a
reading's span before it judges the site by it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

#: how often the loop is sampled, seconds (a stall shorter than this is noise to it)
TICK = 0.05
#: a tick this late or less is the loop's ordinary jitter, not a stall
_NOISE = 0.005
#: seconds of stalls kept (longer than any latency the registry judges)
_HORIZON = 30.0
#: a crawl whose loop stalled this share of a period is reported as busy (once)
BUSY_SHARE = 0.25
_PERIOD = 10.0


class CrawlerLag:
    """The event loop's stalls over the last ``_HORIZON`` seconds, on the registry's clock."""

    def __init__(
        self, clock: Any = time.time, tick: float = TICK, on_busy: Callable[[float, float], None] | None = None
    ):
        self.clock = clock
        self.tick = tick
        #: called once, the first time the loop stalls ``BUSY_SHARE`` of a ``_PERIOD``: (share, seconds)
        self.on_busy = on_busy
        self._period_start: float | None = None
        self._period_stalled = 0.0
        self._stalls: deque[tuple[float, float]] = deque()  # (start, end) of each late stretch
        self._expected: float | None = None
        self._loop: Any = None
        self.worst = 0.0  # the longest stall, seconds
        self.total = 0.0  # seconds stalled in all

    def start(self) -> None:
        from scrapy.utils.asyncio import create_looping_call

        self._expected = self.clock() + self.tick
        self._loop = create_looping_call(self._sample)
        self._loop.start(self.tick, now=False)

    def stop(self) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None

    def _sample(self) -> None:
        now = self.clock()
        if self._expected is not None:
            self._period_stalled += max(0.0, self.note(self._expected, now))
        self._expected = now + self.tick
        if self._period_start is None:
            self._period_start = now
        elif now - self._period_start >= _PERIOD:
            share = self._period_stalled / (now - self._period_start)
            if share >= BUSY_SHARE and self.on_busy is not None:
                self.on_busy(share, now - self._period_start)
                self.on_busy = None  # (said once a crawl)
            self._period_start, self._period_stalled = now, 0.0

    def note(self, due: float, ran: float) -> float:
        """A tick due at *due* ran at *ran*: the loop was busy in between (returns the stall)."""
        late = ran - due
        if late <= _NOISE:
            late = 0.0
        else:
            self._stalls.append((due, ran))
            self.total += late
            self.worst = max(self.worst, late)
        while self._stalls and self._stalls[0][1] < ran - _HORIZON:
            self._stalls.popleft()
        return late

    def stalled(self, since: float, until: float) -> float:
        """Seconds the loop was stalled between *since* and *until* (the stall still under way
        included: a reading taken right after one may run before the late tick that notes it)."""
        due = self._expected
        total = max(0.0, until - max(due, since)) if due is not None and until - due > _NOISE else 0.0
        for start, end in reversed(self._stalls):
            if end <= since:
                break
            total += max(0.0, min(end, until) - max(start, since))
        return total
