"""The shipped Prometheus alerting rules (scrapy_openclaw/dashboards/prometheus-openclaw-rules.yml).

``promtool`` is not pip-installable, so the rules are checked by a parser:
the file's structure, the PromQL's brackets, durations and selectors, and
that every metric and label a rule names is really served, by the
``/metrics`` of a real crawl (a chaos site with a ban host that is given up)
and by the scheduler's registry. The same crawl runs the optional Spidermon
dead-letter monitor when Spidermon is installed.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from scrapy_openclaw.schedule.metrics import ScheduleMetrics
from scrapy_openclaw.testing.chaos import BAN_MARKER
from scrapy_openclaw.testing.crawl import read_result, start_crawl
from scrapy_openclaw.testing.presets import address, ban_site
from scrapy_openclaw.testing.servers import free_port, stop_process
from tests.test_metrics import Pushgateway, scrape

RULES = Path(__file__).parents[1] / "scrapy_openclaw" / "dashboards" / "prometheus-openclaw-rules.yml"
_DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")
_NAME = re.compile(r"\b((?:scrapy_openclaw|openclaw_schedule)_[a-z0-9_]+)\b(\{[^}]*\})?")
_MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"[^"]*"')
_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
_TEMPLATE_LABEL = re.compile(r"\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)")
#: What the issue asks the rules to cover, by the metric each must use.
REQUIRED = {
    "dead-letter rate": "scrapy_openclaw_dlq_dead_letters_total",
    "circuit open too long": "scrapy_openclaw_health_circuit_state",
    "domain given up": "scrapy_openclaw_health_given_up_domains",
    "crawl stalled": "scrapy_openclaw_scheduler_pending_requests",
    "scheduler run failed or missed": "openclaw_schedule_runs_total",
}


def _rules() -> list[dict[str, Any]]:
    data = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return [rule for group in data["groups"] for rule in group["rules"]]


def test_rules_file_structure() -> None:
    data = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    assert set(data) == {"groups"}
    names: list[str] = []
    for group in data["groups"]:
        assert set(group) == {"name", "rules"} and group["rules"]
        for rule in group["rules"]:
            assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, rule
            assert re.fullmatch(r"OpenClaw[A-Z][A-Za-z]+", rule["alert"])
            names.append(rule["alert"])
            assert _DURATION.match(rule["for"]), rule["for"]
            assert rule["labels"]["severity"] in ("warning", "critical")
            assert set(rule["annotations"]) == {"summary", "description"}
            expr = rule["expr"]
            stack = []
            for ch in expr:  # brackets balance
                if ch in "([{":
                    stack.append(ch)
                elif ch in ")]}":
                    assert stack and "([{"[")]}".index(ch)] == stack.pop(), (rule["alert"], expr)
            assert not stack, expr
            for window in re.findall(r"\[([^\]]+)\]", expr):
                assert _DURATION.match(window), window
            assert expr.count('"') % 2 == 0
    assert len(names) == len(set(names))
    used = " ".join(r["expr"] for r in _rules())
    for what, metric in REQUIRED.items():
        assert metric in used, what


def _served(text: str, into: dict[str, set[str]]) -> None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            into.setdefault(sample.name, set()).update(sample.labels)


def test_every_metric_and_label_a_rule_uses_is_served(chaos_server: Any, tmp_out: Path) -> None:
    server = chaos_server(ban_site(pages=8, ban_after=3, ban_seconds=None))
    banned = address(1)
    port = free_port()
    gateway = Pushgateway()
    settings: dict[str, Any] = {
        "ADDONS": {"scrapy_openclaw.Addon": 100},
        "LOG_LEVEL": "INFO",
        "OPENCLAW_DLQ_URI": str(tmp_out / "dead.jsonl"),
        "OPENCLAW_METRICS_PORT": port,
        "OPENCLAW_METRICS_PUSHGATEWAY": gateway.address,
        "OPENCLAW_POLICY": {
            "domains": {
                banned: {
                    "health": {
                        "ban_markers": [BAN_MARKER],
                        "blocked_hold": 0.3,
                        "give_up_after": 2,
                        "circuit_cooldown": 0.5,
                        "circuit_cooldown_max": 1.0,
                    },
                    "retry": {"blocked": {"max_attempts": 2, "base_delay": 0.1, "max_delay": 0.2}},
                }
            }
        },
        "OPENCLAW_DLQ_ALERT_COUNT": 3,
    }
    spidermon = _spidermon_available()
    if spidermon:
        settings.update(
            {
                "SPIDERMON_ENABLED": True,
                "EXTENSIONS": {"spidermon.contrib.scrapy.extensions.Spidermon": 600},
                "SPIDERMON_SPIDER_CLOSE_MONITORS": ["scrapy_openclaw.monitors.DeadLetterMonitorSuite"],
            }
        )
    served: dict[str, set[str]] = {}
    proc = start_crawl(settings=settings, spider_args={"start_urls": server.start_urls}, out_dir=tmp_out)
    try:
        deadline = time.monotonic() + 240  # (a hang guard: the crawl's own end is the event)
        while proc.poll() is None and time.monotonic() < deadline:
            text = scrape(port)
            if text:
                _served(text, served)
            time.sleep(0.3)
        assert proc.poll() is not None, "crawl did not finish in time"
    finally:
        stop_process(proc)
        gateway.stop()
    result = read_result(tmp_out, proc.returncode)
    assert result.returncode == 0, result.log[-3000:]
    assert served, "no /metrics scrape succeeded during the crawl"
    assert len(gateway.received) == 1
    _served(gateway.received[0][1], served)  # the final state, pushed at close from the same registry
    schedule = ScheduleMetrics()
    for outcome in ("success", "failed", "missed"):
        schedule.outcome("nightly", outcome, end=time.time())
    _served(generate_latest(schedule.registry).decode(), served)

    assert result.stats["openclaw/health/given_up_domains"] == 1  # the rules' inputs were live
    assert any(v for k, v in result.stats.items() if k.startswith("openclaw/ban/domain/"))
    for rule in _rules():
        expr = rule["expr"]
        labels: set[str] = set()
        for name, selector in _NAME.findall(expr):
            assert name in served, (rule["alert"], name, sorted(served))
            labels |= served[name]
            for label, _ in _MATCHER.findall(selector or ""):
                assert label in served[name], (rule["alert"], name, label)
        for grouping in _GROUPING.findall(expr):
            for label in filter(None, (x.strip() for x in grouping.split(","))):
                assert label in labels, (rule["alert"], label)
        for text in rule["annotations"].values():
            for label in _TEMPLATE_LABEL.findall(text):
                assert label in labels, (rule["alert"], label)

    if spidermon:  # 4+ dead letters against OPENCLAW_DLQ_ALERT_COUNT=3: the monitor fails
        assert "Dead-letter count" in result.log and "OPENCLAW_DLQ_ALERT_COUNT=3" in result.log, result.log[-3000:]


def _spidermon_available() -> bool:
    try:
        import scrapy_openclaw.monitors  # noqa: F401
    except ImportError:
        return False
    return True


def test_spidermon_monitor_is_optional() -> None:
    pytest.importorskip("spidermon")
    from scrapy_openclaw.monitors import DeadLetterMonitor, DeadLetterMonitorSuite

    assert DeadLetterMonitorSuite.monitors == [DeadLetterMonitor]
