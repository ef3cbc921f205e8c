"""Replay in real crawls: one request per URL, permanent failures held back,
records marked in place, quick; robots.txt never a dead letter (issue 22)."""

from __future__ import annotations

from dataclasses import replace
from uuid import uuid4

import pytest

from scrapy_openclaw.deadletter import DeadLetter
from scrapy_openclaw.dlq import Filters, JsonlStore, open_store
from scrapy_openclaw.dlq.replay import ReplayPlan, select
from scrapy_openclaw.testing.crawl import run_crawl
from tests.test_dlq_crawl import assert_clean, cli, dlq_settings, make_project, require_cli, served

ADDON = {"ADDONS": {"scrapy_openclaw.Addon": 100}, "LOG_LEVEL": "INFO"}


@pytest.mark.parametrize("addon", [False, True], ids=["components", "addon"])
def test_replay_is_idempotent_and_quick(chaos_server, tmp_path, addon):
    attempts = 6 if addon else 2  # the add-on's page schedule, or the test policy
    server = chaos_server(
        {
            "hosts": [
                {
                    "address": "127.0.0.2",
                    "pages": 12,
                    "links_per_page": "all",
                    "status_script": {"3": [503] * attempts + [200], "7": [503] * 40},
                    "not_found": [5],
                }
            ]
        }
    )
    base = server.urls["127.0.0.2"]
    path = tmp_path / "dl.jsonl"
    settings = {**ADDON, "OPENCLAW_DLQ_URI": str(path)} if addon else dlq_settings(str(path), max_attempts=2)
    first = run_crawl(settings=settings, spider_args={"start_urls": [base]}, timeout=120, out_dir=tmp_path / "crawl")
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
    assert "Scrapy 2." not in dry.stderr and "] INFO:" not in dry.stderr  # no crawl ran (no start banner)
    assert served(server.truth())[f"{base}page/3"] == [503] * attempts  # the dry run sent nothing

    replayed = cli(project, "replay", "chaos")
    assert replayed.returncode == 0, replayed.stderr[-3000:]
    assert "replayed 2 dead letter(s) of chaos" in replayed.stdout
    assert "1 recovered, 1 failed again" in replayed.stdout
    assert_clean(replayed.stderr)
    # quick: one request per URL and one retry schedule per crawl, from the site's record (how
    # long that takes is the machine's business)
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

    shown = cli(project, "show", newest7.id[:12])
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert '"User-Agent": "Scrapy/' in shown.stdout and '"replay_outcome": "failed"' in shown.stdout
    assert "__bytes__" not in shown.stdout and "download_slot" not in shown.stdout
    assert "Scrapy 2." not in shown.stderr  # no start banner
    assert '"__bytes__"' in cli(project, "show", newest7.id, "--raw").stdout
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
        settings=dlq_settings(str(path), ROBOTSTXT_OBEY=True),
        spider_args={"start_urls": [base]},
        timeout=120,
        out_dir=tmp_path / "crawl",
    )
    assert result.stats.get("finish_reason") == "finished", result.log[-3000:]
    assert served(server.truth())[f"{base}robots.txt"] == [404]
    assert len(result.items) == 6
    assert list(JsonlStore(path).iter()) == []
    assert not result.stats.get("openclaw/dlq/count")
    assert_clean(result.log)


def _letter(url: str, created_at: float, error_class: str = "network") -> DeadLetter:
    return DeadLetter(
        url=url,
        domain="a.example",
        error_class=error_class,
        reason="r",
        spider="s",
        crawl_id="c",
        created_at=created_at,
        request={"url": url, "method": "GET"},
    )


@pytest.mark.parametrize("kind", ["jsonl", "redis"])
def test_plan_marks_records_in_place(kind, tmp_path, request):
    uri = str(tmp_path / "dl.jsonl") if kind == "jsonl" else request.getfixturevalue("redis_server").url
    store = open_store(uri, spider="s")
    old, new = _letter("http://a.example/1", 100.0), _letter("http://a.example/1", 200.0)
    other, gone = _letter("http://a.example/2", 150.0), _letter("http://a.example/3", 50.0, "protocol_permanent")
    for record in (old, new, other, gone):
        store.append(record)
    store.sync()
    send, duplicates, held = select(list(store.iter()))
    assert [r.id for r in send] == [new.id, other.id]
    assert [r.id for r in duplicates] == [old.id] and [r.id for r in held] == [gone.id]
    plan = ReplayPlan(store, send, duplicates)
    plan.injected = [r.id for r in send]
    plan.mark_sent()
    again = replace(other, attempts=3, status=503, error_class="protocol_retryable", id=uuid4().hex)
    again.replay_of = other.id
    assert plan.failed_again(again)
    unrelated = replace(other, id=uuid4().hex)
    assert not plan.failed_again(unrelated)  # not a replay of ours: the pipeline appends it
    assert plan.finish() == 1
    records = {r.id: r for r in open_store(uri, spider="s").iter()}
    assert len(records) == 4
    assert records[new.id].replay_outcome == "recovered" and records[new.id].replays == 1
    assert records[old.id].replay_outcome == f"duplicate of {new.id[:12]}"
    assert records[other.id].replay_outcome == "failed" and records[other.id].attempts == 4
    assert records[other.id].status == 503 and records[other.id].error_class == "protocol_retryable"
    assert records[gone.id].replayed_at is None
    assert set(store.replayed()) == {new.id, old.id, other.id}
    assert [r.id for r in store.iter(Filters(include_replayed=False))] == [gone.id]
    store.close()


def test_internal_requests_and_engine_meta():
    from scrapy import Request, Spider
    from scrapy.http.request import NO_CALLBACK

    from scrapy_openclaw import deadletter
    from scrapy_openclaw.dlq.replay import replay_request

    spider = Spider("s")
    kwargs = {"spider": spider, "crawl_id": "c", "error_class": "network", "reason": "r"}
    robots = Request("http://a.example/robots.txt", meta={"dont_obey_robotstxt": True}, callback=NO_CALLBACK)
    assert deadletter.for_request(robots, **kwargs).internal
    download = Request("http://a.example/x", callback=NO_CALLBACK)  # engine.download
    assert deadletter.for_request(download, **kwargs).internal
    # the spider's own request with dont_obey_robotstxt is its work
    own = Request(
        "http://a.example/x",
        meta={
            "dont_obey_robotstxt": True,
            "download_slot": "a.example",
            "download_latency": 0.1,
            "download_timeout": 180,
            "depth": 2,
            "retry_times": 1,
            "mine": 1,
        },
    )
    letter = deadletter.for_request(own, **kwargs)
    assert not letter.internal
    assert letter.request["meta"] == {"dont_obey_robotstxt": True, "mine": 1}
    # an older record that still holds engine meta: the replay never carries it
    letter.request["meta"].update({"download_slot": "a.example", "depth": 3})
    assert replay_request(letter, spider).meta == {
        "dont_obey_robotstxt": True,
        "mine": 1,
        "openclaw_replay_of": letter.id,
    }
