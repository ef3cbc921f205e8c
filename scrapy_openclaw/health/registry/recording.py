"""Recording outcomes: a success grows the pace and may close the circuit; a domain failure costs
health, pace, a hold and may open it.

A mixin of :class:`HealthRegistry`; whose trouble a failure is comes from :mod:`.verdicts`.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from scrapy_openclaw.health.registry.core import _RegistryCore
from scrapy_openclaw.health.registry.limitfit import (
    HORIZON_BINS,
    NOTE_ANSWER,
    LimitHistory,
    fit_bin,
    measures_limit,
    note_kind,
    sent_at,
)
from scrapy_openclaw.health.registry.pacing import _count_delivered
from scrapy_openclaw.health.registry.refusals import keep_pace, pace_sample
from scrapy_openclaw.health.registry.tuning import (
    _RATE_HEALTH_FLOOR,
    _SHARE_FAST,
    _SHARE_SLOW,
    CLOSED,
    HALF_OPEN,
    OPEN,
)
from scrapy_openclaw.health.registry.verdicts import _accounted, _penalty, _rate_signal

if TYPE_CHECKING:
    from scrapy_openclaw.errors import Classification
    from scrapy_openclaw.health.registry.record import _Domain
    from scrapy_openclaw.policy import HealthPolicy


class _Recording(_RegistryCore):
    """The writes of the health middleware: ``record_success`` and ``record_failure``."""

    def record_success(self, domain: str, latency: float | None, now: float | None = None) -> str | None:
        """Count a successful request; ``"closed"`` if it closed the circuit (a probe came back).

        Recording returns the circuit transition it caused itself, so that a
        component sharing the state with others (several workers on one Redis)
        reports each opening and closing once, where it happened.
        """
        now = time.time() if now is None else now
        d, p = self._get(domain, now)
        d.requests += 1
        d.successes += 1
        d.consecutive_failures = 0
        _count_delivered(d, now)
        if pace_sample(d, now, False, self._rate(d, p)):
            keep_pace(d, now, p.initial_rate)
        self._note(domain, d, sent_at(now, latency), NOTE_ANSWER)
        d.answered_at = d.last_success = now
        d.health = min(100.0, d.health + p.success_reward)
        d.share_fast -= _SHARE_FAST * d.share_fast
        d.share_slow -= _SHARE_SLOW * d.share_slow
        congested = self._observe_latency(d, p, self.site_latency(latency, now))
        closed = d.circuit == HALF_OPEN
        if closed:  # the learned limit stays: the domain resumes at it
            d.circuit, d.probe_at, d.down_since = CLOSED, 0.0, 0.0
        if congested:
            if self._decrease(d, p, now, rate_bound=True):  # latency above its baseline
                self.cuts_by_cause["latency"] += 1
        else:
            self._increase(d, p, now)
        return CLOSED if closed else None

    def site_latency(self, latency: float | None, now: float) -> float | None:
        """*latency* less the time the crawler itself stalled while it ran: the site's part."""
        if latency is None or not math.isfinite(latency) or latency <= 0:
            return latency
        return max(0.0, latency - self.own_stall(now - latency, now))

    def record_failure(
        self,
        domain: str,
        classification: Classification,
        now: float | None = None,
        retry_after: float | None = None,
        failed_before: float | None = None,
        latency: float | None = None,
    ) -> str | None:
        """Count a failed request; *retry_after* is the server's wait in seconds, if it sent one,
        *latency* the answer's download latency (when the request was sent, for the limit fit).

        Only a domain signal (see :meth:`judge`) costs health, pace or the
        circuit, and only one the failure itself shows (see :func:`_accounted`).
        Returns ``"open"`` if this failure opened the circuit (or reopened it
        after a failed probe).
        """
        now = time.time() if now is None else now
        d, p = self._get(domain, now)
        self._count_failure(domain, d, classification, retry_after, latency, now)
        rate_signal = _rate_signal(classification, retry_after)
        domain_signal, in_share = _accounted(d, classification, retry_after, failed_before)
        if rate_signal and pace_sample(d, now, True, self._rate(d, p)):
            keep_pace(d, now, p.initial_rate)  # (judged pace-independent by this very refusal)
            domain_signal = False
        if in_share:
            d.share_fast += _SHARE_FAST * (1.0 - d.share_fast)
            d.share_slow += _SHARE_SLOW * (1.0 - d.share_slow)
        if not domain_signal:
            if d.circuit == HALF_OPEN:
                d.probe_at = 0.0  # a page's own failure proves nothing: let another request probe
            return None
        d.troubled_at = now
        if not rate_signal:  # (failures in a row that open the circuit are sickness, not "slower")
            d.consecutive_failures += 1
        penalty, congestion = _penalty(classification, p)
        # A congestion signal costs its penalty once per event (when it also cuts
        # the rate). While the circuit is open or half-open the domain is known
        # to be down: a failed probe or a late answer costs no health and no hold
        # of its own; the growing cool-down is the penalty.
        measured = measures_limit(classification.status, retry_after)
        history = self._histories.get(domain) if measured else None
        sent = sent_at(now, latency)
        fresh = congestion and self._decrease(d, p, now, measured=measured, history=history, sent=sent)
        if fresh:
            self.cuts_by_cause[str(classification.status or classification.reason)] += 1
        closed = d.circuit == CLOSED
        if closed and (fresh or not congestion):
            floor = min(d.health, max(_RATE_HEALTH_FLOOR, p.circuit_floor)) if rate_signal else 0.0
            d.health = max(floor, d.health - penalty)
        self._hold_after_failure(d, p, classification, retry_after, now, closed=closed)
        if d.circuit == HALF_OPEN or (
            d.circuit == CLOSED
            and not rate_signal  # the site answered: slower, not sick
            and (d.health < p.circuit_floor or d.consecutive_failures >= p.circuit_failures)
        ):
            self._open(d, p, now)
            return OPEN
        return None

    def _count_failure(
        self,
        domain: str,
        d: _Domain,
        classification: Classification,
        retry_after: float | None,
        latency: float | None,
        now: float,
    ) -> None:
        """Every failure counts, whatever the verdict; an answer (a status) also feeds the limit fit."""
        d.requests += 1
        d.failures += 1
        if classification.status is not None:
            d.answered_at = now
        note = note_kind(classification.status, retry_after)
        if note:
            self._note(domain, d, sent_at(now, latency), note)

    def _hold_after_failure(
        self,
        d: _Domain,
        p: HealthPolicy,
        classification: Classification,
        retry_after: float | None,
        now: float,
        *,
        closed: bool,
    ) -> None:
        """The server's Retry-After holds the domain (capped); a throttle without one, one token's time."""
        if retry_after is not None:
            d.hold_until = max(d.hold_until, now + min(max(retry_after, 0.0), p.retry_after_cap))
            d.retry_after_holds += 1
        elif classification.is_throttle and closed:
            d.hold_until = max(d.hold_until, now + 1.0 / self._rate(d, p))

    def _note(self, domain: str, d: _Domain, at: float, note: str) -> None:
        """Add an answer that took a token or a 429 (*note*), sent at *at*, to the domain's
        history for the limit fit."""
        index = fit_bin(at, d.born)
        history = self._histories.get(domain)
        if history is None:
            if index >= HORIZON_BINS and note == NOTE_ANSWER:
                return  # (a domain past its first seconds keeps no history until a 429)
            history = self._histories[domain] = LimitHistory(index)
        if not history.note(index, note == NOTE_ANSWER):
            del self._histories[domain]
