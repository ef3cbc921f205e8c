"""Per-domain policies: defaults plus overrides by host pattern, validated once.

A policy has three parts, one per component: ``health``, ``retry`` and
``deadline``. The built-in defaults are the dataclass defaults below;
``OPENCLAW_POLICY`` (a dict in ``settings.py``) and then the YAML file named by
``OPENCLAW_POLICY_FILE`` are layered on top. Both have the same schema::

    defaults:
      health: {base_concurrency: 8}
      retry: {network: {max_attempts: 5}}
    domains:
      "*.example.com":      # every subdomain of example.com (not example.com)
        health: {base_rate: 2}
      api.example.com:      # exact host: more specific, applied last
        retry: {budget_ratio: 0.1}

Matching rules apply from least to most specific (wildcards with fewer labels
first, exact hosts last), each overriding only the keys it names. Any error
stops the crawl at start with the file, line and key.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args, get_origin, get_type_hints

from scrapy_openclaw.exceptions import OpenClawConfigError
from scrapy_openclaw.yamlconfig import Where, read_yaml

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings

JitterMode = Literal["full", "equal", "decorrelated", "none"]
ExpiredMode = Literal["boost", "drop"]


# Field metadata: the allowed closed range of a number.
def _range(lo: float | None = None, hi: float | None = None) -> dict[str, Any]:
    return {"range": (lo, hi)}


@dataclass(frozen=True)
class HealthPolicy:
    """How a domain's score moves and how the score and its signals drive its pace.

    Out of the box nothing caps a healthy domain but concurrency, as in plain
    Scrapy; ``base_rate`` and ``base_concurrency`` are opt-in ceilings.
    """

    success_reward: float = field(default=1.0, metadata=_range(0, 100))
    throttle_penalty: float = field(default=20.0, metadata=_range(0, 100))  # 429/503
    timeout_penalty: float = field(default=10.0, metadata=_range(0, 100))
    connection_penalty: float = field(default=10.0, metadata=_range(0, 100))
    server_error_penalty: float = field(default=5.0, metadata=_range(0, 100))
    recovery_per_minute: float = field(default=10.0, metadata=_range(0, 100))
    # concurrency ceiling per domain; None: the slot's own (CONCURRENT_REQUESTS_PER_DOMAIN,
    # _PER_IP, DOWNLOAD_SLOTS), scaled by health either way
    base_concurrency: int | None = field(default=None, metadata=_range(1, 1000))
    # req/s ceiling per domain; None: no fixed ceiling (the site's own signals set the pace)
    base_rate: float | None = field(default=None, metadata=_range(0.01, 100000))
    # where slow start begins (req/s); it grows by half with every success until a congestion signal
    initial_rate: float = field(default=10.0, metadata=_range(0.01, 100000))
    min_rate: float = field(default=0.2, metadata=_range(0.001, 10000))
    burst: int = field(default=5, metadata=_range(1, 10000))
    # after a slowdown, how fast the rate probes past the learned limit: the cubic's
    # constant, as a share of that limit per second cubed (CUBIC's C, scale-free)
    rate_probe: float = field(default=0.0001, metadata=_range(0.00001, 10))
    rate_decrease: float = field(default=0.9, metadata=_range(0.01, 0.99))  # multiplier on congestion
    latency_factor: float = field(default=3.0, metadata=_range(1.0, 100))
    circuit_floor: float = field(default=20.0, metadata=_range(0, 100))
    # domain failures in a row that open the circuit: few, because opening is cheap (a
    # short first cool-down) and at low concurrency every failure in the run
    # is a separate congestion event that costs health
    circuit_failures: int = field(default=3, metadata=_range(1, 100000))
    # first cool-down, seconds: short, because most outages a crawler meets are
    # seconds long (a 503 window is not a ban); doubled per opening in a row ...
    circuit_cooldown: float = field(default=1.0, metadata=_range(0.1, 86400))
    # ... up to this (a domain that stays down is still probed once a minute)
    circuit_cooldown_max: float = field(default=60.0, metadata=_range(0.1, 86400))
    # +- this share of random spread on each cool-down (Nutch uses 10%)
    circuit_jitter: float = field(default=0.1, metadata=_range(0, 0.5))
    # seconds a circuit may stay open (no probe getting through) before the domain is given
    # up: its requests become dead letters (replayable) so the crawl can end; None: never
    give_up_after: float | None = field(default=600.0, metadata=_range(1, None))
    # the same for a domain that has never answered (DNS errors, refused connections):
    # such a host is most likely dead, so it is given up within seconds; None: give_up_after
    unreachable_give_up: float | None = field(default=5.0, metadata=_range(0, None))
    retry_after_cap: float = field(default=600.0, metadata=_range(0, 86400))
    # a ban or challenge page (error class "blocked"): its health penalty and how long it
    # holds the domain (a Retry-After on it wins when longer); a congestion signal too
    blocked_penalty: float = field(default=30.0, metadata=_range(0, 100))
    blocked_hold: float = field(default=30.0, metadata=_range(0, 86400))
    # text (case-insensitive) whose presence in an answer of any status, 200 included,
    # makes it a ban page for this domain: a captcha form's id, a login wall's heading
    ban_markers: tuple[str, ...] = ()
    # look for the built-in challenge markers (errors.BAN_MARKERS) on 403/429/503 answers
    ban_builtin_markers: bool = True


@dataclass(frozen=True)
class RetryClassPolicy:
    """Backoff for one error class: attempt n waits about base_delay·2ⁿ, capped."""

    max_attempts: int = field(default=6, metadata=_range(1, 1000))  # incl. the first
    base_delay: float = field(default=1.0, metadata=_range(0, 86400))
    max_delay: float = field(default=60.0, metadata=_range(0, 86400))
    jitter: JitterMode = "full"


@dataclass(frozen=True)
class RetryPolicy:
    network: RetryClassPolicy = RetryClassPolicy()
    # "equal" jitter: every wait is at least half its step (0.5, 1, 2, 4, 8 s), so
    # the 4th attempt comes >= 3.5 s after the 1st and a 503 window of a few
    # seconds is always outlived; "full" may retry at once, into the same window
    protocol_retryable: RetryClassPolicy = RetryClassPolicy(jitter="equal")
    parse: RetryClassPolicy = RetryClassPolicy(max_attempts=3, base_delay=0.5, max_delay=10.0)
    # a network or protocol_retryable failure the health middleware judged the page's
    # own (meta["openclaw_failure_scope"] == "page": its domain is healthy) is retried
    # on this short schedule (0.25-0.5, 0.5-1, then 1-2 s), then dead-lettered; the
    # congestion schedules above are for domain trouble. As many attempts as they
    # have: the first failures of a 503 window still look like a page's own, and a
    # URL unlucky enough to meet several windows must not be given up early.
    page: RetryClassPolicy = RetryClassPolicy(max_attempts=6, base_delay=0.5, max_delay=2.0, jitter="equal")
    # a ban page: retried after the domain's hold (health.blocked_hold) at the earliest, a few
    # times, then a dead letter of class "blocked" (never handed to the callback)
    blocked: RetryClassPolicy = RetryClassPolicy(max_attempts=3, base_delay=5.0, max_delay=300.0, jitter="equal")
    # retries may be at most this share of the domain's recent requests ...
    # (higher than Finagle's 20%: our retries are spread out by backoff, not
    # immediate, so a flapping site needs more of them to be ridden out)
    budget_ratio: float = field(default=0.5, metadata=_range(0, 1))
    # ... but this many retries per window are always allowed (1/s by default)
    budget_min_retries: int = field(default=60, metadata=_range(0, 1000000))
    budget_window: float = field(default=60.0, metadata=_range(1, 86400))


@dataclass(frozen=True)
class DeadlinePolicy:
    default: float | None = field(default=None, metadata=_range(0, None))  # seconds from first scheduling
    expired: ExpiredMode = "boost"
    aging_window: float = field(
        default=300.0, metadata=_range(0.001, None)
    )  # aging starts this long before the deadline
    # default deadline (seconds) by request class, meta["openclaw_request_class"]
    classes: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class DomainPolicy:
    health: HealthPolicy = HealthPolicy()
    retry: RetryPolicy = RetryPolicy()
    deadline: DeadlinePolicy = DeadlinePolicy()


_HOST_PATTERN = re.compile(r"^(\*\.)?([a-z0-9_-]+|\*)(\.([a-z0-9_-]+))*$|^\*$|^[0-9.:\[\]a-f]+$")


@dataclass(frozen=True)
class _Rule:
    pattern: str
    overrides: dict[str, Any]

    @property
    def specificity(self) -> tuple[int, int]:
        exact = "*" not in self.pattern
        return (1 if exact else 0, self.pattern.count("."))

    def matches(self, domain: str) -> bool:
        if "*" not in self.pattern:
            return domain == self.pattern
        if self.pattern.startswith("*.") and "*" not in self.pattern[2:]:
            return domain.endswith(self.pattern[1:])
        return fnmatch.fnmatchcase(domain, self.pattern)


class PolicySet:
    """The validated policies of one crawl; ``for_domain`` is cached."""

    def __init__(self, defaults: dict[str, Any], rules: list[_Rule]):
        self._defaults_raw = defaults
        self.defaults: DomainPolicy = _build(DomainPolicy, defaults)
        self.rules = sorted(rules, key=lambda r: r.specificity)
        self.for_domain = lru_cache(maxsize=4096)(self._for_domain)

    def _for_domain(self, domain: str) -> DomainPolicy:
        merged = self._defaults_raw
        matched = False
        for rule in self.rules:
            if rule.matches(domain.lower()):
                merged = _deep_merge(merged, rule.overrides)
                matched = True
        return _build(DomainPolicy, merged) if matched else self.defaults

    def names(self, domain: str, *path: str) -> bool:
        """Whether a policy layer (defaults or a rule matching *domain*) names *path*,
        e.g. ``("retry", "network", "max_attempts")``, rather than leaving the built-in default."""
        layers = [self._defaults_raw, *(r.overrides for r in self.rules if r.matches(domain.lower()))]
        for node in layers:
            for key in path:
                if not isinstance(node, dict) or key not in node:
                    break
                node = node[key]
            else:
                return True
        return False

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> PolicySet:
        """Validate the flat OPENCLAW_* settings and the policy layers."""
        from scrapy_openclaw.settings import validate_settings

        validate_settings(settings)
        return cls._load(settings)

    @classmethod
    def _load(cls, settings: BaseSettings) -> PolicySet:
        """The policy layers (inline, then the file), validated; the flat settings already are."""
        loader = _Loader()
        loader.add(inline_policy(settings.get("OPENCLAW_POLICY")), source="setting OPENCLAW_POLICY", lines={})
        path = settings.get("OPENCLAW_POLICY_FILE")
        if path:
            data, lines = read_yaml(Path(path), kind="policy file")
            loader.add(data, source=str(path), lines=lines)
        loader.check()
        return cls(loader.defaults, loader.rules())

    @classmethod
    def for_crawler(cls, crawler: Crawler) -> PolicySet:
        """The crawl's policies, loaded once; the flat settings are validated once, by
        :meth:`OpenClawSettings.for_crawler <scrapy_openclaw.settings.OpenClawSettings.for_crawler>`."""
        from scrapy_openclaw.runtime import shared
        from scrapy_openclaw.settings import OpenClawSettings

        OpenClawSettings.for_crawler(crawler)
        return shared(crawler, "policy", lambda: cls._load(crawler.settings))


# --- loading and validation -------------------------------------------------


def inline_policy(value: Any) -> Any:
    """``OPENCLAW_POLICY`` as data: a dict, or a JSON object given as text (``-s OPENCLAW_POLICY='{...}'``)."""
    if hasattr(value, "copy_to_dict"):
        return value.copy_to_dict()
    if isinstance(value, (str, bytes)):
        if not value.strip():
            return {}
        try:
            value = json.loads(value)
        except (ValueError, RecursionError) as exc:
            raise OpenClawConfigError(f"setting OPENCLAW_POLICY: not a JSON object: {exc}") from None
        if not isinstance(value, dict):
            raise OpenClawConfigError(
                f"setting OPENCLAW_POLICY: the policy must be a mapping with 'defaults' and/or 'domains', "
                f"got JSON {type(value).__name__}"
            )
    return value or {}


#: Pairs (section, lower, upper) where the lower key may not exceed the upper one.
_ORDERED = (
    ("health", "min_rate", "base_rate"),
    ("health", "initial_rate", "base_rate"),
    ("health", "circuit_cooldown", "circuit_cooldown_max"),
)


class _Loader:
    """Collects layers (settings dict, YAML file), validating each as it comes."""

    def __init__(self) -> None:
        self.defaults: dict[str, Any] = {}
        self._domains: dict[str, dict[str, Any]] = {}
        self._origin: dict[tuple, tuple[Where, tuple]] = {}  # normalised key path -> where it was set

    def add(self, data: Any, source: str, lines: dict[tuple, int]) -> None:
        where = Where(source, lines)
        if data is None:
            return
        if not isinstance(data, dict):
            where.fail((), "the policy must be a mapping with 'defaults' and/or 'domains'")
        for key in data:
            if key not in ("defaults", "domains"):
                where.fail((key,), "unknown key (expected 'defaults' or 'domains')")
        defaults = data.get("defaults") or {}
        _validate(DomainPolicy, defaults, ("defaults",), where)
        self.defaults = _deep_merge(self.defaults, defaults)
        self._note(defaults, ("defaults",), ("defaults",), where)
        domains = data.get("domains") or {}
        if not isinstance(domains, dict):
            where.fail(("domains",), "must be a mapping of host pattern to policy")
        for pattern, overrides in domains.items():
            path = ("domains", pattern)
            if not isinstance(pattern, str) or not _HOST_PATTERN.match(pattern.lower()):
                where.fail(path, f"bad host pattern {pattern!r} (use 'host.example.com' or '*.example.com')")
            _validate(DomainPolicy, overrides or {}, path, where)
            key = pattern.lower()
            self._domains[key] = _deep_merge(self._domains.get(key, {}), overrides or {})
            self._note(overrides or {}, ("domains", key), path, where)

    def _note(self, data: dict[str, Any], key: tuple, path: tuple, where: Where) -> None:
        for name, value in data.items():
            if isinstance(value, dict):
                self._note(value, (*key, name), (*path, name), where)
            else:
                # (the key in a variable: mypy mistakes ``d[(*key, name)]`` for 3.11-only ``d[*key, name]``)
                origin_key = (*key, name)
                self._origin[origin_key] = (where, (*path, name))

    def check(self) -> None:
        """Refuse contradictions between keys (``min_rate`` above ``base_rate``), naming both.

        Only a lower bound the user set is checked: a built-in default above a
        user's ceiling is simply capped by it.
        """
        scopes: list[tuple[tuple[str, ...], dict[str, Any]]] = [(("defaults",), self.defaults)]
        scopes += [(("domains", p), _deep_merge(self.defaults, o)) for p, o in self._domains.items()]
        for scope, merged in scopes:
            policy = _build(DomainPolicy, merged)
            for section, lower, upper in _ORDERED:
                low, high = getattr(getattr(policy, section), lower), getattr(getattr(policy, section), upper)
                if high is None or low <= high:
                    continue
                low_at = self._set_at(scope, section, lower)
                if low_at is None:
                    continue
                high_at = self._set_at(scope, section, upper)
                if high_at is None:
                    other = "the built-in default"
                else:
                    line = high_at[0].line(high_at[1])
                    other = (
                        f"{high_at[0].source}{f', line {line}' if line else ''}, key {'.'.join(map(str, high_at[1]))}"
                    )
                low_at[0].fail(
                    low_at[1],
                    f"{lower} ({low}) is greater than {upper} ({high}, set by {other}); {lower} must be <= {upper}",
                )

    def _set_at(self, scope: tuple, section: str, name: str) -> tuple[Where, tuple] | None:
        """Where the key in effect for *scope* was set: the domain's own layer first, then defaults."""
        found = self._origin.get((*scope, section, name))
        if found is None and scope[0] == "domains":
            found = self._origin.get(("defaults", section, name))
        return found

    def rules(self) -> list[_Rule]:
        return [_Rule(p, o) for p, o in self._domains.items()]


