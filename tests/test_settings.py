"""Flat OPENCLAW_* settings: unknown names, wrong types and ranges fail at start."""

from __future__ import annotations

import pytest
from scrapy.settings import Settings

from scrapy_openclaw.errors import OpenClawConfigError
from scrapy_openclaw.settings import DEFAULTS, validate_settings


def test_defaults_are_valid():
    validate_settings(Settings(DEFAULTS))


def test_every_setting_is_prefixed():
    assert all(name.startswith("OPENCLAW_") for name in DEFAULTS)


def test_unknown_setting_suggests_the_close_one():
    with pytest.raises(OpenClawConfigError, match="OPENCLAW_POLICY_FIEL: unknown.*OPENCLAW_POLICY"):
        validate_settings(Settings({"OPENCLAW_POLICY_FIEL": "x.yaml"}))


@pytest.mark.parametrize(
    ("name", "value", "fragment"),
    [
        ("OPENCLAW_METRICS_PORT", "abc", "expected int"),
        ("OPENCLAW_METRICS_PORT", 70000, "out of range"),
        ("OPENCLAW_CHECKPOINT_FLUSH", 0, "out of range"),
        ("OPENCLAW_HEALTH_ENABLED", "maybe", "expected bool"),
    ],
)
def test_bad_values_name_the_setting(name, value, fragment):
    with pytest.raises(OpenClawConfigError, match=f"setting {name}: .*{fragment}"):
        validate_settings(Settings({name: value}))


def test_command_line_strings_are_accepted():
    validate_settings(Settings({"OPENCLAW_METRICS_PORT": "9410", "OPENCLAW_HEALTH_ENABLED": "False"}))
