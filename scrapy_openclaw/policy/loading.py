"""The policy layers (``OPENCLAW_POLICY``, then ``OPENCLAW_POLICY_FILE``) read, validated and merged.

The loader remembers where each key was set, so that a contradiction between
two keys (``min_rate`` above ``base_rate``) names both places.
"""

from __future__ import annotations

import re
from typing import Any

from scrapy_openclaw.paths import read_bytes
from scrapy_openclaw.policy.matching import _Rule
from scrapy_openclaw.policy.policies import DomainPolicy
from scrapy_openclaw.policy.validation import _build, _deep_merge, _validate
from scrapy_openclaw.settings import inline_policy as inline_policy
from scrapy_openclaw.yamlconfig import MAX_BYTES, Where, load_yaml_bytes

_HOST_PATTERN = re.compile(r"^(\*\.)?([a-z0-9_-]+|\*)(\.([a-z0-9_-]+))*$|^\*$|^[0-9.:\[\]a-f]+$")


def read_policy_file(value: Any) -> tuple[Any, dict[tuple, int], str]:
    """``OPENCLAW_POLICY_FILE`` parsed: (data, line of each key, the file's resolved name for messages).

    A path resolves as every path setting does (:mod:`scrapy_openclaw.paths`);
    ``pkg://package/file.yaml`` reads package data, so the policy travels in a
    scrapyd egg or a wheel with the project.
    """
    raw, source = read_bytes(value, setting="OPENCLAW_POLICY_FILE", kind="policy file", limit=MAX_BYTES)
    data, lines = load_yaml_bytes(raw, source, kind="policy file")
    return data, lines, source


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
