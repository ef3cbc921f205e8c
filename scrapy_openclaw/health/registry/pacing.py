"""The pace a domain may send at: slow start, cuts on congestion, the cubic back up, the token bucket.

The registry's rate arithmetic over one domain's record and policy, kept apart
from the bookkeeping, with the delivered-rate windows a cut learns the limit from.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from scrapy_openclaw.health.registry.limitfit import fit_bin
from scrapy_openclaw.health.registry.refusals import end_slow_start, restart_sample
from scrapy_openclaw.health.registry.tuning import (
    _BASELINE_DRIFT,
    _BEYOND,
    _BURST_SECONDS,
    _CUT_AGAIN,
    _CUT_FLOOR,
    _DECLARED_SHARE,
    _DRY_GAPS,
    _DRY_HOLDS,
    _DRY_LATENCIES,
    _DRY_SECONDS,
    _FALL_LOOKBACK_BINS,
    _FIT_MARGIN,
    _LATENCY_ALPHA,
    _LATENCY_SLACK,
    _LATENCY_WARMUP,
    _MAX_PROBE_SECONDS,
    _MAX_RATE,
    _MIN_DECREASE_GAP,
    _PROBE_GROWTH,
    _PROBE_HOLD,
    _RESUMED,
    _SEED_PLATEAU,
    _SLOW_START_DOUBLING,
    _SLOW_START_GAIN,
    _STALE_WINDOW,
    _WINDOW,
    CLOSED,
)

if TYPE_CHECKING:
    from scrapy_openclaw.health.registry.limitfit import LimitHistory
    from scrapy_openclaw.health.registry.record import _Domain
    from scrapy_openclaw.policy import HealthPolicy


def ceiling_of(d: _Domain, p: HealthPolicy) -> float:
    """The ceilings: ``base_rate`` (scaled by health), the operator's, the site's declared
    limit (``_DECLARED_SHARE`` of it) and Crawl-delay."""
    ceiling = _MAX_RATE if p.base_rate is None else max(p.min_rate, p.base_rate * d.health / 100.0)
    if d.ctl_rate > 0:  # the operator's ceiling
        ceiling = min(ceiling, d.ctl_rate)
    if d.declared > 0:  # the site's own word (RateLimit headers)
        ceiling = min(ceiling, d.declared * _DECLARED_SHARE)
    return min(ceiling, 1.0 / d.crawl_delay) if d.crawl_delay > 0 else ceiling


def rate_of(d: _Domain, p: HealthPolicy) -> float:
    return min(max(d.rate, p.min_rate), ceiling_of(d, p))


def burst_of(d: _Domain, p: HealthPolicy) -> int:
    """Tokens the bucket holds: ``burst``, but no more than a quarter second's
    worth (a paused domain resumes at its pace, not with a burst), no more than
    the site has shown it takes (``burst_cap``), and one under a Crawl-delay."""
    if d.crawl_delay > 0:
        return 1
    burst = min(p.burst, int(rate_of(d, p) * _BURST_SECONDS))
    return max(1, min(burst, d.burst_cap) if d.burst_cap else burst)


def concurrency_of(d: _Domain, p: HealthPolicy, slot_concurrency: int | None, default: int) -> int:
    """Downloads at once: the slot's (else *default*) or the policy's, scaled by health; one while not closed."""
    if d.circuit != CLOSED:
        return 1
    cap = slot_concurrency if slot_concurrency is not None else default
    if p.base_concurrency is not None:
        cap = min(cap, p.base_concurrency)
    if d.ctl_concurrency > 0:  # the operator's concurrency replaces the cap
        cap = int(d.ctl_concurrency)
    return max(1, round(cap * d.health / 100.0))


def seed(d: _Domain, p: HealthPolicy, now: float, limit: float | None, burst: int, crawl_delay: float) -> None:
    """A new record for a domain an earlier crawl measured: at the limit it learned, as if a 429
    had just measured it, on a plateau ``_SEED_PLATEAU`` longer (the cubic holds the pace there,
    then probes upward; a limit that fell is cut, and re-fitted, at its first 429 like any other,
    and the domain paces as any other from then on)."""
    if limit is not None and limit > 0:
        d.threshold = min(float(limit), _MAX_RATE)
        d.cuts = _RESUMED
        d.rate = d.threshold
        # as if cut just now (the cubic holds the rate at the limit, then probes past it),
        # but long enough ago that the first 429 cuts at once
        d.last_decrease = now - _MIN_DECREASE_GAP
        d.burst_cap = max(0, burst)
        # the site delivered that pace last time: a 429 before this crawl's first full
        # window reads the remembered pace in the window, not a half-empty second
        d.delivered, d.win_start, d.win_ok = d.threshold, now, 0
        restart_sample(d, now)
    if crawl_delay > 0:
        d.crawl_delay = crawl_delay
    d.tokens = min(d.tokens, float(burst_of(d, p)))


def declare(d: _Domain, p: HealthPolicy, now: float, pace: float) -> None:
    """The site declares its limit (*pace* req/s; 0: none): pace just under it from now on,
    both ways, as if a 429 had just measured it there (no slow start, no probing past it:
    the ceiling holds the cubic; a 429 still cuts at once and is fitted as any other)."""
    d.declared = min(max(0.0, float(pace)), _MAX_RATE)
    if d.declared <= 0:
        return
    d.threshold = d.declared * _DECLARED_SHARE
    d.rate = min(d.threshold, ceiling_of(d, p))
    d.cuts = 2
    d.last_decrease = now - _MIN_DECREASE_GAP
    d.tokens = min(d.tokens, float(burst_of(d, p)))


def increase(d: _Domain, p: HealthPolicy, now: float) -> None:
    """Slow start (by half per success) until the first congestion; after it, growth by
    half per second (its limit was a guess: what the first second delivered) until a
    second signal that grows with the rate (a 429, or latency) measures the limit; then
    the cubic, whose plateau near the limit (``rate_probe`` small) keeps a hard limit's
    429s to one per ten seconds or fewer; past it with answers still clean, the limit has
    moved (see :func:`_plateau`). 503s and timeouts never start the plateau:
    they say the site struggled then, not where a limit is, so the pace probes back up
    at half per second."""
    since = max(0.0, now - max(d.last_decrease, min(d.hold_until, now)))  # (held time is no probing)
    if d.cuts == 0:
        doublings = min(max(0.0, now - d.born) / _SLOW_START_DOUBLING, 60.0)
        grown = min(d.rate * (1.0 + _SLOW_START_GAIN), p.initial_rate * 2.0**doublings)
    elif d.cuts == 1 and d.threshold is not None:
        grown = max(d.rate, d.threshold * p.rate_decrease * _PROBE_GROWTH ** min(since, _MAX_PROBE_SECONDS))
    else:  # (a cut always sets the threshold, and so does a seed)
        flat_at = _flat_at(p)
        if d.cuts == _RESUMED:  # a remembered limit: the plateau's flat part lasts _SEED_PLATEAU longer
            since = flat_at + max(0.0, since - _SEED_PLATEAU)
        held = d.hold_until - d.last_decrease  # the hold the last cut's refusal brought
        if since > flat_at and held > _PROBE_HOLD:
            # a probe past the limit costs such a hold: probe less often where it is longer
            since = flat_at + (since - flat_at) * _PROBE_HOLD / held
        grown = max(d.rate, (d.threshold or d.rate) * _plateau(p, since))
    d.rate = min(grown, ceiling_of(d, p), _MAX_RATE)


def decrease(
    d: _Domain,
    p: HealthPolicy,
    now: float,
    measured: bool = False,
    rate_bound: bool = False,
    history: LimitHistory | None = None,
    sent: float | None = None,
    refilled_at: float | None = None,
) -> bool:
    """Cut the rate for a congestion event; False (nothing done) within one of the last.

    The cut learns a limit (:func:`learned_limit`) and paces the domain
    just under it. Only a signal that grows with the rate (a 429:
    *measured*, or latency: *rate_bound*) moves the domain on to the
    cubic plateau (see :func:`increase`); a 503 or a timeout (an outage says
    nothing of a limit) leaves it probing back up at half per second. A
    429 to a request of the burst a hold saved up (*sent* within the
    burst's and one more token's time of the hold's end) only halves the
    burst, while there is one to halve: the site refused what the hold
    saved up, not the pace. One sent later, or a burst of one refused,
    was refused for the pace, and cuts it. Under a limit the site declares
    (``declared``) every 429 halves the burst first: the pace is the site's
    own figure, and requests sent at it arrive bunched. *refilled_at*: when the
    Retry-After hold this refusal brings ends, if it is long enough to refill the
    bucket (``_FIT_FULL_HOLD``), for the fit after a fall (:func:`begin_after_fall`).
    """
    if now - d.last_decrease < max(_MIN_DECREASE_GAP, d.latency or 0.0):
        if not measured or sent is None or not d.last_decrease < sent < now:
            return False  # (sent before the cut, or when is not known: the cut could not tell)
        d.cut_refused += 1  # refused at the cut pace: cut again once too many say it was not enough
        if d.cut_refused < _CUT_AGAIN or now - d.last_decrease < (d.latency or 0.0):
            return False
    d.cut_refused = 0
    if measured and dry(d, now):
        ride_out(d, p, now, history, fit_bin(now if sent is None else sent, d.born))
        return True
    bunched = d.declared > 0 or in_burst(d, p, now, now if sent is None else sent)
    if measured and d.cuts >= 1 and burst_of(d, p) > 1 and bunched:
        # refused while resuming from a hold: send smaller bursts (the rest of that burst
        # is the same event)
        d.burst_cap = max(1, burst_of(d, p) // 2)
        d.tokens = min(d.tokens, float(d.burst_cap))
        d.last_decrease = now
        return True
    fallen = False
    if measured and fell(d, p) and history is not None:  # (its history is another bucket's)
        fallen = True
        begin_after_fall(d, history, fit_bin(now if sent is None else sent, d.born), refilled_at)
    limit = learned_limit(d, p, now, measured, history, fallen)
    if d.cuts == 0:
        end_slow_start(d, now)
    # (see increase; any cut ends a remembered limit's longer plateau)
    d.cuts = min(d.cuts + 1, 2) if measured or rate_bound else min(max(d.cuts, 1), 2)
    d.threshold = limit
    d.rate = max(p.min_rate, limit * p.rate_decrease)
    d.tokens = min(d.tokens, float(burst_of(d, p)))
    d.last_decrease = now
    # (where a fall's evidence would begin: the hold after this cut under the learned limit)
    d.fall_from = max(1, fit_bin(refilled_at, d.born)) if measured and d.cut_below and refilled_at else 0
    return True


def dry(d: _Domain, now: float) -> bool:
    """Whether a limiter's refusals have let nothing through for long enough to be a block, not a
    limit (a temporary block, a spent fixed window, a used-up quota): no success for ``_DRY_SECONDS``,
    ``_DRY_GAPS`` gaps at the learned limit and ``_DRY_HOLDS`` x the last hold, and two answers'
    latency more. A token bucket at any rate lets something through in that time; only after a
    cut (slow start's refusals are its own overshoot) and not under a limit the site declares."""
    if not (d.cuts and d.threshold and d.last_success) or d.declared > 0:
        return False
    held = max(0.0, d.hold_until - d.last_decrease)
    wait = max(_DRY_SECONDS, _DRY_GAPS / d.threshold, _DRY_HOLDS * held)
    return now - d.last_success >= wait + _DRY_LATENCIES * (d.latency or 0.0)


def ride_out(d: _Domain, p: HealthPolicy, now: float, history: LimitHistory | None, index: int) -> None:
    """Cut for a refusal of a block (:func:`dry`): halve the pace, but keep the learned limit,
    raised back to what the site delivered before its refusals began (the window closed at the
    last success), so that when answers come back the cubic resumes near it at once instead of
    probing up from a guess the block crushed; the fit's history begins again at this request
    (bin *index*: the block's refusals are no bucket's)."""
    if d.delivered:
        d.threshold = max(d.threshold or 0.0, min(d.delivered, _MAX_RATE))
    d.rate = max(p.min_rate, rate_of(d, p) * _CUT_FLOOR)
    d.tokens = min(d.tokens, float(burst_of(d, p)))
    d.cut_below = d.fall_from = 0
    d.last_decrease = now
    if history is not None:
        history.restart(index)


def fell(d: _Domain, p: HealthPolicy) -> bool:
    """Whether a 429 that cuts (not one of a burst) says the learned limit fell: the second
    cut in a row refused at no more than a measured limit (one refused past it, a probe, starts
    the count again; a remembered limit refused is a guess a little high, which the fit corrects)."""
    below = d.cuts == 2 and bool(d.threshold) and rate_of(d, p) <= (d.threshold or 0.0)
    again = below and d.cut_below
    d.cut_below = int(below)
    return bool(again)


def begin_after_fall(d: _Domain, history: LimitHistory, index: int, refilled_at: float | None) -> None:
    """The fit's history begins again after a fall (what came before is another bucket's), where
    the bucket is known full when it can: at the hold after the fall's first refusal under the
    limit (``d.fall_from``), when that came at most ``_FALL_LOOKBACK`` before this refusal (sent
    in bin *index*), the answers since kept, so that this very cut is fitted from the new bucket;
    else at the end of this refusal's hold; without a hold that refills the bucket, at this
    request, its first seconds not judged. (From a window instead, the cut would read the
    hold's pause as the site's: a limit that fell by a quarter was learned at half of it.)"""
    if d.fall_from and 0 < index - d.fall_from <= _FALL_LOOKBACK_BINS:
        history.refilled(d.fall_from)
    elif refilled_at is not None:
        history.refilled(fit_bin(refilled_at, d.born))
    else:
        history.restart(index)


def learned_limit(
    d: _Domain, p: HealthPolicy, now: float, measured: bool, history: LimitHistory | None, fallen: bool = False
) -> float:
    """The limit a cut learns: the rate the domain delivered lately (its 2xx over the last
    second or two), when lower than the rate (past a limit only the answers say where it
    is). After the first cut, at no less than ``_CUT_FLOOR`` x the rate for a 429 (what got
    through is the limit) and ``rate_decrease`` x the rate for other signals (they say the
    site struggles, not how much it takes: an outage's empty windows must not ratchet the
    pace down). From the second 429 on, ``_FIT_MARGIN`` x the limit the domain's *history*
    proves (:mod:`.limitfit`), when it proves one, since the window misreads both ways (a
    few per cent high on a plateau, up to ~10% low at the end of a probe); the fit also
    caps the domain's burst at the largest the site took. After a fall (*fallen*) only a fit
    over the window's reading counts: the history is then a few seconds long, with holds in it."""
    pace = limit = rate_of(d, p)
    delivered = delivered_rate(d, now)
    if delivered > 0:
        floor = 0.0 if d.cuts == 0 else limit * (_CUT_FLOOR if measured else p.rate_decrease)
        limit = min(limit, max(delivered, floor))
    if measured and d.cuts >= 1 and history is not None:
        fitted = history.fit(limit, pace)
        # (after a fall, never under the window's reading: a second or two of answers with
        # holds in them once fitted a quarter of the limit)
        if fitted is not None and not (fallen and fitted * _FIT_MARGIN < limit):
            limit = min(pace, fitted * _FIT_MARGIN)
            d.burst_cap = history.burst(fitted)
    return limit


def in_burst(d: _Domain, p: HealthPolicy, now: float, sent: float) -> bool:
    """Whether a refusal answered at *now* was of the burst a hold saved up: answered after
    the hold's end, and *sent* no later than the burst (and one token more) took at the pace."""
    if now < d.hold_until:
        return False
    return sent - d.hold_until <= min(_BURST_SECONDS, (burst_of(d, p) + 1) / rate_of(d, p))


def observe_latency(d: _Domain, p: HealthPolicy, latency: float | None) -> bool:
    """Fold a sample into the EWMA; True when it says the domain is congested (never
    within the first ``_LATENCY_WARMUP`` successes: the baseline is still forming)."""
    if latency is None or not math.isfinite(latency) or latency < 0:
        return False
    d.latency = latency if d.latency is None else d.latency + _LATENCY_ALPHA * (latency - d.latency)
    if d.best_latency is None or d.latency < d.best_latency:
        d.best_latency = d.latency
        return False
    d.best_latency += _BASELINE_DRIFT * (d.latency - d.best_latency)
    return d.successes > _LATENCY_WARMUP and d.latency > p.latency_factor * d.best_latency + _LATENCY_SLACK


def count_delivered(d: _Domain, now: float) -> None:
    """Count a success in the delivered-rate window; close the window once it is long enough.

    Holds stay in the windows: what a site delivers over time, its pauses
    included, is what its limit allows (measured right after a pause, the
    server's refilled burst would make it look larger).
    """
    d.win_ok += 1
    span = now - d.win_start
    if span < _WINDOW:
        return
    if span <= _STALE_WINDOW:
        d.delivered = d.win_ok / span
    d.win_start, d.win_ok = now, 0


def delivered_rate(d: _Domain, now: float) -> float:
    """Successes per second the domain delivered lately: the last closed window
    (about ``_WINDOW`` long) and the open one (0.0: nothing to go by)."""
    span = now - d.win_start
    if span < 0:
        return 0.0
    if d.delivered is None:
        return d.win_ok / max(span, _WINDOW)
    return (d.delivered * _WINDOW + d.win_ok) / (_WINDOW + span)


def _plateau(p: HealthPolicy, since: float) -> float:
    """The cubic's factor on the learned limit *since* seconds after the last cut; once it
    passes ``_BEYOND`` x the limit with answers still clean, the limit has moved (a learned
    limit is evidence that ages, not a ceiling): from there it grows by ``_PROBE_GROWTH`` a
    second, as after a first cut."""
    flat_at = _flat_at(p)
    beyond_at = flat_at + ((_BEYOND - 1.0) / p.rate_probe) ** (1.0 / 3.0)
    if since <= beyond_at:
        return 1.0 + p.rate_probe * (since - flat_at) ** 3
    return _BEYOND * _PROBE_GROWTH ** min(since - beyond_at, _MAX_PROBE_SECONDS)


def _flat_at(p: HealthPolicy) -> float:
    """Seconds after a cut at which the cubic is back at the learned limit (its flat point)."""
    return float(((1.0 - p.rate_decrease) / p.rate_probe) ** (1.0 / 3.0))
