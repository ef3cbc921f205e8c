"""Replay in real crawls: one request per URL, permanent failures held back,
records marked in place, quick; robots.txt never a dead letter (issue 22)."""

from __future__ import annotations

import time
from dataclasses import replace
from uuid import uuid4

import pytest

from scrapy_openclaw.dlq import JsonlStore
from scrapy_openclaw.testing.crawl import run_crawl
from tests.test_dlq_crawl import assert_clean, cli, dlq_settings, make_project, require_cli, served


ADDON = {"ADDONS": {"scrapy_openclaw.Addon": 100}, "LOG_LEVEL": "INFO"}


@pytest.mark.parametrize("addon", [False, True], ids=["components", "addon"])
def test_replay_is_idempotent_and_quick(chaos_server, tmp_path, addon):
    attempts = 6 if addon else 2  # the add-on's page schedule, or the test policy
    server = chaos_server({"hosts": [{
        "address": "127.0.0.2", "pages": 12, "links_per_page": "all",
        "status_script": {"3": [503] * attempts + [200], "7": [503] * 40},
        "not_found": [5],
    }]})
    base = server.urls["127.0.0.2"]
    path = tmp_path / "dl.jsonl"
    settings = {**ADDON, "OPENCLAW_DLQ_URI": str(path)} if addon else dlq_settings(str(path), max_attempts=2)
    first = run_crawl(settings=settings, spider_args={"start_urls": [base]}, timeout=120,
                      out_dir=tmp_path / "crawl")
    assert first.stats.get("finish_reason") == "finished", first.log[-3000:]
    store = JsonlStore(path)
    by_url = {r.url: r for r in store.iter()}
    assert set(by_url) == {f"{base}page/3", f"{base}page/5", f"{base}page/7"}
    # the same pages failed in earlier crawls too: older copies of the same URLs
    for url in (f"{base}page/3", f"{base}page/7"):
        for age in (300, 200):
            store.append(replace(by_url[url], id=uuid4().hex, created_at=by_url[url].created_at - age))
    store.close()
    assert len(list(JsonlStore(path).iter())) == 7

    require_cli()
    project = make_project(tmp_path / "proj", settings)
    dry = cli(project, "replay", "chaos", "--dry-run")
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "would replay 2 dead letter(s)" in dry.stdout
    assert "held back 1 dead letter(s) (1 protocol_permanent)" in dry.stdout
    assert "4 older dead letter(s)" in dry.stdout
    assert "Scrapy" not in dry.stdout + dry.stderr  # no start banner
    assert served(server.truth())[f"{base}page/3"] == [503] * attempts  # the dry run sent nothing

    started = time.monotonic()
    replayed = cli(project, "replay", "chaos")
    took = time.monotonic() - started
    assert replayed.returncode == 0, replayed.stderr[-3000:]
    assert "replayed 2 dead letter(s) of chaos" in replayed.stdout
    assert "1 recovered, 1 failed again" in replayed.stdout
    assert_clean(replayed.stderr)
    print(f"replay took {took:.1f}s")
    assert took < 30, (took, replayed.stderr[-3000:])
    counts = served(server.truth())
    assert counts[f"{base}page/3"] == [503] * attempts + [200]  # one request, not one per stored copy
    assert counts[f"{base}page/5"] == [404]  # permanent: held back
    assert len(counts[f"{base}page/7"]) == 2 * attempts  # a full retry schedule per crawl

    records = {r.id: r for r in JsonlStore(path).iter()}
    assert len(records) == 7  # updated in place, nothing appended
    newest3, newest7 = by_url[f"{base}page/3"], by_url[f"{base}page/7"]
    assert records[newest3.id].replay_outcome == "recovered"
    assert records[newest7.id].replay_outcome == "failed"
    assert records[newest7.id].attempts == 2 * attempts and records[newest7.id].status == 503
    assert records[newest7.id].replays == 1 and records[newest7.id].replayed_at
    assert sum(1 for r in records.values() if (r.replay_outcome or "").startswith("duplicate of")) == 4
    assert records[by_url[f"{base}page/5"].id].replayed_at is None
    assert "download_slot" not in records[newest7.id].request["meta"]

    again = cli(project, "replay", "chaos")
    assert "nothing to replay" in again.stdout
    assert served(server.truth())[f"{base}page/3"] == [503] * attempts + [200]
    listed = cli(project, "list")
    assert "recovered" in listed.stdout and "failed" in listed.stdout


def test_robots_txt_404_is_no_dead_letter(chaos_server, tmp_path):
    server = chaos_server({"hosts": [{"address": "127.0.0.2", "pages": 6, "links_per_page": "all"}]})
    base = server.urls["127.0.0.2"]
    path = tmp_path / "dl.jsonl"
    result = run_crawl(
        settings=dlq_settings(str(path), ROBOTSTXT_OBEY=True), spider_args={"start_urls": [base]},
        timeout=120, out_dir=tmp_path / "crawl",
    )
    assert result.stats.get("finish_reason") == "finished", result.log[-3000:]
    assert served(server.truth())[f"{base}robots.txt"] == [404]
    assert len(result.items) == 6
    assert list(JsonlStore(path).iter()) == []
    assert not result.stats.get("openclaw/dlq/count")
    assert_clean(result.log)
