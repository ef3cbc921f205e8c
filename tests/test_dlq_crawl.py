"""DeadLetterPipeline and ``scrapy openclaw-dlq`` in real crawls against the chaos site.

Dead letters come from the real ClassifiedRetryMiddleware; every assertion is
checked against the site's ground truth (what it really served), the crawl's
stats and the store's contents.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
import redis

from scrapy_openclaw.deadletter import DeadLetter
from scrapy_openclaw.dlq import Filters, JsonlStore, open_store
from scrapy_openclaw.testing.crawl import read_result, run_crawl, start_crawl
from scrapy_openclaw.testing.servers import stop_process, subprocess_env

RETRY_MW = "scrapy_openclaw.retry.ClassifiedRetryMiddleware"
DLQ_PIPELINE = "scrapy_openclaw.dlq.DeadLetterPipeline"


def dlq_settings(uri: str, *, max_attempts: int = 3, **extra: Any) -> dict[str, Any]:
    return {
        "DOWNLOADER_MIDDLEWARES": {RETRY_MW: 550, "scrapy.downloadermiddlewares.retry.RetryMiddleware": None},
        "ITEM_PIPELINES": {DLQ_PIPELINE: 1000},
        "OPENCLAW_DLQ_URI": uri,
        "OPENCLAW_POLICY": {
            "defaults": {
                "retry": {
                    "protocol_retryable": {"max_attempts": max_attempts, "base_delay": 0.05, "max_delay": 0.1},
                    "network": {"max_attempts": max_attempts, "base_delay": 0.05, "max_delay": 0.1},
                }
            }
        },
        **extra,
    }


def assert_clean(log: str) -> None:
    """No warnings (deprecations included), handler errors or tracebacks in a crawl log."""
    for bad in ("py.warnings", "Error caught on signal handler", "Traceback", "Unhandled error"):
        assert bad not in log, log[log.index(bad) - 500 : log.index(bad) + 2000]


def served(truth: dict[str, Any]) -> dict[str, list[Any]]:
    """URL -> statuses the site really answered, in order."""
    out: dict[str, list[Any]] = defaultdict(list)
    for host in truth["hosts"].values():
        base = host["base_url"].rstrip("/")
        for r in host["requests"]:
            out[base + r["path"]].append(r["status"])
    return out


def url_path(url: str) -> str:
    return "/" + url.split("//", 1)[1].partition("/")[2]


def test_every_failed_request_lands_exactly_once(chaos_server, tmp_path):
    server = chaos_server(
        {
            "hosts": [
                {"address": "127.0.0.2", "pages": 30, "links_per_page": 3, "not_found": [4, 9, 14, 20, 25]},
                {"address": "127.0.0.3", "pages": 5, "fail_windows": {"period": 100000, "down": 100000, "status": 503}},
            ]
        }
    )
    good, bad = server.urls["127.0.0.2"], server.urls["127.0.0.3"]
    ok_pages = sorted(url_path(u) for u in server.reachable([good]).ok if url_path(u).startswith("/page/"))
    invalid, filtered = ok_pages[:2], ok_pages[2:3]
    path = tmp_path / "dl.jsonl"
    result = run_crawl(
        settings=dlq_settings(
            str(path),
            ITEM_PIPELINES={"tests.dlq_helpers.ValidatingPipeline": 500, DLQ_PIPELINE: 1000},
            DLQ_TEST_INVALID_PATHS=invalid,
            DLQ_TEST_FILTERED_PATHS=filtered,
        ),
        spider_args={"start_urls": [good, bad, bad + "page/2"]},
        timeout=120,
        out_dir=tmp_path / "crawl",
    )
    assert result.stats.get("finish_reason") == "finished", result.log[-3000:]
    truth = served(server.truth())
    records = list(JsonlStore(path).iter())
    requests = [r for r in records if r.error_class != "business"]
    items = [r for r in records if r.error_class == "business"]

    # requests: exactly the URLs the site never served successfully, once each
    failed = {url for url, statuses in truth.items() if 200 not in statuses}
    succeeded = {url for url, statuses in truth.items() if 200 in statuses}
    by_url = Counter(r.url for r in requests)
    assert set(by_url) == failed
    assert all(n == 1 for n in by_url.values()), by_url
    assert not succeeded & set(by_url)
    assert len(failed) == 5 + 2  # five 404 pages, two URLs of the host in 503
    for record in requests:
        statuses = truth[record.url]
        assert record.attempts == len(statuses), record
        assert record.status == statuses[-1]
        assert record.error_class == ("protocol_permanent" if record.status == 404 else "protocol_retryable")
        assert record.spider == "chaos" and record.request["url"] == record.url
        assert record.first_attempt_at <= record.last_attempt_at
    assert {r.attempts for r in requests if r.status == 503} == {3}

    # items failing validation land with their error; plain DropItem does not
    assert sorted(url_path(r.url) for r in items) == invalid
    for record in items:
        assert "price is missing" in record.validation_error
        assert record.exception_type == "ItemValidationError"
        assert record.item["url"] == record.url and record.request is None
    scraped = {url_path(i["url"]) for i in result.items}
    assert not scraped & set(invalid + filtered)

    stats = result.stats
    assert stats["openclaw/dlq/count"] == len(records) == 9
    assert stats["openclaw/dlq/protocol_permanent"] == 5
    assert stats["openclaw/dlq/protocol_retryable"] == 2
    assert stats["openclaw/dlq/business"] == 2
    assert "openclaw/dlq/alert" not in stats
    assert f"9 dead letter(s) written to {path}" in result.log
    assert_clean(result.log)


def test_alert_threshold_closes_the_spider(chaos_server, tmp_path):
    server = chaos_server(
        {"hosts": [{"address": "127.0.0.2", "pages": 30, "links_per_page": "all", "not_found": list(range(1, 30, 2))}]}
    )
    result = run_crawl(
        settings=dlq_settings(
            str(tmp_path / "dl.jsonl"), OPENCLAW_DLQ_ALERT_COUNT=3, OPENCLAW_DLQ_ALERT_CLOSE=True, CONCURRENT_REQUESTS=1
        ),
        spider_args={"start_urls": [server.urls["127.0.0.2"]]},
        timeout=120,
        out_dir=tmp_path / "crawl",
    )
    stats = result.stats
    assert stats.get("finish_reason") == "openclaw_dlq_threshold", result.log[-3000:]
    assert stats["openclaw/dlq/alert"] == 1
    assert "Dead-letter threshold exceeded: 3 dead letters >= OPENCLAW_DLQ_ALERT_COUNT=3" in result.log
    # closing stops the crawl at the third: one more only if it was on the wire (concurrency 1);
    # whatever was given up on is still stored, one letter per 404 the site really answered
    not_found = [url for url, statuses in served(server.truth()).items() if 404 in statuses]
    assert stats["openclaw/dlq/count"] == len(not_found) in (3, 4), not_found
    stored = list(JsonlStore(tmp_path / "dl.jsonl").iter())
    assert sorted(r.url for r in stored) == sorted(not_found)
    assert_clean(result.log)


# --------------------------------------------------------------------------- CLI


def cli_problem() -> str | None:
    """Why ``scrapy`` cannot run commands here (an entry point that does not import), or None."""
    from importlib.metadata import entry_points

    for ep in entry_points(group="scrapy.commands"):
        try:
            ep.load()
        except Exception as exc:  # (any failure to load breaks every command)
            return f"the scrapy CLI is broken by entry point {ep.name} ({ep.value}): {exc}"
    return None


def require_cli() -> None:
    """Fail when any ``scrapy.commands`` entry point breaks the ``scrapy`` CLI: ours, or another
    package's that keeps ours from running (a skip would hide it)."""
    problem = cli_problem()
    if problem:
        pytest.fail(problem)


