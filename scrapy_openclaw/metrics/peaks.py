"""The busiest 1 s and 5 s of requests sent to a domain, from send times that arrive out of order.

A request's send time is known only when it comes back (its answer's
``download_latency`` says how long ago it left), so send times arrive out of
order, by up to a download timeout; :class:`Peaks` keeps them in bins until
they are final.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

RESOLUTION = 0.01  # seconds per bin
WINDOWS = (1.0, 5.0)  # seconds


def _width(window: float) -> int:
    return int(round(window / RESOLUTION))


def sliding_max(bins: Mapping[int, int], width: int) -> int:
    """Most events in *width* consecutive bins."""
    keys = sorted(k for k, n in bins.items() if n)
    best = total = lo = 0
    for key in keys:
        total += bins[key]
        while key - keys[lo] >= width:
            total -= bins[keys[lo]]
            lo += 1
        best = max(best, total)
    return best


class Peaks:
    """Per-domain send-time bins and the busiest window of each length seen so far.

    Send times are counted in 10 ms bins. A bin range older than the *horizon* can no
    longer change, so the sliding maxima over it are final and its bins can go, which
    keeps the memory to the bins of the last horizon. The maxima are those of half-open
    windows ``[t, t+w)``, as the chaos site counts them.
    """

    __slots__ = ("bins", "best", "fresh")

    def __init__(self, shared: bool = False) -> None:
        self.bins: Counter[int] = Counter()
        self.best: dict[float, int] = dict.fromkeys(WINDOWS, 0)
        #: with *shared* (several workers' sends add up elsewhere): the bins not handed on yet
        self.fresh: Counter[int] | None = Counter() if shared else None

    def add(self, sent_at: float, n: int = 1) -> None:
        key = int(sent_at / RESOLUTION)
        self.bins[key] += n
        if self.fresh is not None:
            self.fresh[key] += n

    def take_fresh(self) -> Counter[int]:
        """The bins added since the last call (for a shared count: every worker's sends)."""
        fresh = self.fresh if self.fresh is not None else Counter()
        self.fresh = Counter()
        return fresh

    def merge_bins(self, bins: Iterable[tuple[int, int]]) -> None:
        for key, n in bins:
            self.bins[int(key)] += int(n)

    def settle(self, before: float) -> None:
        """Make the maxima of every window ending before *before* final and drop bins no
        window still open needs (those older than *before* less the longest window)."""
        if not self.bins:
            return
        self._update()
        keep_from = int(before / RESOLUTION) - _width(max(WINDOWS))
        for key in [k for k in self.bins if k < keep_from]:
            del self.bins[key]

    def _update(self) -> None:
        for window in WINDOWS:
            self.best[window] = max(self.best[window], sliding_max(self.bins, _width(window)))

    def peak(self, window: float) -> int:
        """The busiest *window* seconds so far (the bins still kept included)."""
        self._update()
        return self.best[window]
