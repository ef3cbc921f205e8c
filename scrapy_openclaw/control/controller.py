"""Operator commands on a running crawl: one place that validates, applies, logs and counts them.

Per-domain overrides are state of the HealthRegistry (``HealthRegistry.control``),
so the queue, the health middleware, metrics, checkpoints and (distributed)
every worker see them without a copy here. Crawl-wide commands act on the
engine. The HTTP API (:mod:`.api`) and the Redis channel (:mod:`.channel`)
both end in :meth:`Controller.execute`.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from scrapy.utils.defer import deferred_from_coro

from scrapy_openclaw.exceptions import ControlError as ControlError  # (re-exported)
from scrapy_openclaw.health.registry import HealthRegistry
from scrapy_openclaw.runtime import shared
from scrapy_openclaw.scrapy_internals import engine_of, resume_slot, wake_engine

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

#: Commands that change one domain, and those that act on the whole crawl.
DOMAIN_COMMANDS = ("hold", "release", "limit", "give_up", "restore")
CRAWL_COMMANDS = ("pause", "resume", "close")
COMMANDS = ("domains", *DOMAIN_COMMANDS, *CRAWL_COMMANDS)
CLOSE_REASON = "openclaw_ctl"
MAX_HOLD = 30 * 86400.0  # seconds: a hold "for" longer than this is a typo
_DOMAIN_RE = re.compile(r"^[A-Za-z0-9._:\[\]-]{1,253}$")
_REASON_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def _number(command: dict[str, Any], name: str, *, low: float, high: float) -> float | None:
    value = command.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ControlError(f"{name}: expected a number, got {value!r}")
    if not low <= value <= high:
        raise ControlError(f"{name}: {value!r} is out of range [{low}, {high}]")
    return float(value)


def validate(command: Any, now: float | None = None) -> dict[str, Any]:
    """A command as data, checked and normalised (a hold "for" N seconds becomes "until").

    Commands reach a worker from HTTP clients and from Redis: both untrusted.
    """
    if not isinstance(command, dict):
        raise ControlError("a command is a JSON object")
    name = command.get("command")
    if name not in COMMANDS:
        raise ControlError(f"command: {name!r} is not one of {', '.join(COMMANDS)}")
    out: dict[str, Any] = {"command": name}
    if name in DOMAIN_COMMANDS:
        domain = command.get("domain")
        if not isinstance(domain, str) or not _DOMAIN_RE.fullmatch(domain):
            raise ControlError(f"domain: expected a host name (a download slot key), got {domain!r}")
        out["domain"] = domain
    now = time.time() if now is None else now
    if name == "hold":
        until = _number(command, "until", low=0.0, high=now + 10 * MAX_HOLD)
        seconds = _number(command, "for", low=0.0, high=MAX_HOLD)
        if (until is None) == (seconds is None):
            raise ControlError("hold: give exactly one of 'until' (UNIX time) or 'for' (seconds)")
        out["until"] = until if until is not None else now + (seconds or 0.0)
    elif name == "limit":
        if "rate" not in command and "concurrency" not in command:
            raise ControlError("limit: give 'rate' (req/s) and/or 'concurrency'; null clears one")
        if "rate" in command:
            out["rate"] = _number(command, "rate", low=0.001, high=100000.0)
        if "concurrency" in command:
            conc = _number(command, "concurrency", low=1, high=10000)
            if conc is not None and conc != int(conc):
                raise ControlError(f"concurrency: expected a whole number, got {conc!r}")
            out["concurrency"] = None if conc is None else int(conc)
    elif name == "close":
        reason = command.get("reason", CLOSE_REASON)
        if not isinstance(reason, str) or not _REASON_RE.fullmatch(reason):
            raise ControlError(f"reason: expected letters, digits, '_', '.', '-' (at most 64), got {reason!r}")
        out["reason"] = reason
    return out


class Controller:
    """Applies operator commands to one crawl (``Controller.for_crawler``)."""

    def __init__(self, crawler: Crawler):
        self.crawler = crawler
        self.stats = crawler.stats
        self.registry: HealthRegistry = HealthRegistry.for_crawler(crawler)
        #: pending requests per domain, set by the metrics extension (its progress figures)
        self.pending: Callable[[], dict[str, int]] = dict
        #: set in distributed mode: commands are also published to every worker
        self.channel: Any = None

    @classmethod
    def for_crawler(cls, crawler: Crawler) -> Controller:
        return shared(crawler, "control", lambda: cls(crawler))

    def execute(self, command: Any, *, who: str, via: str = "api") -> dict[str, Any]:
        """Validate, apply, log and count *command*; what it did as JSON-safe data.

        ``via="redis"``: it came from another worker or the CLI through Redis (not published again).
        """
        cmd = validate(command)
        name = cmd["command"]
        self.stats.inc_value(f"openclaw/control/{name}")
        args = {k: v for k, v in cmd.items() if k != "command"}
        shown = dict(args)
        if "until" in shown:
            shown["until"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(shown["until"]))
        logger.info(
            "Control command %(command)s %(args)s by %(who)s (via %(via)s)",
            {"command": name, "args": shown or "", "who": who, "via": via},
            extra={"spider": self.crawler.spider},
        )
        if name == "domains":
            return {"ok": True, "command": name, **self.domains()}
        if self.channel is not None and via != "redis":
            self.channel.publish(cmd, who)
        if name in DOMAIN_COMMANDS:
            result = self._domain_command(cmd, via)
        else:
            result = self._crawl_command(cmd)
        return {"ok": True, "command": name, **args, **result}

    # --- domains ---------------------------------------------------------------------

    def _domain_command(self, cmd: dict[str, Any], via: str) -> dict[str, Any]:
        name, domain = cmd["command"], cmd["domain"]
        changes: dict[str, float] = {}
        if name == "hold":
            changes["ctl_hold"] = cmd["until"]
        elif name == "release":
            changes["ctl_hold"] = 0.0
        elif name == "limit":
            if "rate" in cmd:
                changes["ctl_rate"] = cmd["rate"] or 0.0
            if "concurrency" in cmd:
                changes["ctl_concurrency"] = cmd["concurrency"] or 0
        elif name == "give_up":
            changes["ctl_down"] = 1
        elif name == "restore":
            changes["ctl_down"] = 0
        # (from Redis: the issuer may have changed the shared state already; the values
        # are absolute, so applying them again changes nothing)
        self.registry.control(domain, **changes)
        if self.channel is not None:
            self.channel.domain_changed(domain)
        self._apply_to_slot(domain)
        wake_engine(self.crawler)
        return {"domain_state": self.domain_row(domain)}

    def _apply_to_slot(self, domain: str) -> None:
        """A released domain's download slot resumes now, not at the end of the hold.

        (The health middleware sets the slot's concurrency at its next request or response.)
        """
        engine = engine_of(self.crawler)
        if engine is None:
            return
        slot = engine.downloader.slots.get(domain)
        if slot is not None and self.registry.blocked_until(domain) <= time.time():
            resume_slot(slot, engine.downloader)

    def domain_row(self, domain: str, pending: dict[str, int] | None = None) -> dict[str, Any]:
        state = self.registry.state(domain)
        now = time.time()
        blocked = self.registry.blocked_until(domain, now)
        return {
            "domain": domain,
            "health": round(state.health, 1),
            "rate": None if math.isinf(state.rate) else round(state.rate, 3),
            "concurrency": state.concurrency,
            "circuit": state.circuit,
            "held_until": blocked if blocked > now else None,
            "given_up": self.registry.given_up(domain, now),
            "pending": (pending if pending is not None else self.pending()).get(domain, 0),
            "overrides": self.registry.overrides(domain),
        }

    def domains(self) -> dict[str, Any]:
        pending = self.pending()
        names = sorted(set(self.registry.domains()) | set(pending))
        engine = engine_of(self.crawler)
        return {
            "paused": bool(getattr(engine, "paused", False)),
            "domains": [self.domain_row(d, pending) for d in names],
        }

    # --- the crawl -------------------------------------------------------------------

    def _crawl_command(self, cmd: dict[str, Any]) -> dict[str, Any]:
        engine = engine_of(self.crawler)
        if engine is None:
            raise ControlError("the crawl is not running")
        name = cmd["command"]
        if name == "pause":
            engine.pause()
        elif name == "resume":
            engine.unpause()
            wake_engine(self.crawler)
        elif name == "close":
            deferred_from_coro(engine.close_spider_async(reason=cmd["reason"]))
        return {"paused": bool(engine.paused)}