def make_project(root: Path, settings: dict[str, Any]) -> Path:
    """A minimal Scrapy project whose spiders are the chaos spiders."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "scrapy.cfg").write_text("[settings]\ndefault = dlqproj_settings\n", encoding="utf-8")
    body = {
        "SPIDER_MODULES": ["scrapy_openclaw.testing.spiders"],
        "TELNETCONSOLE_ENABLED": False,
        "LOG_LEVEL": "INFO",
        **settings,
    }
    (root / "dlqproj_settings.py").write_text("".join(f"{k} = {v!r}\n" for k, v in body.items()), encoding="utf-8")
    return root


def cli(project: Path, *args: str, input: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "scrapy", "openclaw-dlq", *args],
        cwd=project,
        env=subprocess_env(),
        input=input if input is not None else "",
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_replay_after_recovery_and_cli(chaos_server, tmp_path):
    server = chaos_server(
        {
            "hosts": [
                {
                    "address": "127.0.0.2",
                    "pages": 12,
                    "links_per_page": "all",
                    "status_script": {"3": [503, 503, 503, 200], "7": [503, 503, 503, 200]},
                    "not_found": [5],
                }
            ]
        }
    )
    base = server.urls["127.0.0.2"]
    path = tmp_path / "dl.jsonl"
    settings = dlq_settings(str(path), max_attempts=2)
    first = run_crawl(settings=settings, spider_args={"start_urls": [base]}, timeout=120, out_dir=tmp_path / "crawl")
    assert first.stats.get("finish_reason") == "finished", first.log[-3000:]
    missing = {f"{base}page/3", f"{base}page/7"}
    assert {i["url"] for i in first.items} == server.reachable().ok - missing
    assert_clean(first.log)

    require_cli()
    replay_items = tmp_path / "replay-items.jsonl"
    project = make_project(
        tmp_path / "proj",
        {
            **settings,
            "FEEDS": {str(replay_items): {"format": "jsonlines"}},
        },
    )

    # list / show / stats
    listed = cli(project, "list")
    assert listed.returncode == 0, listed.stderr[-3000:]
    assert "3 dead letter(s)" in listed.stdout
    assert "protocol_retryable" in listed.stdout and f"{base}page/5" in listed.stdout
    records = {r.url: r for r in JsonlStore(path).iter()}
    only_503 = cli(project, "list", "--class", "protocol_retryable", "--domain", "127.0.0.2", "--since", "1h")
    assert "2 dead letter(s)" in only_503.stdout and f"{base}page/5" not in only_503.stdout
    assert "0 dead letter(s)" in cli(project, "list", "--until", "2000-01-01").stdout
    shown = cli(project, "show", records[f"{base}page/3"].id[:12])
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert '"attempts": 2' in shown.stdout and '"status": 503' in shown.stdout
    assert cli(project, "show", "f" * 32).returncode == 1
    stats = cli(project, "stats")
    assert "3 dead letter(s)" in stats.stdout and "protocol_retryable  2" in stats.stdout

    # replay: the site has recovered; only the dead letters are crawled again
    replay = cli(project, "replay", "chaos", "--class", "protocol_retryable")
    assert replay.returncode == 0, replay.stderr[-3000:]
    assert "replayed 2 dead letter(s) of chaos" in replay.stdout
    assert_clean(replay.stderr)
    replayed = [json.loads(line) for line in replay_items.read_text(encoding="utf-8").splitlines()]
    assert {i["url"] for i in replayed} == missing
    counts = served(server.truth())
    assert counts[base] == [200]  # the spider's own start was not crawled again
    assert counts[f"{base}page/3"] == [503, 503, 503, 200]
    assert counts[f"{base}page/5"] == [404]  # not selected
    assert len(list(JsonlStore(path).iter())) == 3  # the replay succeeded: no new dead letters
    again = cli(project, "replay", "chaos", "--class", "protocol_retryable")
    assert "nothing to replay" in again.stdout
    assert cli(project, "list", "--class", "protocol_retryable").stdout.count("recovered") == 2

    # purge: asks first, then deletes
    declined = cli(project, "purge", "--class", "protocol_retryable", input="n\n")
    assert declined.returncode == 1 and "nothing purged" in declined.stdout
    assert len(list(JsonlStore(path).iter())) == 3
    purged = cli(project, "purge", "--class", "protocol_retryable", "--yes")
    assert "purged 2 dead letter(s)" in purged.stdout
    assert [r.url for r in JsonlStore(path).iter()] == [f"{base}page/5"]


def test_redis_store_survives_a_restart_mid_crawl(chaos_server, redis_server, tmp_path):
    server = chaos_server(
        {
            "hosts": [
                {
                    "address": "127.0.0.2",
                    "pages": 40,
                    "links_per_page": 4,
                    "latency": 0.25,
                    "not_found": list(range(2, 40, 2)),
                }
            ]
        }
    )
    client = redis.Redis.from_url(redis_server.url)
    client.config_set("save", "3600 1")  # a production Redis persists: restart keeps its data
    uri = redis_server.url + "?prefix=test:dlq"
    proc = start_crawl(
        settings=dlq_settings(uri, CONCURRENT_REQUESTS=2),
        spider_args={"start_urls": [server.urls["127.0.0.2"]]},
        out_dir=tmp_path / "crawl",
    )
    try:
        deadline = time.monotonic() + 60
        while client.xlen("test:dlq:chaos") < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        before = client.xlen("test:dlq:chaos")
        assert before >= 2
        client.close()
        redis_server.stop()
        time.sleep(2.0)  # dead letters keep coming while Redis is down
        redis_server.start()
        proc.wait(120)
    finally:
        stop_process(proc)
    result = read_result(proc.out_dir, proc.returncode)
    assert result.stats.get("finish_reason") == "finished", result.log[-3000:]
    assert "unreachable" in result.log  # the outage was really hit
    assert_clean(result.log)
    failed = {url for url, statuses in served(server.truth()).items() if 200 not in statuses}
    assert len(failed) == 19

    store = open_store(uri)
    records = list(store.iter(Filters(spider="chaos")))
    assert Counter(r.url for r in records) == Counter(failed)  # none lost, none twice
    assert result.stats["openclaw/dlq/count"] == 19
    assert before < 19


def test_cli_on_the_redis_store(redis_server, tmp_path):
    require_cli()
    uri = redis_server.url + "?prefix=cli:dlq"
    store = open_store(uri)
    for n in range(4):
        store.append(
            DeadLetter(
                url=f"http://127.0.0.2/page/{n}",
                domain="127.0.0.2",
                spider="chaos",
                error_class="network" if n % 2 else "protocol_permanent",
                reason="timeout" if n % 2 else "http_404",
                crawl_id="c",
            )
        )
    store.append(
        DeadLetter(
            url="http://127.0.0.3/",
            domain="127.0.0.3",
            spider="other",
            error_class="network",
            reason="refused",
            crawl_id="c",
        )
    )
    project = make_project(tmp_path / "proj", {"OPENCLAW_DLQ_URI": uri})
    listed = cli(project, "list", "--spider", "chaos")
    assert listed.returncode == 0, listed.stderr[-3000:]
    assert "4 dead letter(s)" in listed.stdout and "http://127.0.0.3/" not in listed.stdout
    stats = cli(project, "stats").stdout  # every spider's stream
    assert "5 dead letter(s)" in stats and "network             3" in stats and "127.0.0.2  4" in stats
    record = next(store.iter(Filters(spider="other")))
    assert '"reason": "refused"' in cli(project, "show", record.id).stdout
    assert "purged 3 dead letter(s)" in cli(project, "purge", "--class", "network", "--yes").stdout
    assert sorted(r.url for r in store.iter()) == ["http://127.0.0.2/page/0", "http://127.0.0.2/page/2"]


def test_unreachable_redis_never_drops_records(chaos_server, tmp_path):
    from scrapy_openclaw.testing.servers import free_port

    server = chaos_server(
        {"hosts": [{"address": "127.0.0.2", "pages": 8, "links_per_page": "all", "not_found": [2, 4, 6]}]}
    )
    result = run_crawl(
        settings=dlq_settings(f"redis://127.0.0.1:{free_port()}/0", OPENCLAW_CHECKPOINT_DIR=str(tmp_path / "cp")),
        spider_args={"start_urls": [server.urls["127.0.0.2"]]},
        timeout=120,
        out_dir=tmp_path / "crawl",
    )
    assert result.stats.get("finish_reason") == "finished", result.log[-3000:]
    assert result.stats["openclaw/dlq/count"] == 3
    assert result.stats["openclaw/dlq/fallback"] == 3
    assert "still unreachable at close: saved 3 buffered record(s)" in result.log
    saved = list(JsonlStore(tmp_path / "cp" / "deadletters.jsonl").iter())
    assert sorted(url_path(r.url) for r in saved) == ["/page/2", "/page/4", "/page/6"]
    assert_clean(result.log)
