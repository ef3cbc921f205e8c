"""The politeness report against the chaos site's own record: a host that rate-limits with
Retry-After, a flaky one, one whose robots.txt asks for a Crawl-delay; the stored file read back
by ``scrapy openclaw-report`` (a real subprocess); two distributed workers merged in Redis.

(The agreement of the report with the log table, the stats and /metrics is ``test_figures.py``'s.)
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from scrapy.settings import Settings

from scrapy_openclaw.distributed.connection import client_from_settings
from scrapy_openclaw.dlq import JsonlStore
from scrapy_openclaw.metrics.peaks import RESOLUTION
from scrapy_openclaw.report.model import ReportError
from scrapy_openclaw.report.shared import SharedReport
from scrapy_openclaw.report.store import read_report, report_path
from scrapy_openclaw.testing.chaos.graph import busiest_second_bounds
from scrapy_openclaw.testing.crawl import run_crawl
from scrapy_openclaw.testing.servers import subprocess_env

LIMITED, FLAKY, DELAYED = "127.0.0.2", "127.0.0.3", "127.0.0.4"
DISALLOWED = ["/page/3", "/page/4"]  # (DELAYED's robots.txt; every page links to them)
CRAWL_DELAY = 1.5  # well over 1 s: no 1 s window holds two pages, on either side's clock
SITE = {
    "hosts": [
        {
            "address": LIMITED,
            "pages": 80,
            "links_per_page": "all",
            "rate_limit": {"rate": 25.0, "burst": 5, "retry_after": "1"},
        },
        {
            "address": FLAKY,
            "pages": 24,
            "links_per_page": 4,
            "fail_windows": {
                "period": 2.0,
                "down": 0.5,
                "status": 503,
                "offset": 0.5,
            },  # (each period starts up: see the clock)
            "not_found": [5],
            "status_script": {9: [503]},  # broken for good: retried, then a dead letter
        },
        {
            "address": DELAYED,
            "pages": 5,
            "links_per_page": "all",
            "robots_txt": f"User-agent: *\nCrawl-delay: {CRAWL_DELAY}\nDisallow: /page/3\nDisallow: /page/4\n",
        },
    ],
    "seed": 7,
    "clock": "first_request",  # the crawl's first requests (robots.txt, the roots) meet an up window
}


def scrapy_cmd(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "scrapy", *args],
        cwd=cwd,
        env=subprocess_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def crawled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One crawl of SITE (module-scoped: the tests below read its record and its report)."""
    from scrapy_openclaw.testing.servers import ChaosServer

    project = tmp_path_factory.mktemp("project")
    (project / "scrapy.cfg").write_text("[settings]\n", encoding="utf-8")
    report_file = project / "openclaw-data" / "chaos" / "report.json"  # the default place, see below
    settings = {
        "ADDONS": {"scrapy_openclaw.Addon": 100},
        "ROBOTSTXT_OBEY": True,
        "DOWNLOAD_TIMEOUT": 5,
        "OPENCLAW_DLQ_URI": str(project / "dl.jsonl"),
        "OPENCLAW_SNAPSHOT_DIR": str(project / "snapshots"),  # (nothing written into the checkout)
        "OPENCLAW_REPORT_PATH": str(project / "openclaw-data" / "%(name)s" / "report.json"),
    }
    with ChaosServer(SITE) as server:
        result = run_crawl(settings=settings, spider_args={"start_urls": server.start_urls}, timeout=240)
        truth = server.truth()["hosts"]
    return {"project": project, "file": report_file, "result": result, "truth": truth}


