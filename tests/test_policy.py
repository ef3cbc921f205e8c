"""Policy files and OPENCLAW_POLICY: layering, matching, and file/line/key errors."""

from __future__ import annotations

import textwrap

import pytest
from scrapy.settings import Settings

from scrapy_openclaw.errors import OpenClawConfigError
from scrapy_openclaw.policy import PolicySet


def load(tmp_path, text: str, **settings) -> PolicySet:
    path = tmp_path / "openclaw.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return PolicySet.from_settings(Settings({"OPENCLAW_POLICY_FILE": str(path), **settings}))


def error_of(tmp_path, text: str, **settings) -> str:
    with pytest.raises(OpenClawConfigError) as info:
        load(tmp_path, text, **settings)
    return str(info.value)


def test_builtin_defaults_without_any_policy():
    policy = PolicySet.from_settings(Settings()).for_domain("example.com")
    assert policy.health.base_concurrency is None  # Scrapy's own per-domain concurrency
    assert policy.retry.parse.max_attempts == 3
    assert policy.deadline.expired == "boost"


def test_most_specific_rule_wins_and_rules_layer(tmp_path):
    policies = load(
        tmp_path,
        """
        defaults:
          health: {base_concurrency: 4, burst: 3}
        domains:
          "*.example.com":
            health: {base_concurrency: 2, min_rate: 1}
          api.example.com:
            health: {base_concurrency: 1}
          "*":
            retry: {budget_ratio: 0.5}
        """,
    )
    api = policies.for_domain("api.example.com")
    assert (api.health.base_concurrency, api.health.min_rate, api.health.burst) == (1, 1.0, 3)
    assert api.retry.budget_ratio == 0.5  # the catch-all still applies beneath
    www = policies.for_domain("www.example.com")
    assert (www.health.base_concurrency, www.health.min_rate) == (2, 1.0)
    # "*.example.com" does not match the bare domain
    assert policies.for_domain("example.com").health.base_concurrency == 4
    assert policies.for_domain("other.org").health.base_concurrency == 4


def test_partial_retry_class_override_keeps_that_class_defaults(tmp_path):
    parse = load(tmp_path, "defaults: {retry: {parse: {max_attempts: 5}}}").defaults.retry.parse
    assert (parse.max_attempts, parse.base_delay, parse.max_delay) == (5, 0.5, 10.0)


def test_file_overrides_settings_dict(tmp_path):
    policies = load(
        tmp_path,
        "defaults: {health: {burst: 9}}",
        OPENCLAW_POLICY={"defaults": {"health": {"burst": 2, "base_concurrency": 3}}},
    )
    assert (policies.defaults.health.burst, policies.defaults.health.base_concurrency) == (9, 3)


def test_malformed_yaml_names_file_and_line(tmp_path):
    message = error_of(tmp_path, "defaults:\n  health: {burst: [3\n")
    assert "openclaw.yaml" in message and "line 3" in message and "invalid YAML" in message


def test_out_of_range_value_names_file_line_and_key(tmp_path):
    message = error_of(
        tmp_path,
        """
        domains:
          "*.example.com":
            health:
              min_rate: -1
        """,
    )
    assert "openclaw.yaml, line 5" in message
    assert "domains.*.example.com.health.min_rate" in message
    assert "out of range" in message


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("defaults: {retry: {network: {jiter: full}}}", "defaults.retry.network.jiter: unknown key"),
        ("defaults: {retry: {network: {jitter: wild}}}", "must be one of"),
        ("defaults: {health: {burst: many}}", "defaults.health.burst: must be a number"),
        ("defaults: {health: {burst: 2.5}}", "must be a whole number"),
        ("domains: {'exa mple.com': {}}", "bad host pattern"),
        ("domains: [a, b]", "must be a mapping"),
        ("defualts: {}", "unknown key"),
        ("defaults: {deadline: {expired: later}}", "defaults.deadline.expired"),
    ],
)
def test_invalid_values_are_rejected_with_their_key(tmp_path, text, fragment):
    assert fragment in error_of(tmp_path, text)


def test_settings_dict_is_validated_the_same_way():
    with pytest.raises(OpenClawConfigError, match=r"setting OPENCLAW_POLICY: key defaults.health.burst: out of range"):
        PolicySet.from_settings(Settings({"OPENCLAW_POLICY": {"defaults": {"health": {"burst": 0}}}}))


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(OpenClawConfigError, match="cannot read policy file"):
        PolicySet.from_settings(Settings({"OPENCLAW_POLICY_FILE": str(tmp_path / "nope.yaml")}))


def test_empty_file_means_defaults(tmp_path):
    assert load(tmp_path, "").defaults == PolicySet.from_settings(Settings()).defaults
