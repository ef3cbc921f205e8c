"""OpenClawSettings: every OPENCLAW_* setting, validated once per crawl, frozen and typed."""

from __future__ import annotations

import dataclasses

import pytest
from scrapy.settings import Settings
from scrapy.utils.misc import build_from_crawler
from scrapy.utils.test import get_crawler

from scrapy_openclaw import Addon
from scrapy_openclaw.dlq import DeadLetterPipeline
from scrapy_openclaw.exceptions import OpenClawConfigError
from scrapy_openclaw.settings import DEFAULTS, OpenClawSettings, field_name


def test_one_field_per_setting():
    fields = [f.name for f in dataclasses.fields(OpenClawSettings)]
    assert fields == [field_name(name) for name in DEFAULTS]


def test_defaults_when_unset():
    config = OpenClawSettings.from_settings(Settings())
    for name, default in DEFAULTS.items():
        value = getattr(config, field_name(name))
        assert value == (tuple(default) if isinstance(default, list) else default), name


def test_typed():
    config = OpenClawSettings.from_settings(
        Settings(
            {
                "OPENCLAW_DLQ_ALERT_RATIO": "0.25",
                "OPENCLAW_DLQ_ALERT_COUNT": "7",
                "OPENCLAW_DLQ_ALERT_CLOSE": "True",
                "OPENCLAW_STORED_SCHEMES": "https",
                "OPENCLAW_METRICS_HOST": "",
            }
        )
    )
    assert config.dlq_alert_ratio == 0.25
    assert config.dlq_alert_count == 7
    assert config.dlq_alert_close is True
    assert config.stored_schemes == ("https",)
    assert config.metrics_host == DEFAULTS["OPENCLAW_METRICS_HOST"]  # "" falls back, as before


def test_frozen():
    config = OpenClawSettings.from_settings(Settings())
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.dlq_alert_ratio = 0.5  # type: ignore[misc]


def test_one_per_crawler():
    crawler = get_crawler(settings_dict={"OPENCLAW_DLQ_ALERT_COUNT": 3})
    config = OpenClawSettings.for_crawler(crawler)
    assert config is OpenClawSettings.for_crawler(crawler)
    assert config.dlq_alert_count == 3
    assert OpenClawSettings.for_crawler(get_crawler()) is not config


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("OPENCLAW_DLQ_ALERT_RATIO", 2.0),
        ("OPENCLAW_DLQ_ALERT_COUNT", "many"),
        ("OPENCLAW_SNAPSHOT_COUNT", -1),
        ("OPENCLAW_RETRY_HTTP_CODES", [999]),
    ],
)
def test_bad_value_names_the_setting(name, value):
    with pytest.raises(OpenClawConfigError, match=name):
        OpenClawSettings.for_crawler(get_crawler(settings_dict={name: value}))


def test_unknown_setting_is_a_config_error():
    with pytest.raises(OpenClawConfigError, match="did you mean OPENCLAW_DLQ_ALERT_RATIO"):
        OpenClawSettings.from_settings(Settings({"OPENCLAW_DLQ_ALERT_RATI": 0.5}))


def test_bad_ratio_with_manual_wiring_fails_at_start():
    """Without the add-on, a bad value used to switch the DLQ off with a warning."""
    crawler = get_crawler(settings_dict={"OPENCLAW_DLQ_ALERT_RATIO": 1.5})
    with pytest.raises(OpenClawConfigError, match="OPENCLAW_DLQ_ALERT_RATIO"):
        build_from_crawler(DeadLetterPipeline, crawler)


def test_bad_ratio_with_the_addon_fails_at_start():
    with pytest.raises(OpenClawConfigError, match="OPENCLAW_DLQ_ALERT_RATIO"):
        get_crawler(settings_dict={"ADDONS": {Addon: 100}, "OPENCLAW_DLQ_ALERT_RATIO": 1.5})
