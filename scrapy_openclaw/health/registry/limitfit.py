"""The rate limit a domain's answers prove, fitted as a token bucket (Lindley's recursion).

A site that limits with a token bucket (rate r, burst b) answers while it has a
token and 429 when it has none. The tokens it lacks, W, follow Lindley's
recursion: W falls by r per second (never below 0) and rises by 1 per answer;
so W <= b at every answer and W > b - 1 at every 429. Replayed over a domain's
history with a candidate rate, the recursion gives M (the largest W at an
answer) and m (the smallest W at a 429): the candidate is consistent when a
burst fits between them, M < m + 1. The largest consistent rate is the limit
(within a per cent or two once two 429 episodes are in the history).

Why not only the 2xx rate over the last second or two (a cut's first reading,
and the guide of the search here): at a 429 that window still holds the burst
the bucket had saved, and on a plateau above the limit it reads the client's
own pace, so a limit learned from it alone sat a few per cent over the real one
and the next 429 came ~10 s later. At the end of the probe that follows slow
start's cut, while the pace was still rising, it reads up to ~10% low. So a
fit, when there is one, replaces the window's reading.

The history is kept from the domain's first answer (its bucket was full then:
the recursion's W = 0 start), bounded to the last ``_FIT_HORIZON`` seconds; once
trimmed, the 429s of its first ``_FIT_BURN_IN`` seconds are not judged (W's
start there is a guess until a hold refills the bucket). A history begun again
where a hold has just refilled the bucket (:meth:`LimitHistory.refilled`) knows
its start and is judged at once. A history that holds no
429 when it is trimmed is dropped, and an older domain starts one only at a 429:
a healthy domain costs nothing here after its first minute. The Lua port is
``h_fit`` in ``distributed/lua/health.lua``; the parity test drives both.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable

from scrapy_openclaw.health.registry.tuning import (
    _FIT_BIN,
    _FIT_BURN_IN_BINS,
    _FIT_EPISODE_BINS,
    _FIT_HIGH,
    _FIT_HORIZON_BINS,
    _FIT_LOW,
    _FIT_REFINE,
    _FIT_STEP,
    _FIT_WHOLE_BIN_DRAIN,
    _FIT_WHOLE_BISECT,
    _FIT_WHOLE_BURSTS,
    _FIT_WHOLE_RANGE,
    _FIT_WHOLE_SLACK,
)

HORIZON_BINS, BURN_IN_BINS, EPISODE_BINS = _FIT_HORIZON_BINS, _FIT_BURN_IN_BINS, _FIT_EPISODE_BINS
#: What an answer adds to the history: a token taken, a 429, or nothing ("").
NOTE_ANSWER = "a"
NOTE_429 = "r"


def measures_limit(status: int | None, retry_after: float | None) -> bool:
    """Whether a refusal is a limiter's "none left": a 429, or a 503 that says when to come
    back (a 503 without Retry-After is a site in trouble, and says nothing of its bucket)."""
    return status == 429 or (status == 503 and retry_after is not None)


def note_kind(status: int | None, retry_after: float | None = None) -> str:
    """An answer took a token, whatever its status, but a limiter's refusal (none left, see
    :func:`measures_limit`) and a plain 503; no answer is no event."""
    if status is None:
        return ""
    if measures_limit(status, retry_after):
        return NOTE_429
    return "" if status == 503 else NOTE_ANSWER


def sent_at(now: float, latency: float | None) -> float:
    """When a request answered at *now* was sent (the site's bucket judged it then, not when
    the answer came back after its download latency)."""
    if latency is None or not math.isfinite(latency) or latency <= 0:
        return now
    return now - latency


def fit_bin(at: float, born: float) -> int:
    """The history bin of time *at* for a domain first seen at *born* (never negative)."""
    return max(0, math.floor((at - born) / _FIT_BIN))


def _bin_of(event: int) -> int:
    """The bin of a history event (an answer's bin, or ``-bin - 1`` for a 429)."""
    return event if event >= 0 else -event - 1


class LimitHistory:
    """A domain's answers and 429s since *start* (a bin): one int per event, its bin for an
    answer that took a token, ``-bin - 1`` for a 429."""

    __slots__ = ("events", "full", "start")

    def __init__(self, index: int = 0) -> None:
        # 0: the history reaches back to the domain's first answer; a domain older than the
        # horizon (its history dropped, or forgotten by a resume) starts one at a 429, as if
        # trimmed there
        self.start = 0 if index < HORIZON_BINS else index
        self.events = array("q")
        self.full = False  # begun where a hold had just refilled the bucket (see refilled)

    def note(self, index: int, answered: bool) -> bool:
        """Add an event at bin *index*; trim to the horizon when half as long again. False when
        the trimmed history holds no 429: nothing to fit, the caller drops it (a healthy
        domain costs no history after its first seconds). An event before the start of a
        history begun at a refilled bucket (a request sent before that hold) is left out."""
        if self.full and index < self.start:
            return True
        self.events.append(index if answered else -index - 1)
        if index - self.start > 3 * HORIZON_BINS // 2:
            start = index - HORIZON_BINS
            self.events = array("q", (e for e in self.events if _bin_of(e) >= start))
            self.start, self.full = start, False
            return any(e < 0 for e in self.events)
        return True

    def restart(self, index: int) -> None:
        """Begin again at bin *index*, as if trimmed there (its first ``_FIT_BURN_IN`` seconds'
        429s not judged): the limit moved, and what came before is another bucket's history
        (replayed together, no single rate explains both, and the least wrong one is no fit)."""
        self.start = max(1, index)
        self.events = array("q")
        self.full = False

    def refilled(self, index: int) -> None:
        """Begin again at bin *index*, where a hold has just refilled the bucket: W = 0 is known
        there, not guessed, so its 429s are judged at once. The events already noted from
        *index* on are kept (a limit that fell is fitted from the hold after its first refusal
        under the old limit: see :func:`.pacing.begin_after_fall`)."""
        self.start = max(1, index)
        self.events = array("q", (e for e in self.events if _bin_of(e) >= self.start))
        self.full = True

    def fit(self, guess: float, top: float = 0.0) -> float | None:
        """The largest rate consistent with the history near *guess* (the 2xx window's
        reading: high by the burst on a plateau, low while the pace rose): searched from
        ``_FIT_STEP**_FIT_LOW`` to ``_FIT_STEP**_FIT_HIGH`` x *guess*, or up to *top* (the
        pace at the 429: the client sent no faster) when that is higher. None without two
        429 episodes to judge, or when the best fit is at either end of that range (the
        guess was no guide).

        Consistent: a slack under 1, or, when timing noise leaves none, no more than the
        least found; the rates from the least-slack one up to the first that is not. On a
        history begun at a refilled bucket (:meth:`refilled`), the geometric middle of the
        consistent rates under that one (down to half of it): soon after its start, few
        answers leave a wide range, and its top is loose. Otherwise, up to 20 req/s, the top
        (for a first fit, the middle) of the band under it where a whole burst explains the
        history (:meth:`_whole`).
        """
        episodes = self._episodes()
        if episodes < 2:
            return None
        high = _FIT_HIGH
        if top > guess * _FIT_STEP**_FIT_HIGH:  # (a small bucket refuses as soon as the pace passes it)
            high = math.ceil(math.log(top / guess) / math.log(_FIT_STEP))
        rates = [guess * _FIT_STEP**k for k in range(_FIT_LOW, high + 1)]
        slacks = [self._slack(rate) for rate in rates]
        least = min(slacks)
        best = slacks.index(least)
        if least == math.inf or best in (0, len(slacks) - 1):
            return None
        top = best
        while top + 1 < len(slacks) and (slacks[top + 1] < 1.0 or slacks[top + 1] <= least):
            top += 1
        if self.full and top == len(slacks) - 1:
            return None  # (consistent up to the pace itself: too few answers yet to bound it)
        a = rates[top]
        b = a * _FIT_STEP
        for _ in range(_FIT_REFINE):
            c = (a + b) / 2
            slack = self._slack(c)
            if slack < 1.0 or slack <= least:
                a = c
            else:
                b = c
        if not self.full:
            if a * _FIT_BIN > _FIT_WHOLE_BIN_DRAIN:  # (bins too coarse to tell whole bursts apart)
                return a
            return self._whole(a, middle=episodes == 2)
        low = a
        while low > a / 2 and self._slack(low / _FIT_STEP) < 1.0:
            low /= _FIT_STEP
        return math.sqrt(low * a)

    def _whole(self, a: float, middle: bool) -> float:
        """The highest band of rates under *a* at which a whole burst explains the history (a
        site's bucket holds a whole number of requests), to ``_FIT_WHOLE_SLACK`` of a token: its
        top, or for the first fit (two episodes, *middle*) its geometric middle; *a* when there
        is none within ``_FIT_WHOLE_RANGE`` under it. A probe drains the bucket in well under a
        second, and over so short a drain one token more or less reads as a rate a tenth lower
        or higher: the highest consistent rate was a bucket of 2.2 at 11.3 req/s for one of 3
        at 10, and first fits on the chaos site read 4-8% over the limit."""
        floor = a / _FIT_WHOLE_RANGE
        first = max(1, math.ceil(self._replay(a)[0] - _FIT_WHOLE_SLACK))  # (the least burst at a)
        most_taken = self._replay(floor)[1]  # (the most any rate in range leaves a 429 taken)
        for burst in range(first, first + _FIT_WHOLE_BURSTS):
            if most_taken <= burst - 1 - _FIT_WHOLE_SLACK:
                break  # (no rate in range leaves a 429 so many tokens taken)
            # the highest rate at which every 429 finds more than *burst* - 1 tokens taken
            # (m falls as the rate rises), then the lowest at which no answer took more than
            # *burst* (M falls too): the band where that burst explains the history
            refused, answered = burst - 1 - _FIT_WHOLE_SLACK, burst + _FIT_WHOLE_SLACK
            top = self._bisect(floor, a, lambda rate: self._replay(rate)[1] > refused)
            if self._replay(top)[0] <= answered:
                if not middle:
                    return top
                bottom = self._bisect(floor, top, lambda rate: self._replay(rate)[0] > answered)
                return math.sqrt(bottom * top)
        return a

    @staticmethod
    def _bisect(low: float, high: float, below: Callable[[float], bool]) -> float:
        """The rate in [*low*, *high*] where *below* (true at *low*) turns false, by halvings;
        *high* when it never does."""
        if below(high):
            return high
        for _ in range(_FIT_WHOLE_BISECT):
            middle = (low + high) / 2
            if below(middle):
                low = middle
            else:
                high = middle
        return low

    def _judged(self, index: int) -> bool:
        return self.full or self.start == 0 or index >= self.start + BURN_IN_BINS

    def _episodes(self) -> int:
        """429 episodes to judge by (429s less than ``_FIT_EPISODE_GAP`` apart are one)."""
        episodes, last = 0, -math.inf
        for e in self.events:
            if e < 0:
                index = -e - 1
                if self._judged(index):
                    if index - last >= EPISODE_BINS:
                        episodes += 1
                    last = index
        return episodes

    def burst(self, rate: float) -> int:
        """The burst the site has proved it allows at *rate* (M: the most tokens it gave
        beyond its refill), at least 1: a client that sends no bigger bursts is not refused
        for bursting, on a site whose bucket is small for its rate."""
        return max(1, math.floor(self._replay(rate)[0]))

    def _slack(self, rate: float) -> float:
        """M - m for *rate*: < 1 when a burst exists that explains every answer and 429
        (infinite when a 429 would have found the bucket full)."""
        most, least = self._replay(rate)
        # a 429 that finds the bucket full (W = 0) is no bucket at all: the rate is too high
        return most - least if least > 0.0 else math.inf

    def _replay(self, rate: float) -> tuple[float, float]:
        """Lindley's recursion at *rate*: M (the largest W at an answer) and m (the least at
        a judged 429; infinite without one)."""
        w, most, least, before = 0.0, 0.0, math.inf, self.start
        drain = rate * _FIT_BIN
        for e in self.events:
            index = e if e >= 0 else -e - 1
            if index > before:
                w = max(0.0, w - drain * (index - before))
                before = index
            if e >= 0:
                w += 1.0
                if w > most:
                    most = w
            elif w < least and self._judged(index):
                least = w
        return most, least


class LimitHistories:
    """Each domain's :class:`LimitHistory`, kept only while it may prove a limit."""

    def __init__(self) -> None:
        self.by_domain: dict[str, LimitHistory] = {}

    def get(self, domain: str) -> LimitHistory | None:
        return self.by_domain.get(domain)

    def note(self, domain: str, born: float, at: float, note: str) -> None:
        """Add an answer that took a token or a 429 (*note*), sent at *at*, to the history of
        *domain* (first seen at *born*)."""
        index = fit_bin(at, born)
        history = self.by_domain.get(domain)
        if history is None:
            if index >= HORIZON_BINS and note == NOTE_ANSWER:
                return  # (a domain past its first seconds keeps no history until a 429)
            history = self.by_domain[domain] = LimitHistory(index)
        if not history.note(index, note == NOTE_ANSWER):
            del self.by_domain[domain]

    def forget(self, domains: list[str], *, compact: bool) -> None:
        for domain in domains:
            self.by_domain.pop(domain, None)
        if compact:  # a dict never shrinks by itself
            self.by_domain = dict(self.by_domain)

    def clear(self) -> None:
        self.by_domain = {}


class NoHistories(LimitHistories):
    """For a registry whose fits run elsewhere (in Redis, beside the shared state): keeps none."""

    def note(self, domain: str, born: float, at: float, note: str) -> None:
        return None