def _validate(cls: type, data: Any, path: tuple, where: Where) -> None:
    if not isinstance(data, dict):
        where.fail(path, f"must be a mapping, got {type(data).__name__}")
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key, value in data.items():
        kpath = (*path, key)
        if key not in fields:
            known = ", ".join(sorted(fields))
            where.fail(kpath, f"unknown key (known: {known})")
        _validate_value(hints[key], fields[key], value, kpath, where)


def _validate_value(hint: Any, f: dataclasses.Field, value: Any, path: tuple, where: Where) -> None:
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        _validate(hint, value, path, where)
        return
    origin, args = get_origin(hint), get_args(hint)
    if hint is bool:
        if not isinstance(value, bool):
            where.fail(path, f"must be true or false, got {value!r}")
        return
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v.strip() for v in value):
            where.fail(path, f"must be a list of non-empty strings, got {value!r}")
        if len(value) > 100 or any(len(v) > 1000 for v in value):
            where.fail(path, "at most 100 strings of at most 1000 characters")
        return
    if origin is Literal:
        if value not in args:
            where.fail(path, f"must be one of {', '.join(map(repr, args))}, got {value!r}")
        return
    if origin is dict:
        if not isinstance(value, dict):
            where.fail(path, "must be a mapping")
        for k, v in value.items():
            _check_number(float, v, (*path, k), where, (0, None))
        return
    optional = type(None) in args
    if optional and value is None:
        return
    base = next((a for a in args if a is not type(None)), hint) if args else hint
    _check_number(base, value, path, where, f.metadata.get("range", (None, None)))


