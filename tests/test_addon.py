"""The add-on: what it wires, that the user's settings win, and bad input at start."""

from __future__ import annotations

import pytest
from scrapy.downloadermiddlewares.retry import RetryMiddleware
from scrapy.utils.misc import load_object
from scrapy.utils.test import get_crawler

from scrapy_openclaw import Addon, OpenClawConfigError
from scrapy_openclaw.addon import (
    DOWNLOADER_MIDDLEWARES,
    EXTENSIONS,
    ITEM_PIPELINES,
    PRIORITY_QUEUE,
    SPIDER_MIDDLEWARES,
)
from scrapy_openclaw.testing.crawl import run_crawl
from scrapy_openclaw.testing.presets import fault_free_site

ADDON = {"ADDONS": {Addon: 100}}


def components(crawler, name: str) -> dict:
    """The effective component dict, with classes as keys."""
    return {load_object(c): order for c, order in crawler.settings.getwithbase(name).items()}


def order(crawler, name: str, path: str):
    return components(crawler, name)[load_object(path)]


def test_every_wired_class_path_imports():
    for table in (DOWNLOADER_MIDDLEWARES, SPIDER_MIDDLEWARES, ITEM_PIPELINES, EXTENSIONS):
        for path in table:
            assert isinstance(load_object(path), type), path
    assert isinstance(load_object(PRIORITY_QUEUE), type)


def test_addon_wires_every_component_and_replaces_scrapy_retry():
    crawler = get_crawler(settings_dict=ADDON)
    for name, table in (
        ("DOWNLOADER_MIDDLEWARES", DOWNLOADER_MIDDLEWARES),
        ("SPIDER_MIDDLEWARES", SPIDER_MIDDLEWARES),
        ("ITEM_PIPELINES", ITEM_PIPELINES),
        ("EXTENSIONS", EXTENSIONS),
    ):
        for path, expected in table.items():
            assert order(crawler, name, path) == expected, (name, path)
    assert order(crawler, "DOWNLOADER_MIDDLEWARES", "scrapy.downloadermiddlewares.retry.RetryMiddleware") is None
    assert crawler.settings["SCHEDULER_PRIORITY_QUEUE"] == PRIORITY_QUEUE


def test_addon_equals_the_manual_configuration():
    manual = get_crawler(
        settings_dict={
            "DOWNLOADER_MIDDLEWARES": {**DOWNLOADER_MIDDLEWARES, RetryMiddleware: None},
            "SPIDER_MIDDLEWARES": SPIDER_MIDDLEWARES,
            "ITEM_PIPELINES": ITEM_PIPELINES,
            "EXTENSIONS": {**EXTENSIONS, "scrapy.extensions.feedexport.FeedExporter": None},
            "SCHEDULER_PRIORITY_QUEUE": PRIORITY_QUEUE,
        }
    )
    addon = get_crawler(settings_dict=ADDON)
    for name in ("DOWNLOADER_MIDDLEWARES", "SPIDER_MIDDLEWARES", "ITEM_PIPELINES", "EXTENSIONS"):
        assert components(addon, name) == components(manual, name), name
    assert addon.settings["SCHEDULER_PRIORITY_QUEUE"] == manual.settings["SCHEDULER_PRIORITY_QUEUE"]


def test_user_settings_win_over_the_addon():
    crawler = get_crawler(
        settings_dict={
            **ADDON,
            "SCHEDULER_PRIORITY_QUEUE": "scrapy.pqueues.ScrapyPriorityQueue",
            "DOWNLOADER_MIDDLEWARES": {"scrapy_openclaw.health.DomainHealthMiddleware": 123},
            "EXTENSIONS": {"scrapy_openclaw.metrics.MetricsExtension": None},
        }
    )
    assert crawler.settings["SCHEDULER_PRIORITY_QUEUE"] == "scrapy.pqueues.ScrapyPriorityQueue"
    assert order(crawler, "DOWNLOADER_MIDDLEWARES", "scrapy_openclaw.health.DomainHealthMiddleware") == 123
    assert order(crawler, "EXTENSIONS", "scrapy_openclaw.metrics.MetricsExtension") is None


def test_disabling_our_retry_keeps_scrapys():
    crawler = get_crawler(
        settings_dict={**ADDON, "DOWNLOADER_MIDDLEWARES": {"scrapy_openclaw.retry.ClassifiedRetryMiddleware": None}}
    )
    assert order(crawler, "DOWNLOADER_MIDDLEWARES", "scrapy.downloadermiddlewares.retry.RetryMiddleware") == 550


def test_bad_policy_stops_the_crawler_at_creation(tmp_path):
    policy = tmp_path / "openclaw.yaml"
    policy.write_text("defaults:\n  health:\n    burst: 0\n", encoding="utf-8")
    with pytest.raises(OpenClawConfigError, match=r"openclaw.yaml, line 3: key defaults.health.burst: out of range"):
        get_crawler(settings_dict={**ADDON, "OPENCLAW_POLICY_FILE": str(policy)})


def test_bad_distributed_switch_is_a_config_error_at_creation():
    with pytest.raises(OpenClawConfigError, match="OPENCLAW_DISTRIBUTED"):
        get_crawler(settings_dict={**ADDON, "OPENCLAW_DISTRIBUTED": "maybe"})


@pytest.mark.parametrize(
    ("policy_text", "expected"),
    [
        ("defaults:\n  health: {burst: [1\n", "openclaw.yaml, line 3: invalid YAML"),
        (
            "domains:\n  '127.0.0.2':\n    retry:\n      network: {max_attempts: -2}\n",
            "openclaw.yaml, line 4: key domains.127.0.0.2.retry.network.max_attempts: out of range",
        ),
    ],
)
def test_bad_policy_stops_a_real_crawl_before_any_request(chaos_server, tmp_path, policy_text, expected):
    server = chaos_server(fault_free_site(n_hosts=1, pages=5))
    policy = tmp_path / "openclaw.yaml"
    policy.write_text(policy_text, encoding="utf-8")
    result = run_crawl(
        settings={"ADDONS": {"scrapy_openclaw.Addon": 100}, "OPENCLAW_POLICY_FILE": str(policy)},
        spider_args={"start_urls": server.start_urls},
        out_dir=tmp_path / "out",
        timeout=60,
    )
    assert result.returncode != 0
    assert expected in result.log
    assert server.truth()["hosts"]["127.0.0.2"]["total"] == 0


def test_per_domain_policy_applies_to_the_right_host_only(tmp_path):
    from scrapy_openclaw.policy import PolicySet

    policy = tmp_path / "openclaw.yaml"
    policy.write_text("domains:\n  '127.0.0.3':\n    health: {base_concurrency: 1}\n", encoding="utf-8")
    crawler = get_crawler(settings_dict={**ADDON, "OPENCLAW_POLICY_FILE": str(policy)})
    policies = PolicySet.for_crawler(crawler)
    assert policies.for_domain("127.0.0.3").health.base_concurrency == 1
    assert policies.for_domain("127.0.0.2").health.base_concurrency is None
