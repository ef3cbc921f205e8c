"""What the health middleware tells a person: circuit openings, repeats condensed, one slow-domain hint.

Each opening is logged with its real trigger. A flapping site would otherwise
write an "opened" and a "closed" line per cool-down for hours, and a domain kept
slow by its policy gets one hint naming the key to change (docs/health.md).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scrapy.utils.asyncio import create_looping_call

from scrapy_openclaw.health.registry import CLOSED
from scrapy_openclaw.health.registry.tuning import _DECLARED_SHARE

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy.statscollectors import StatsCollector

    from scrapy_openclaw.health.registry import DomainState
    from scrapy_openclaw.policy import HealthPolicy

logger = logging.getLogger(__name__)

#: Trigger kinds of an opening, and the policy key a user changes for each.
FLOOR, IN_A_ROW, PROBE, HOLD = "floor", "in_a_row", "probe", "hold"
KNOBS = {FLOOR: "circuit_floor", IN_A_ROW: "circuit_failures", PROBE: "circuit_cooldown_max", HOLD: "retry_after_cap"}
_NEAR_MIN_RATE = 1.5  # a pace up to this multiple of min_rate counts as "held slow"


@dataclass
class _Repeats:
    """Openings and closings of one domain not logged yet, since *since* (monotonic)."""

    since: float
    opened: int = 0
    closed: int = 0
    held: int = 0
    triggers: Counter[str] = field(default_factory=Counter)


def trigger(state: DomainState, policy: HealthPolicy, reopened: bool) -> tuple[str, str]:
    """(kind, words) for what opened the circuit: a failed probe, health under the floor, or
    failures in a row (both named when both hold)."""
    if reopened:
        return PROBE, "the probe sent after the cool-down failed (each reopening doubles the cool-down)"
    reasons = []
    if state.health < policy.circuit_floor:
        reasons.append(f"health {state.health:.0f} under the circuit floor {policy.circuit_floor:g} (circuit_floor)")
    if state.consecutive_failures >= policy.circuit_failures:
        reasons.append(
            f"{state.consecutive_failures} domain failures in a row (circuit_failures: {policy.circuit_failures})"
        )
    if not reasons:  # (another worker's failures on a shared registry)
        return FLOOR, f"health {state.health:.0f}"
    return (FLOOR if state.health < policy.circuit_floor else IN_A_ROW), " and ".join(reasons)


class HealthNotices:
    """Condensed circuit lines and slow-domain hints for one crawl (owned by the health middleware)."""

    def __init__(
        self,
        *,
        state: Callable[[str], DomainState],
        policy: Callable[[str], HealthPolicy],
        stats: StatsCollector,
        repeat_interval: float,
        slow_after: float,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._state = state  # domain -> DomainState (the registry's)
        self._policy = policy  # domain -> HealthPolicy
        self.stats = stats
        self.repeat_interval = repeat_interval
        self.slow_after = slow_after
        self._clock = clock
        self._logged: set[str] = set()  # domains whose first opening was logged in full
        self._closed_logged: set[str] = set()
        self._held_logged: set[str] = set()
        self._open: set[str] = set()  # opened here, not closed since: a new opening is a failed probe
        self._repeats: dict[str, _Repeats] = {}
        self._watch: set[str] = set()  # domains with a domain failure since the last check
        self._slow: dict[str, tuple[float, Counter[str]]] = {}  # slow since (monotonic), openings by kind
        self._hinted: set[str] = set()
        self._opened_since_check: set[str] = set()
        self._refusing: set[str] = set()  # domains with a refusal (429, Retry-After) since the last check
        self._flat: set[str] = set()  # domains whose refusals were last said to be pace-independent
        self._loop: Any = None

    def start(self) -> None:
        tick = min(self.repeat_interval or 5.0, (self.slow_after / 2) or 5.0, 5.0)
        self._loop = create_looping_call(self.check)
        self._loop.start(max(0.1, tick), now=False)

    def stop(self) -> None:
        """Stop the timer; sum up every repeat and say every refusals' verdict not logged yet."""
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None
        for domain in list(self._repeats):
            self._summarise(domain)
        self._check_flat()  # (a verdict of the crawl's last seconds: in the log and the stats too)

    # --- events from the middleware ---------------------------------------------

    def troubled(self, domain: str) -> None:
        """A domain failure was recorded: look at the domain's pace at the next check."""
        if self.slow_after > 0:
            self._watch.add(domain)

    def refused(self, domain: str) -> None:
        """The site refused a request (a 429, or an answer with Retry-After): at the next check,
        say whether the domain's refusals were judged pace-independent, or a rate signal again."""
        self._refusing.add(domain)

    def held(self, domain: str, seconds: float, why: str) -> None:
        """The domain is held *seconds* because the site asked (*why*: Retry-After, a ban page)."""
        self._watch.add(domain)
        if domain in self._slow:
            self._slow[domain][1][HOLD] += 1
        if domain not in self._held_logged or not self.repeat_interval:
            self._held_logged.add(domain)
            logger.info(
                "Holding %(domain)s for %(seconds).1fs: %(why)s%(later)s",
                {
                    "domain": domain,
                    "seconds": seconds,
                    "why": why,
                    "later": f" (later holds are summed up every {self.repeat_interval:g}s)"
                    if self.repeat_interval
                    else "",
                },
            )
            return
        self._repeats_of(domain).held += 1

    def opened(self, state: DomainState, cooldown: float) -> None:
        domain = state.domain
        kind, why = trigger(state, self._policy(domain), domain in self._open)
        self._open.add(domain)
        self._watch.add(domain)
        self._opened_since_check.add(domain)
        if domain in self._slow:
            self._slow[domain][1][kind] += 1
        self.stats.inc_value(f"openclaw/health/circuit_trigger/{kind}")
        if domain not in self._logged or not self.repeat_interval:
            self._logged.add(domain)
            logger.warning(
                "Circuit for %(domain)s opened: %(why)s; pausing the domain for %(cooldown).1fs%(later)s",
                {
                    "domain": domain,
                    "why": why,
                    "cooldown": cooldown,
                    "later": (
                        f" (later openings are summed up every {self.repeat_interval:g}s)"
                        if self.repeat_interval
                        else ""
                    ),
                },
            )
            return
        repeats = self._repeats_of(domain)
        repeats.opened += 1
        repeats.triggers[kind] += 1

    def closed(self, state: DomainState) -> None:
        domain = state.domain
        self._open.discard(domain)
        if domain not in self._closed_logged or not self.repeat_interval:
            self._closed_logged.add(domain)
            logger.info(
                "Circuit for %(domain)s closed: a probe succeeded (health %(health).0f)",
                {"domain": domain, "health": state.health},
            )
            return
        self._repeats_of(domain).closed += 1

    # --- the periodic check -----------------------------------------------------------

    def check(self) -> None:
        """Sum up repeats older than the interval; look for domains kept slow."""
        now = self._clock()
        for domain, repeats in list(self._repeats.items()):
            if now - repeats.since >= self.repeat_interval:
                self._summarise(domain)
        if self.slow_after > 0:
            self._check_slow(now)
        self._check_flat()
        self._watch.clear()
        self._opened_since_check.clear()

    def _repeats_of(self, domain: str) -> _Repeats:
        repeats = self._repeats.get(domain)
        if repeats is None:
            repeats = self._repeats[domain] = _Repeats(since=self._clock())
        return repeats

    def _summarise(self, domain: str) -> None:
        repeats = self._repeats.pop(domain)
        if repeats.held:
            logger.info(
                "Held %(domain)s %(held)d more %(times)s in the last %(seconds).0f s (the site asked to wait)",
                {
                    "domain": domain,
                    "held": repeats.held,
                    "times": "time" if repeats.held == 1 else "times",
                    "seconds": self._clock() - repeats.since,
                },
            )
        if not (repeats.opened or repeats.closed):
            return
        kind, _ = repeats.triggers.most_common(1)[0] if repeats.triggers else ("", 0)
        logger.warning(
            "Circuit for %(domain)s opened %(opened)d more %(times)s (closed %(closed)d) in the last %(seconds).0f s%(why)s",
            {
                "domain": domain,
                "opened": repeats.opened,
                "times": "time" if repeats.opened == 1 else "times",
                "closed": repeats.closed,
                "seconds": self._clock() - repeats.since,
                "why": f"; most often because of {_KIND_WORDS[kind]}" if kind else "",
            },
        )

    def _check_flat(self) -> None:
        """A verdict on the refusals of a domain that refused since the last check, once per change:
        the crawl goes on at full pace there, which a person watching 429s should hear of."""
        for domain in sorted(self._refusing):
            share = self._state(domain).refusals_flat
            if share and domain not in self._flat:
                self._flat.add(domain)
                self.stats.inc_value("openclaw/health/refusals_pace_independent")
                logger.info(
                    "Refusals from %(domain)s do not fall when the pace falls (%(share).0f%% refused at "
                    "a slower pace too): they are retried as the pages' own failures, at the domain's pace",
                    {"domain": domain, "share": 100 * share},
                )
            elif not share and domain in self._flat:
                self._flat.discard(domain)
                logger.info(
                    "Refusals from %(domain)s rose with the pace: a rate signal again (the domain slows down)",
                    {"domain": domain},
                )
        self._refusing.clear()

    def _check_slow(self, now: float) -> None:
        for domain in self._watch | set(self._slow):
            if domain in self._hinted:
                continue
            state, policy = self._state(domain), self._policy(domain)
            slow = (
                state.circuit != CLOSED
                or domain in self._opened_since_check
                or state.rate <= _NEAR_MIN_RATE * policy.min_rate
            )
            if not slow:
                self._slow.pop(domain, None)
                continue
            since, openings = self._slow.setdefault(domain, (now, Counter()))
            if now - since >= self.slow_after:
                self._hint(state, policy, now - since, openings)

    def _hint(self, state: DomainState, policy: HealthPolicy, seconds: float, openings: Counter[str]) -> None:
        domain = state.domain
        self._hinted.add(domain)
        self._slow.pop(domain, None)
        self.stats.inc_value("openclaw/health/slow_hints")
        if openings:
            kind = openings.most_common(1)[0][0]
            why = (
                f"the site asked it to wait {openings[HOLD]} times (Retry-After or a ban page)"
                if kind == HOLD
                else f"its circuit opened {sum(openings.values()) - openings[HOLD]} times, "
                f"most often because of {_KIND_WORDS[kind]}"
            )
            key = KNOBS[kind]
            value = getattr(policy, key)
            advice = {
                FLOOR: "lower it (or raise success_reward) if these failures are the site's normal noise",
                IN_A_ROW: "raise it if the site fails a few requests in a row as a matter of course",
                PROBE: "lower it to probe a site that stays down more often (first check that the site answers at all)",
                HOLD: "lower it to cap how long one answer may hold the domain (the site asked for these pauses)",
            }[kind]
        elif state.declared and policy.ratelimit_headers and state.rate >= 0.9 * state.declared * _DECLARED_SHARE:
            # (the site's own word holds it there: min_rate cannot lift a declared ceiling)
            why = (
                f"the site says its limit is {state.declared:g} req/s (RateLimit headers) and the crawl keeps under it"
            )
            key, value = "ratelimit_headers", policy.ratelimit_headers
            advice = "set it to false only with the site's leave to go faster"
        else:
            why = f"its pace stayed at or near min_rate ({policy.min_rate:g} req/s), rate now {state.rate:.3g} req/s"
            key, value = "min_rate", policy.min_rate
            advice = "raise it if the site can take more (the site's 429/503 answers and latency set the pace)"
        logger.warning(
            "%(domain)s has been slow for %(seconds).0fs without getting faster: %(why)s. "
            "The knob: health.%(key)s (now %(value)s) in the policy for this domain; %(advice)s. "
            "Set it in OPENCLAW_POLICY or OPENCLAW_POLICY_FILE under "
            "domains: {%(domain)s: {health: {%(key)s: ...}}}",
            {"domain": domain, "seconds": seconds, "why": why, "key": key, "value": value, "advice": advice},
        )


_KIND_WORDS = {
    FLOOR: "health under the circuit floor",
    IN_A_ROW: "failures in a row",
    PROBE: "failed probes",
    HOLD: "Retry-After holds",
}