def _check_number(base: type, value: Any, path: tuple, where: Where, bounds: tuple) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        where.fail(path, f"must be a number, got {value!r}")
    if isinstance(value, int) and abs(value) >= 2**63:
        where.fail(path, "number too large")
    if base is int and not float(value).is_integer():
        where.fail(path, f"must be a whole number, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        where.fail(path, f"must be finite, got {value!r}")
    lo, hi = bounds
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        lo_s = "-inf" if lo is None else lo
        hi_s = "inf" if hi is None else hi
        where.fail(path, f"out of range: {value!r} is not within [{lo_s}, {hi_s}]")


def _build(cls: type, data: dict[str, Any], base: Any = None) -> Any:
    """Apply validated data onto *base* (the class defaults), field by field."""
    base = cls() if base is None else base
    hints = get_type_hints(cls)
    changes = {}
    for key, value in data.items():
        hint = hints[key]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            changes[key] = _build(hint, value, getattr(base, key))
        elif get_origin(hint) is tuple:
            changes[key] = tuple(value)
        elif hint is bool:
            changes[key] = bool(value)
        elif value is not None and (hint is int or int in get_args(hint)):
            changes[key] = int(value)
        elif value is not None and (hint is float or (get_origin(hint) is not dict and float in get_args(hint))):
            changes[key] = float(value)
        else:
            changes[key] = value
    return dataclasses.replace(base, **changes)


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out
