"""Progress in the log and on /metrics (issue 22): done + pending = discovered,
checked against what the chaos site really served; the per-domain table at
the first interval and at close; what a stalled crawl waits for."""

from __future__ import annotations

import http.client
import re
import time
import urllib.request
from collections import Counter
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from scrapy.utils.misc import build_from_crawler
from scrapy.utils.test import get_crawler

from scrapy_openclaw.metrics import MetricsExtension
from scrapy_openclaw.metrics.logtable import Progress, eta
from scrapy_openclaw.testing.crawl import read_result, start_crawl
from scrapy_openclaw.testing.servers import free_port, stop_process

PROGRESS = re.compile(
    r"OpenClaw progress: (\d+) done of (\d+) discovered.*?, (\d+) pending \((\d+) queued, (\d+) waiting, "
    r"(\d+) in flight\), ([\d.]+)/min over the last [\d.]+ s, ETA (\S+)"
)
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def scrape(port: int) -> dict[str, float] | None:
    try:
        text = _OPENER.open(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except (OSError, http.client.HTTPException):  # (not up yet, or the crawl exited mid-answer)
        return None
    return {
        s.labels["state"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "scrapy_openclaw_progress_requests"
    }


def test_a_stopped_crawl_reports_what_it_left_pending(chaos_server: Any, tmp_path: Any) -> None:
    """Stopped mid-crawl (SIGTERM, as one Ctrl-C) with a JOBDIR: the close line counts the requests
    the queue kept for the next run as pending (it read the queue after it was closed: "0 pending",
    beside 65 persisted, in a QA crawl), per domain too, and done + pending = discovered."""
    server = chaos_server({"hosts": [{"address": "127.0.0.2", "pages": 400, "links_per_page": "all"}], "seed": 4})
    settings = {
        "ADDONS": {"scrapy_openclaw.Addon": 100},
        "LOG_LEVEL": "INFO",
        "JOBDIR": str(tmp_path / "job"),
        "OPENCLAW_DLQ_ENABLED": False,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
        "DOWNLOAD_DELAY": 0.2,
    }
    proc = start_crawl(settings=settings, spider_args={"start_urls": server.start_urls}, out_dir=tmp_path / "crawl")
    try:
        for _ in range(600):  # (bounded: until a few pages are in)
            served = server.truth(include_requests=False)["hosts"]["127.0.0.2"]["total"]
            if served >= 5 or proc.poll() is not None:
                break
            time.sleep(0.1)
        stop_process(proc, timeout=60)  # (SIGTERM: a graceful stop)
    finally:
        stop_process(proc)
    result = read_result(tmp_path / "crawl", proc.returncode)
    assert result.stats.get("finish_reason") == "shutdown", result.log[-3000:]
    kept = result.stats["openclaw/queue/persisted"]
    assert kept > 0
    close = re.search(r"OpenClaw progress at close: (\d+) done of (\d+) discovered, (\d+) pending", result.log)
    assert close, result.log[-3000:]
    done, discovered, pending = map(int, close.groups())
    assert pending == kept and done + pending == discovered
    assert result.stats["openclaw/progress/pending"] == kept
    table = result.log[result.log.index("OpenClaw domains (top 1 of 1, whole crawl):") :].splitlines()
    assert int(table[2].split()[8]) == kept  # (the domain's pending column)


def test_progress_figures_match_the_site(chaos_server: Any, tmp_path: Any) -> None:
    server = chaos_server(
        {
            "hosts": [
                {"address": "127.0.0.2", "pages": 40, "links_per_page": 3, "latency": 0.08},
                {"address": "127.0.0.3", "pages": 25, "links_per_page": 3, "latency": 0.08, "not_found": [4]},
            ],
            "seed": 4,
        }
    )
    port = free_port()
    settings = {
        "ADDONS": {"scrapy_openclaw.Addon": 100},
        "LOG_LEVEL": "INFO",
        "LOGSTATS_INTERVAL": 0.5,
        "OPENCLAW_METRICS_PORT": port,
        "OPENCLAW_DLQ_URI": str(tmp_path / "dl.jsonl"),
        "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
    }
    proc = start_crawl(settings=settings, spider_args={"start_urls": server.start_urls}, out_dir=tmp_path / "crawl")
    live: list[dict[str, float]] = []
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:  # bounded
            sample = scrape(port)
            if sample and sample.get("discovered"):
                live.append(sample)
            time.sleep(0.3)
        proc.wait(60)
    finally:
        stop_process(proc, timeout=10)
    result = read_result(tmp_path / "crawl", proc.returncode)
    assert result.stats.get("finish_reason") == "finished", result.log[-3000:]

    truth = server.truth()
    requested = {
        (h["base_url"], r["path"]) for h in truth["hosts"].values() for r in h["requests"] if r["path"] != "/robots.txt"
    }
    lines = [tuple(m.groups()) for m in PROGRESS.finditer(result.log)]
    assert lines, result.log[-3000:]
    for done, discovered, pending, queued, waiting, in_flight, _rate, _eta in lines:
        assert int(done) + int(pending) == int(discovered)
        assert int(pending) == int(queued) + int(waiting) + int(in_flight)
        assert int(discovered) <= len(requested)
    assert any(int(line[2]) > 0 for line in lines)  # seen mid-crawl, with work pending
    assert live, "no /metrics sample during the crawl"
    for sample in live:
        assert sample["done"] + sample["pending"] == sample["discovered"]
        assert sample["pending"] == sample["queued"] + sample["waiting"] + sample["in_flight"]
    close = re.search(r"OpenClaw progress at close: (\d+) done of (\d+) discovered, (\d+) pending", result.log)
    assert close, result.log[-3000:]
    assert int(close.group(1)) == int(close.group(2)) == len(requested) and close.group(3) == "0"
    assert result.stats["openclaw/progress/done"] == len(requested)
    # the table: at the first interval and once more at close, with the whole crawl's figures
    assert "OpenClaw domains (top 2 of 2, last 0.5 s):" in result.log
    table = result.log[result.log.index("OpenClaw domains (top 2 of 2, whole crawl):") :].splitlines()
    assert table[1].split() == [
        "domain",
        "pages/min",
        "health",
        "rate/s",
        "retries",
        "circuit",
        "held",
        "done",
        "pending",
        "failed",
        "dead",
        "ETA",
    ]
    rows = {row.split()[0]: row.split() for row in table[2:4]}
    pages = {  # done: each URL once, answered or given up (the 404 page is done, as a dead letter)
        host: len({r["path"] for r in h["requests"] if r["path"] != "/robots.txt"})
        for host, h in truth["hosts"].items()
    }
    for host, row in rows.items():
        assert int(row[7]) == pages[host]
        assert row[8] == "0"
    assert sum(int(row[7]) for row in rows.values()) == int(close.group(1))
    assert rows["127.0.0.3"][10] == "1"  # the 404 page's dead letter


def test_progress_line_says_what_a_stalled_crawl_waits_for() -> None:
    crawler = get_crawler(settings_dict={"OPENCLAW_LOG_DOMAINS": 3, "LOGSTATS_INTERVAL": 10})
    ext = build_from_crawler(MetricsExtension, crawler)
    table = ext.logtable
    assert table is not None
    progress = Progress(discovered=30, queued=0, waiting=2, in_flight=0, domains={"127.0.0.5": 2})
    first = table.progress_line(progress, Counter(), sent=5)
    assert first.startswith("OpenClaw progress: 28 done of 30 discovered (93%), 2 pending (0 queued, 2 waiting")
    assert "168.0/min over the last 10 s, ETA 1s" in first and "nothing sent" not in first
    line = table.progress_line(progress, Counter(), sent=0)  # an interval without progress
    assert "0.0/min" in line and "ETA ?" in line and "nothing sent: 2 request(s) wait for 127.0.0.5" in line
    assert eta(120, 2.0) == "1m00s" and eta(0, 1.0) == "-" and eta(9000, 1.0) == "2h30m"


def test_an_operators_hold_is_named_in_the_stall_line_and_counted_as_held_time() -> None:
    settings = {
        "OPENCLAW_LOG_DOMAINS": 3,
        "LOGSTATS_INTERVAL": 10,
        "DOWNLOADER_MIDDLEWARES": {"scrapy_openclaw.health.DomainHealthMiddleware": 600},
    }
    crawler = get_crawler(settings_dict=settings)
    ext = build_from_crawler(MetricsExtension, crawler)
    table = ext.logtable
    registry: Any = ext.collector.health()
    assert table is not None and registry is not None
    now = time.time()
    registry.control("127.0.0.5", now - 20, ctl_hold=now + 100)  # held by `scrapy openclaw hold` 20 s ago
    progress = Progress(discovered=3, queued=0, waiting=2, in_flight=0, domains={"127.0.0.5": 2})
    line = table.progress_line(progress, Counter(), sent=0)
    assert re.search(r"2 request\(s\) wait for 127\.0\.0\.5, held by the operator for (99|100) s", line), line
    assert registry.state("127.0.0.5").blocked_seconds == pytest.approx(20, abs=1)