def test_report_matches_the_sites_record(crawled: dict[str, Any]) -> None:
    result, truth = crawled["result"], crawled["truth"]
    assert result.stats.get("finish_reason") == "finished", result.log[-3000:]
    assert result.stats["openclaw/report/path"] == str(crawled["file"])
    report = read_report(crawled["file"])
    domains = report["domains"]
    assert set(domains) == set(truth)
    assert report["spider"] == "chaos" and report["workers"] == 1 and report["finish_reason"] == "finished"
    for host, site in truth.items():
        entry = domains[host]
        # no connection drops on this site: every request the site saw is one the crawl sent
        assert entry["requests"] == site["total"], host
        assert entry["statuses"] == site["statuses"], host
        assert entry["throttled_429"] == site["statuses"].get("429", 0), host
        assert entry["unavailable_503"] == site["statuses"].get("503", 0), host
        assert entry["bytes"] == site["bytes"], host
        low, high = busiest_second_bounds(r["t"] for r in site["requests"])
        assert low <= entry["busiest_1s"] <= high, (host, entry, low, high)
        assert sum(entry["answers"].values()) == site["total"]
    # the busiest domains first
    assert list(domains) == sorted(domains, key=lambda d: (-domains[d]["busiest_1s"], -domains[d]["requests"], d))


def test_retry_after_robots_and_dead_letters(crawled: dict[str, Any]) -> None:
    truth = crawled["truth"]
    domains = read_report(crawled["file"])["domains"]
    limited = domains[LIMITED]
    assert limited["throttled_429"] > 0  # the limit was crossed at least once, so Retry-After came
    # every 429 carried Retry-After: 1, and each held the domain (a rate limiter's refusals fall
    # with the pace: none is judged pace-independent, so none goes unhonoured)
    ra = limited["retry_after"]
    assert ra["received"] == ra["honoured"] == limited["throttled_429"] and ra["largest_seconds"] == 1.0
    assert ra["held_seconds"] == limited["held_seconds"] >= 1.0  # at least one Retry-After waited out
    assert limited["circuit_openings"] == 0 and limited["circuit_seconds"] == 0.0  # slower, not sick
    assert limited["limit"] is not None
    # robots.txt: fetched once per host, its Crawl-delay applied and reported
    # (the flaky host's robots.txt may fall in a 503 window: then it is asked again)
    assert truth[LIMITED]["counts"]["/robots.txt"] == truth[DELAYED]["counts"]["/robots.txt"] == 1
    delayed = domains[DELAYED]["robots_txt"]
    assert delayed == {
        "status": 200,
        "crawl_delay": CRAWL_DELAY,
        "disallowed": 2,
        "disallowed_paths": delayed["disallowed_paths"],
    }
    # its rules applied: each disallowed URL refused once (the duplicates never left the scheduler),
    # and the site never received one; Scrapy's own count agrees
    assert sorted(delayed["disallowed_paths"]) == DISALLOWED
    assert not set(DISALLOWED) & set(truth[DELAYED]["counts"])
    assert crawled["result"].stats["robotstxt/forbidden"] == 2
    robots = [r["status"] for r in truth[FLAKY]["requests"] if r["path"] == "/robots.txt"]
    assert domains[FLAKY]["robots_txt"] == {
        "status": robots[-1],
        "crawl_delay": 0.0,
        "disallowed": 0,
        "disallowed_paths": [],
    }, robots
    # one request per Crawl-delay, robots.txt included: the first page (let through before
    # robots.txt came back) waits a Crawl-delay after it too
    times = sorted(r["t"] for r in truth[DELAYED]["requests"])
    assert min(b - a for a, b in zip(times, times[1:])) >= CRAWL_DELAY - 0.05, times
    assert domains[DELAYED]["busiest_1s"] == truth[DELAYED]["max_1s_window"] == 1
    # dead letters by class: what the dead-letter store holds, per domain
    stored = Counter((r.domain, r.error_class) for r in JsonlStore(crawled["project"] / "dl.jsonl").iter())
    for host, entry in domains.items():
        assert entry["dead_letters"] == {cls: n for (d, cls), n in stored.items() if d == host}, host
    assert domains[FLAKY]["dead_letters"] == {"protocol_permanent": 1, "protocol_retryable": 1}
    assert truth[FLAKY]["counts"]["/page/9"] > 1  # (retried before it was given up)


