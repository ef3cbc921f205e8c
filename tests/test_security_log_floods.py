"""A server that sends a different bad ``Retry-After`` on every answer cannot flood the log:
the first warning per site and kind is logged, the rest counted and summarised."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from scrapy_openclaw._condensed import CondensedWarnings
from scrapy_openclaw.testing.crawl import run_crawl

ANSWERS = 1000
#: Cheap 429s: no penalty, no circuit, no slowdown, one attempt each (the test is about the log).
POLICY = {
    "defaults": {
        "health": {
            "throttle_penalty": 0,
            "circuit_failures": 100000,
            "initial_rate": 5000,
            "min_rate": 5000,
            "rate_decrease": 0.99,
        },
        "retry": {"protocol_retryable": {"max_attempts": 1}, "page": {"max_attempts": 1}},
    }
}


def test_a_thousand_different_bad_retry_after_values_give_a_few_warnings(chaos_server: Any, tmp_path: Path) -> None:
    site = chaos_server(
        {
            "hosts": [
                {"address": "127.0.0.2", "pages": ANSWERS, "rate_limit": {"rate": 0, "every": 1, "retry_after": "x{n}"}}
            ]
        }
    )
    base = site.start_urls[0]
    result = run_crawl(
        settings={
            "ADDONS": {"scrapy_openclaw.Addon": 100},
            "OPENCLAW_POLICY": POLICY,
            "OPENCLAW_DLQ_URI": str(tmp_path / "dead.jsonl"),
            "CONCURRENT_REQUESTS": 16,
            "LOG_LEVEL": "INFO",
        },
        spider_args={"start_urls": ",".join(f"{base}page/{n}" for n in range(ANSWERS))},
        timeout=240,
        out_dir=tmp_path / "r",
    )
    assert result.returncode == 0, result.log[-3000:]
    truth = site.truth(include_requests=False)["hosts"]["127.0.0.2"]
    assert truth["statuses"]["429"] == ANSWERS  # the site's record: every answer had a bad value
    assert result.stats["openclaw/health/retry_after_ignored"] == ANSWERS  # each one counted
    warnings = [line for line in result.log.splitlines() if " WARNING: " in line and "Retry-After" in line]
    assert 1 <= len(warnings) <= 5, "\n".join(warnings[:20])
    assert "Ignoring malformed Retry-After header 'x" in warnings[0] and "127.0.0.2" in warnings[0]
    summary = [line for line in warnings if "more warnings like this one were not logged" in line]
    assert len(summary) == 1 and f"{ANSWERS - 1} more warnings" in summary[0]  # one per answer, at close


def test_condensed_warnings_count_repeats_and_report_them(caplog: Any) -> None:
    now = [0.0]
    log = CondensedWarnings(logging.getLogger("test.condensed"), every=60.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="test.condensed"):
        for n in range(200):
            log.warn("a.example", "bad value %(v)s from a.example", {"v": n})
        log.warn("b.example", "bad value %(v)s from b.example", {"v": 0})  # another kind: logged
        now[0] = 61.0
        log.warn("a.example", "bad value %(v)s from a.example", {"v": "late"})
        log.warn("a.example", "bad value %(v)s from a.example", {"v": "later"})
        assert log.summarise() == 1
        assert log.summarise() == 0  # reported once
        for reader in range(3):  # one event told by three readers: one warning, nothing counted
            log.warn("c.example", "bad value from c.example (reader %(r)s)", {"r": reader}, same="answer-1")
        log.warn("c.example", "bad value from c.example (reader %(r)s)", {"r": 0}, same="answer-2")
        assert log.summarise() == 1
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "bad value 0 from a.example",
        "bad value 0 from b.example",
        "bad value late from a.example (199 more like it since the last such warning)",
        "1 more warnings like this one were not logged: bad value later from a.example",
        "bad value from c.example (reader 0)",
        "1 more warnings like this one were not logged: bad value from c.example (reader 0)",
    ]
