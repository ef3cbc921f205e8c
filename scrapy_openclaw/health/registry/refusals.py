"""Whether a domain's refusals are a rate signal: does slowing down lower their share?

A limiter refuses a client that sends faster than its limit L: at a pace P above
it a share ``1 - L/P`` is refused and about L req/s get through, whatever P is.
Some servers refuse without regard to the pace (every Nth request, a random
share): slowing down keeps the same share of refusals and only lowers what gets
through. The controller cuts on every refusal, so on such a server it would crawl
at ``min_rate`` for nothing.

So the answers of a domain are sampled in intervals of ``_PACE_SAMPLE`` answers
(fewer once the pace is slow), successes and refusals (429s, or any answer with a Retry-After):
the pace the controller allowed at its end (what it chose: the answers' own rate also
falls with every Retry-After hold), the share refused and what got through (2xx/s). The first interval with
refusals is the reference; a later one at clearly lower pace (``_FLAT_SLOWER``) whose
refused share did not fall (``_FLAT_KEPT``) while what got through fell with the
pace (``_FLAT_DELIVERED``) proves the refusals pace-independent: the domain's
``refusals_flat`` holds their share, and its refusals become the page's own failures
(retried, no cut, no hold, no health cost). A share that later rises well above it
(``_FLAT_RISE``, at most ``_FLAT_RISE_CAP``) makes them a rate signal again. The first interval with refusals after a
clean one (and slow start's answers after one) straddles a change, a limit that fell: half
of it answered under the old limit, so it is no reference. The Lua port is ``h_pace_sample``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy_openclaw.health.registry.tuning import (
    _FLAT_DELIVERED,
    _FLAT_KEPT,
    _FLAT_MIN_OK,
    _FLAT_MIN_SHARE,
    _FLAT_PACE_SLACK,
    _FLAT_RISE,
    _FLAT_RISE_CAP,
    _FLAT_SLOWER,
    _PACE_FEW,
    _PACE_SAMPLE,
    _PACE_SHORT,
    _PACE_SPAN,
    _WINDOW,
)

if TYPE_CHECKING:
    from scrapy_openclaw.health.registry.record import _Domain


def pace_sample(d: _Domain, now: float, refused: bool, rate: float, sent: float) -> bool:
    """Count an answer (*refused*: a refusal) to a request *sent* then in the domain's pace
    interval, *rate* the pace the controller allows now; True when it closed an interval that
    made the refusals pace-independent (``d.refusals_flat`` set)."""
    if d.iv_cut:
        if sent < d.iv_cut:  # slow start's answers: they close when one sent after it comes
            _count(d, refused, sent)
            return False
        _close_slow_start(d, now)
    _count(d, refused, sent)
    n = d.iv_ok + d.iv_refused
    if n < _PACE_SAMPLE and (n < _PACE_SHORT or now - d.iv_start < _PACE_SPAN):
        return False
    span = max(now - d.iv_start, 1e-3)
    pace, share, ok = rate, d.iv_refused / n, d.iv_ok
    _open_interval(d, now)
    if d.refusals_flat:
        if share >= _risen(d.refusals_flat):
            d.refusals_flat, d.ref_share, d.ref_pace, d.ref_ok = 0.0, share, pace, ok / span
        return False
    if share < _FLAT_MIN_SHARE or not d.cuts:
        # clean, or still in slow start: nothing to compare with
        d.ref_share = d.ref_pace = d.ref_ok = 0.0
        d.iv_clean = int(share < _FLAT_MIN_SHARE)
        return False
    delivered = ok / span
    if not d.ref_share or pace > d.ref_pace:
        if d.iv_clean:  # the refusals began in this interval: it straddles the change (a limit that fell)
            d.iv_clean = 0
            return False
        # (what got through over at least a second: a short interval's is mostly a bucket's saved-up burst)
        d.ref_share, d.ref_pace, d.ref_ok = share, pace, ok / max(span, _WINDOW)
        return False
    if pace > _FLAT_SLOWER * d.ref_pace:
        return False
    kept = _FLAT_KEPT * d.ref_share <= share < _risen(d.ref_share)  # (a rise: not flat either)
    fell = delivered <= min(_FLAT_DELIVERED, pace / max(d.ref_pace, 1e-9) + _FLAT_PACE_SLACK) * d.ref_ok
    flat = kept and ok >= _FLAT_MIN_OK and fell
    if flat:
        d.refusals_flat = share
        return True
    d.ref_share, d.ref_pace, d.ref_ok = share, pace, delivered  # slowing helped: a rate signal
    return False


def _risen(share: float) -> float:
    """The refused share that says refusals at *share* rose with the pace: a rate signal after all
    (capped below 1: a flat share over a half, often a limiter wrongly proved flat, must be able to
    rise too, or the crawl would go on sending at the pace with nearly every request refused)."""
    return min(share * _FLAT_RISE + _FLAT_MIN_SHARE, _FLAT_RISE_CAP)


def _count(d: _Domain, refused: bool, sent: float) -> None:
    if refused:
        d.iv_refused += 1
        d.iv_first_refused = min(d.iv_first_refused or sent, sent)
    else:
        d.iv_ok += 1
        d.iv_last_ok = max(d.iv_last_ok, sent)


def _open_interval(d: _Domain, now: float) -> None:
    d.iv_start, d.iv_ok, d.iv_refused = now, 0, 0
    d.iv_first_refused = d.iv_last_ok = 0.0


def _close_slow_start(d: _Domain, now: float) -> None:
    """The answers to what slow start sent are in: with enough refused among them they are
    the reference (a later interval at 0.7x their pace that keeps their share proves the
    refusals flat a whole interval sooner than two intervals after the cut would). Enough:
    ``_PACE_SHORT`` answers, or ``_PACE_FEW`` when one sent after a refused one got through
    (a token bucket refuses the end of slow start: its four answers can read a third refused,
    three through and the last refused, and such a reference once proved buckets flat)."""
    n = d.iv_ok + d.iv_refused
    span = max(now - d.iv_start, 1e-3)
    enough = n >= _PACE_SHORT or (n >= _PACE_FEW and d.iv_last_ok > d.iv_first_refused > 0)
    if enough and d.iv_refused / n >= _FLAT_MIN_SHARE and not d.refusals_flat and not d.iv_clean:
        d.ref_share, d.ref_pace, d.ref_ok = d.iv_refused / n, min(d.iv_pace, n / span), d.iv_ok / span
    d.iv_cut = d.iv_pace = 0.0
    _open_interval(d, now)


def keep_pace(d: _Domain, now: float, initial_rate: float) -> None:
    """Refusals that are no rate signal: back to the pace before them (slow start again
    from at least ``initial_rate``, nothing learned, no hold), and the health they took
    given back (it sets the domain's concurrency: at half health a site that answers every
    request at once was crawled at half its concurrency until successes earned it back)."""
    d.cuts, d.threshold, d.burst_cap = 0, None, 0
    d.rate = max(d.rate, initial_rate)
    d.hold_until = min(d.hold_until, now)
    d.health = min(100.0, d.health + d.rate_cost)
    d.rate_cost = 0.0


def restart_sample(d: _Domain, now: float) -> None:
    """A remembered limit: pace intervals start here."""
    _open_interval(d, now)
    d.iv_cut = d.iv_pace = 0.0


def end_slow_start(d: _Domain, now: float) -> None:
    """The first cut: the open interval goes on gathering the answers to what slow start
    sent (before *now*, at ``d.rate``), then closes as the candidate reference."""
    d.iv_cut, d.iv_pace = now, d.rate