def test_the_report_file_is_where_the_docs_say(crawled: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from scrapy.settings import Settings

    from scrapy_openclaw.settings import OpenClawSettings

    monkeypatch.chdir(crawled["project"] / "openclaw-data")  # below the project: its root is still found
    assert report_path(OpenClawSettings.from_settings(Settings()), "chaos") == crawled["file"]
    text = crawled["result"].log
    assert f"Politeness report written to {crawled['file']}" in text
    assert "OpenClaw politeness report (top 3 of 3 domains by busiest second):" in text


def test_command_prints_table_json_and_text(crawled: dict[str, Any]) -> None:
    project = crawled["project"]
    stored = read_report(crawled["file"])
    table = scrapy_cmd(project, "openclaw-report", "chaos")  # found at the default place in the project
    assert table.returncode == 0, table.stdout + table.stderr
    lines = table.stdout.strip().splitlines()
    assert lines[0] == "OpenClaw politeness report (top 3 of 3 domains by busiest second):"
    assert lines[1].split()[:4] == ["domain", "requests", "peak/1s", "peak/5s"]
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert list(rows) == list(stored["domains"])
    for host, cells in rows.items():
        entry = stored["domains"][host]
        assert [int(c) for c in cells[1:4]] == [entry["requests"], entry["busiest_1s"], entry["busiest_5s"]]
        assert int(cells[7]) == entry["throttled_429"]

    as_json = scrapy_cmd(project, "openclaw-report", "--path", str(crawled["file"]), "--format", "json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout) == stored
    one = scrapy_cmd(project, "openclaw-report", "chaos", "--format", "json", "--domain", LIMITED)
    assert json.loads(one.stdout)["domains"] == {LIMITED: stored["domains"][LIMITED]}

    text = scrapy_cmd(project, "openclaw-report", "chaos", "--format", "text", "--domain", LIMITED)
    assert text.returncode == 0, text.stderr
    entry = stored["domains"][LIMITED]
    assert f"sent {entry['requests']} requests to {LIMITED}" in text.stdout
    assert f"The busiest second carried {entry['busiest_1s']} requests" in text.stdout
    assert f"It received {entry['throttled_429']} '429 Too Many Requests'" in text.stdout
    assert "with Retry-After (largest 1 s)" in text.stdout
    delayed = scrapy_cmd(project, "openclaw-report", "chaos", "--format", "text", "--domain", DELAYED)
    assert f"spaced its requests by its Crawl-delay of {CRAWL_DELAY:g} s" in delayed.stdout


@pytest.mark.crawl  # runs a subprocess
@pytest.mark.parametrize(
    "content",
    [b'{"version": 1, "domains": {"a": {"requests": "x"}', b'{"version": 99, "domains": {}}', b"\xff\xfe\x00"],
    ids=["torn", "version", "binary"],
)
def test_command_on_a_damaged_file(tmp_path: Path, content: bytes) -> None:
    damaged = tmp_path / "report.json"
    damaged.write_bytes(content)
    out = scrapy_cmd(tmp_path, "openclaw-report", "--path", str(damaged))
    assert out.returncode == 1
    assert out.stdout.count("\n") == 1 and out.stdout.startswith(f"error: {damaged}: "), out.stdout
    assert "Traceback" not in out.stdout + out.stderr
    with pytest.raises(ReportError):
        read_report(damaged)


# --------------------------------------------------------------------------- distributed

_spec = importlib.util.spec_from_file_location(
    "openclaw_bench_distributed_report", Path(__file__).resolve().parents[1] / "benchmarks" / "distributed.py"
)
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_two_workers_merge_in_redis(chaos_server: Any, redis_server: Any, tmp_path: Path) -> None:
    site = chaos_server(bench._site(150, hosts=2, latency=0.2))  # long enough for both workers
    settings = {
        **bench.ours(redis_server.url),
        "OPENCLAW_REPORT_PATH": str(tmp_path / "report.json"),
        "OPENCLAW_SITES_ENABLED": False,  # (its memory would go to Redis: not this test's subject)
    }
    workers = bench.Workers(2, settings, site.start_urls, tmp_path / "w")
    assert workers.wait(240) == [0, 0], workers.log(0)[-3000:] + workers.log(1)[-3000:]
    truth = site.truth()["hosts"]
    report = read_report(tmp_path / "report.json")  # the last worker to close wrote the whole crawl's
    assert report["workers"] == 2
    sent = [workers.stats(i).get("downloader/request_count", 0) for i in range(2)]
    assert all(n > 0 for n in sent), sent  # both workers took part
    assert sum(e["requests"] for e in report["domains"].values()) == sum(sent)
    # per domain, every count is the sum of the workers' parts kept in Redis
    from scrapy_openclaw.report.model import SUMMED

    parts = bench.client(redis_server.url).hgetall(
        SharedReport(bench.client(redis_server.url), "chaos", "chaos").key("parts")
    )
    parts = [json.loads(raw) for raw in parts.values()]
    assert len(parts) == 2
    for host, entry in report["domains"].items():
        for name in SUMMED:
            assert entry[name] == sum(p["domains"].get(host, {}).get(name, 0) for p in parts), (host, name)
    for host, entry in report["domains"].items():
        assert entry["requests"] == truth[host]["total"], host
        assert entry["bytes"] == truth[host]["bytes"], host
        assert entry["statuses"] == truth[host]["statuses"], host
        low, high = busiest_second_bounds(r["t"] for r in truth[host]["requests"])
        assert low <= entry["busiest_1s"] <= high, (host, entry["busiest_1s"], low, high)
    # the same merge, read from Redis by the command
    cmd = scrapy_cmd(
        tmp_path, "openclaw-report", "chaos", "--redis", "--format", "json", "-s", f"REDIS_URL={redis_server.url}"
    )
    assert cmd.returncode == 0, cmd.stdout + cmd.stderr
    assert json.loads(cmd.stdout)["domains"] == report["domains"]


def test_a_limit_the_site_said_is_in_the_report_and_the_operators_text() -> None:
    from scrapy_openclaw.health.registry import HealthRegistry
    from scrapy_openclaw.metrics.figures import DomainFigures
    from scrapy_openclaw.report.model import domain_entry, merge
    from scrapy_openclaw.report.render import text

    registry = HealthRegistry()
    registry.declare_limit("said.test", 8.0)
    registry.record_success("quiet.test", 0.01)
    said, quiet = (
        domain_entry(DomainFigures(requests=3, done=3), registry.state(d)) for d in ("said.test", "quiet.test")
    )
    assert said["declared_limit"] == 8.0 and quiet["declared_limit"] is None
    report = {"version": 1, "spider": "s", "crawl_id": "c", "started_at": 0.0, "finished_at": 1.0, "workers": 1}
    one = {**report, "domains": {"said.test": said, "quiet.test": quiet}}
    older = {**report, "domains": {"said.test": {k: v for k, v in said.items() if k != "declared_limit"}}}
    assert merge([older, one])["domains"]["said.test"]["declared_limit"] == 8.0  # (a part without the field)
    assert "said its limit was 8 requests per second" in text(one, "said.test")
    assert "said its limit" not in text(one, "quiet.test")


def test_a_workers_bins_of_several_domains_go_in_one_pipeline_and_merge(redis_any: Any) -> None:
    """Each domain's new send-time bins are a script call, all of them in one pipeline (one
    round trip; a node's on a cluster): two workers' bins of two domains give the busiest
    windows across both."""
    server = client_from_settings(Settings({"REDIS_URL": redis_any.url}))
    shared = SharedReport(server, "unit", "unit")
    now = 1_000_000.0
    first = int(now / RESOLUTION)
    shared.push_bins({"a.test": {first: 3, first + 1: 2}, "b.test": {first: 1}}, horizon=60.0, now=now)
    shared.push_bins({"a.test": {first: 4}, "b.test": {first + 300: 5}}, horizon=60.0, now=now)
    peaks = shared.peaks()
    assert peaks["a.test"]["busiest_1s"] == 9 and peaks["b.test"]["busiest_1s"] == 5
    assert peaks["b.test"]["busiest_5s"] == 6
    shared.store_part("w1", {"x": 1})
    assert server.ttl(shared.key("parts")) > 0
