"""The benchmark suite must keep running: a quick end-to-end run, the recorder and the plot.

The full suite takes minutes; CI runs ``python -m benchmarks run --quick`` on
the fast ``overhead`` scenario (override the set with
``BENCH_SMOKE_SCENARIOS="overhead hol"``), checks every configuration got
numbers from a real crawl, and imports every scenario module so none of them
can silently break. Issue 15's scenarios (mixed, sweep, deadhosts) also
measure one tiny plain-Scrapy crawl each, through the report's adapters.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import plot, suite
from benchmarks.adapters import adapt
from scrapy_openclaw.testing.crawl import run_crawl
from scrapy_openclaw.testing.presets import rate_limited_site
from scrapy_openclaw.testing.servers import subprocess_env

pytestmark = pytest.mark.crawl  # quick benchmark runs (crawls)

ROOT = Path(__file__).resolve().parents[1]
SMOKE = os.environ.get("BENCH_SMOKE_SCENARIOS", "overhead").split()


def test_quick_run_reports_numbers_for_every_configuration(tmp_path):
    out = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "run", *SMOKE, "--quick", "--repeat", "1", "--out", str(out)],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((out / "results.json").read_text(encoding="utf-8"))
    meta = result["meta"]
    assert meta["command"].startswith("python -m benchmarks run")
    assert meta["machine"]["cores"] >= 1 and meta["machine"]["scrapy"]
    assert set(result["scenarios"]) == set(SMOKE)
    for name, scenario in result["scenarios"].items():
        assert not scenario["errors"], (name, scenario["errors"])
        assert scenario["raw"] and scenario["tables"], name
        for table in scenario["tables"]:
            assert table["rows"], (name, table["title"])
            for config, cells in table["rows"].items():
                numbers = [c["median"] for c in cells.values() if c["median"] is not None]
                assert numbers, f"{name}: {config} has no numbers in {table['title']!r}"
            for headline in table["headlines"]:
                assert headline["value"] is not None, (name, headline)
    # the markdown table went to stdout, with ratios
    assert "| scenario | metric |" in proc.stdout and "×" in proc.stdout
    assert (out / "results.md").read_text(encoding="utf-8") in proc.stdout


def test_summary_takes_medians_and_paired_ratios():
    raw = {
        "baseline": "scrapy",
        "hosts": 4,
        "pages_per_host": 10,
        "configs": {
            "scrapy": {"pages_per_s": 100.0, "peak_rss_mb": 90.0, "wall_s": 3.0, "scraped": 40, "duplicates": 0},
            "openclaw": {"pages_per_s": 96.0, "peak_rss_mb": 95.0, "wall_s": 3.1, "scraped": 40, "duplicates": 0},
            "openclaw_defaults": {"error": "exit 1"},
        },
    }
    tables = suite.summarise("overhead", [raw, raw])
    row = tables[0]["rows"]["openclaw"]["pages_per_s"]
    assert row["median"] == 96.0 and row["ratio"] == pytest.approx(0.96)
    assert tables[0]["rows"]["openclaw_defaults"]["pages_per_s"]["median"] is None
    assert tables[0]["headlines"][0]["met"] is True


def test_scenarios_with_several_tables_read_them_by_key():
    kill = {
        "baseline": "scrapy_jobdir",
        "configs": {
            "scrapy_jobdir": {"pages_lost": 700, "kills": 1},
            "openclaw_checkpoint": {"pages_lost": 0, "kills": 3},
        },
    }
    tables = suite.summarise("killresume", [{"tables": {"kill": kill}}])
    assert tables[0]["rows"]["scrapy_jobdir"]["kills"]["median"] == 1
    assert tables[0]["headlines"][0]["met"] is True
    assert tables[1]["rows"] == {}  # a missing table is empty, not a crash


@pytest.mark.parametrize("name", list(suite.SCENARIOS))
def test_every_scenario_module_imports_and_adapts(name):
    module = importlib.import_module(suite.SCENARIOS[name].module)
    assert callable(module.run)
    assert isinstance(adapt(name, {}), list)  # an empty or failed result never crashes the report


def test_recorder_samples_health_and_the_plot_draws_it(tmp_path, monkeypatch, chaos_server):
    server = chaos_server(rate_limited_site(n_hosts=2, rate=20.0, burst=5, pages=25))
    monkeypatch.setenv(suite.RECORD_DIR_ENV, str(tmp_path / "recordings" / "ratelimit" / "run1"))
    settings = {"ADDONS": {"scrapy_openclaw.Addon": 100}, "OPENCLAW_DLQ_URI": str(tmp_path / "dlq.jsonl")}
    settings = suite.with_recorder(settings, "openclaw")
    assert suite.with_recorder(settings, "openclaw") == settings  # idempotent
    assert not any(k.startswith("OPENCLAW_") for k in suite.recorder_settings("x"))
    result = run_crawl(
        settings=settings, spider_args={"start_urls": server.start_urls}, timeout=120, out_dir=tmp_path / "crawl"
    )
    assert result.stats.get("finish_reason") == "finished", result.log[-2000:]
    path = tmp_path / "recordings" / "ratelimit" / "run1" / "openclaw.jsonl"
    samples = plot.read_recording(path)
    assert len(samples) >= 2 and samples[-1].get("final")
    last = samples[-1]["domains"]
    truth = server.truth(include_requests=False)["hosts"]
    # every request the server saw was counted by the recorder for its domain
    assert sum(d["done"] for d in last.values()) == sum(h["total"] for h in truth.values())
    assert sum(d["responses"] for d in last.values()) == sum(h["total"] for h in truth.values())
    assert all("health" in d and "circuit" in d for d in last.values())
    png, message = plot.plot(tmp_path / "recordings", tmp_path / "health.png", {"ratelimit": 20.0})
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert png is None and "matplotlib" in message
    else:
        assert png is not None and png.stat().st_size > 10_000, message


# --------------------------------------------------------------------------- issue 15's scenarios, tiny and plain


def _adapted(name: str, row: dict) -> list:
    """The report's tables for one configuration's row: every metric the spec names is read."""
    tables = suite.summarise(name, [{"baseline": "scrapy", "configs": {"scrapy": row}}])
    assert tables and all(table["rows"]["scrapy"] for table in tables), name
    return tables


def test_mixed_measures_pages_and_failed_urls_from_the_ground_truth(tmp_path):
    from benchmarks import mixed

    row = mixed.one("scrapy", {}, pages=15, out=tmp_path, limit=30)
    assert row["finished"] == 1 and row["scraped_fraction"] == 1.0, row
    # pages 5 and 10 answer 503 for good, page 7 404: failed URLs, all requested by Scrapy
    assert row["failed_urls"] == row["failed_requested"] >= 2
    assert "dead_letter_urls" not in row and row["broken_host_health"] is None  # plain Scrapy keeps none
    configs = mixed.with_differences({"scrapy": dict(row), "other": {"seconds": row["seconds"] + 2.5}})
    assert configs["scrapy"]["seconds_over_scrapy"] == 0 and configs["other"]["seconds_over_scrapy"] == 2.5
    _adapted("mixed", row)


def test_sweep_measures_each_host_against_its_own_limit(tmp_path):
    from benchmarks import sweep

    row = sweep.one("scrapy", {}, limits=(3, 12), seconds=2.0, out=tmp_path, limit=30)
    assert row["finished"] == 1, row
    assert row["lower_bound_s"] == 2.0 and row["span_s"] is not None
    # plain Scrapy bursts far beyond 3 and 12 req/s: the servers answer 429
    assert row["share_429_3"] > 0.1 and row["share_429_12"] > 0.1 and row["share_429"] > 0.1
    assert row["share_429_max_host"] == max(row["share_429_3"], row["share_429_12"])
    assert "rate_after_5s_3" in row and "rate_after_5s_150" not in row
    _adapted("sweep", row)


def test_deadhosts_counts_failed_attempts_without_any_dns_query(tmp_path):
    from benchmarks import deadhosts

    row = deadhosts.one("scrapy", {"RETRY_TIMES": 1}, pages=5, out=tmp_path, limit=30, dead_per_host=2)
    assert row["finished"] == 1 and row["scraped_fraction"] == 1.0, row
    assert row["dead_urls"] == 4 and row["dead_attempts"] == 4 * 2  # refused or unresolved, twice each
    _adapted("deadhosts", row)


def test_dead_letters_are_counted_per_url(tmp_path):
    from scrapy_openclaw.deadletter import DeadLetter
    from scrapy_openclaw.dlq.stores import JsonlStore
    from scrapy_openclaw.testing.crawl import CrawlResult

    out = tmp_path / "crawl"
    out.mkdir()
    plain = suite.SiteCrawl(CrawlResult(0, [], {"finish_reason": "finished"}, "", out), set(), {}, 1.0)
    assert suite.dead_letters(plain) is None
    ours = suite.SiteCrawl(CrawlResult(0, [], {"openclaw/retry/count": 1}, "", out), set(), {}, 1.0)
    assert suite.dead_letters(ours) == {}
    store = JsonlStore(out / "deadletters.jsonl")
    for url in ("http://a/page/1", "http://a/page/2", "http://a/page/1"):
        store.append(DeadLetter(url=url, domain="a", error_class="network", reason="r", spider="s", crawl_id="c"))
    store.close()
    assert suite.dead_letters(ours) == {"http://a/page/1": 2, "http://a/page/2": 1}


def test_overhead_profile_lists_the_add_on_functions(tmp_path):
    import cProfile

    from benchmarks import overhead
    from scrapy_openclaw.retry_after import parse_retry_after
    from scrapy_openclaw.testing.presets import limit_sweep_site

    profiler = cProfile.Profile()
    profiler.runcall(lambda: [(limit_sweep_site(), parse_retry_after("5", cap=60)) for _ in range(3)])
    dump = tmp_path / "crawl.pstats"
    profiler.dump_stats(str(dump))
    text = overhead.write_profile(dump, tmp_path / "results" / overhead.PROFILE_FILE, "about").read_text()
    assert text.startswith("about") and "by cumulative time" in text and "by own time" in text
    assert "retry_after.py" in text and "(parse_retry_after)" in text
    assert "presets.py" not in text  # testing/ is the chaos side, not the add-on's cost
    assert (tmp_path / "results" / "profile-overhead.pstats").exists()


def test_smallbucket_gives_every_host_a_bucket_of_two(tmp_path):
    from benchmarks import smallbucket, sweep
    from benchmarks.adapters import SMALL_BUCKET_LIMITS

    row = sweep.one("scrapy", {}, limits=(12,), seconds=2.0, out=tmp_path, limit=30, burst=smallbucket.BURST)
    assert row["finished"] == 1 and row["share_429_12"] > 0.1, row  # plain Scrapy's bursts meet a bucket of 2
    assert smallbucket.LIMITS == SMALL_BUCKET_LIMITS
    _adapted("smallbucket", row)


def test_queueing_measures_throughput_and_the_servers_line(tmp_path):
    from benchmarks import queueing

    row = queueing.one("scrapy", {}, pages=40, out=tmp_path, limit=30)
    assert row["finished"] == 1 and row["scraped_fraction"] == 1.0, row
    # plain Scrapy keeps 8 requests at a 2-worker server: most of them wait in its line
    assert row["max_in_flight"] > queueing.CAPACITY and row["wait_p90_ms"] > 0, row
    assert 0 < row["vs_capacity"] <= 1.1, row
    _adapted("queueing", row)
