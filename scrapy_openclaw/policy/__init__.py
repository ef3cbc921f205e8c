"""Per-domain policies: defaults plus overrides by host pattern, validated once.

A policy has one part per component (``health``, ``retry``, ``deadline``): the
dataclass defaults, then ``OPENCLAW_POLICY``, then ``OPENCLAW_POLICY_FILE``, each
with rules by host pattern (docs/reference/policy.md). The parts: :mod:`.policies`,
:mod:`.loading`, :mod:`.validation`, :mod:`.matching`; every name is importable here.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

from scrapy_openclaw.exceptions import OpenClawConfigError
from scrapy_openclaw.policy.loading import _HOST_PATTERN as _HOST_PATTERN
from scrapy_openclaw.policy.loading import _ORDERED as _ORDERED
from scrapy_openclaw.policy.loading import _Loader, inline_policy, read_policy_file
from scrapy_openclaw.policy.matching import _Rule
from scrapy_openclaw.policy.policies import (
    DeadlinePolicy,
    DomainPolicy,
    ExpiredMode,
    HealthPolicy,
    JitterMode,
    RetryClassPolicy,
    RetryPolicy,
)
from scrapy_openclaw.policy.policies import _range as _range
from scrapy_openclaw.policy.validation import _build, _deep_merge
from scrapy_openclaw.policy.validation import _check_number as _check_number
from scrapy_openclaw.policy.validation import _validate as _validate
from scrapy_openclaw.policy.validation import _validate_value as _validate_value
from scrapy_openclaw.runtime import shared
from scrapy_openclaw.settings import OpenClawSettings
from scrapy_openclaw.startup import refuse_start

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings

__all__ = [
    "DeadlinePolicy",
    "DomainPolicy",
    "ExpiredMode",
    "HealthPolicy",
    "JitterMode",
    "PolicySet",
    "RetryClassPolicy",
    "RetryPolicy",
    "inline_policy",
]


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
        return cls.load(OpenClawSettings.from_settings(settings))

    @classmethod
    def load(cls, config: OpenClawSettings) -> PolicySet:
        """The policy layers (inline, then the file) of *config*, validated."""
        loader = _Loader()
        loader.add(config.policy, source="setting OPENCLAW_POLICY", lines={})
        path = config.policy_file
        if path:
            data, lines, source = read_policy_file(path)
            loader.add(data, source=source, lines=lines)
        loader.check()
        return cls(loader.defaults, loader.rules())

    @classmethod
    def for_crawler(cls, crawler: Crawler) -> PolicySet:
        """The crawl's policies, loaded once; the flat settings are validated once, by
        :meth:`OpenClawSettings.for_crawler <scrapy_openclaw.settings.OpenClawSettings.for_crawler>`."""
        config = OpenClawSettings.for_crawler(crawler)
        try:
            return shared(crawler, "policy", lambda: cls.load(config))
        except OpenClawConfigError as exc:
            refuse_start(crawler, exc)
            raise
