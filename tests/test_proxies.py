"""Proxied crawls (``meta["proxy"]``) keep their proxy on checkpoint resume, in distributed mode and in
replay; a proxy answering 407 is named. Proved on a real forward proxy on loopback
(:mod:`scrapy_openclaw.testing.proxy`): every request the chaos site served came through it."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
from test_checkpoint_crawl import items_of, settings, wait_for
from test_distributed import bench
from test_dlq_crawl import cli, dlq_settings, make_project, require_cli

from scrapy_openclaw.deadletter import DeadLetter
from scrapy_openclaw.dlq import JsonlStore
from scrapy_openclaw.testing.crawl import read_result, run_crawl, start_crawl
from scrapy_openclaw.testing.proxy import ForwardProxy

SPIDER = "scrapy_openclaw.testing.proxy.ProxiedChaosSpider"
CREDENTIALS = ("crawler", "pr0xy-PW-77")


@pytest.fixture
def proxy() -> Any:
    with ForwardProxy(CREDENTIALS) as server:
        yield server


def site_requests(site: Any) -> list[str]:
    """Every URL the chaos site was asked for (its ground truth), in order."""
    urls = []
    for host in site.truth()["hosts"].values():
        base = host["base_url"].rstrip("/")
        urls += [base + r["path"] for r in host["requests"]]
    return urls


def assert_all_through(proxy: ForwardProxy, site: Any) -> None:
    forwarded = proxy.forwarded()
    assert sorted(site_requests(site)) == sorted(forwarded), "a request reached the site without the proxy"
    assert all(r["proxy_authorization"] for r in proxy.record), "a request came without its proxy credentials"


def test_a_proxied_crawl_resumes_from_its_checkpoint_through_the_proxy(
    chaos_server: Any, proxy: ForwardProxy, tmp_path: Path
) -> None:
    site = chaos_server({"hosts": [{"address": "127.0.0.2", "pages": 60, "links_per_page": 4, "latency": 0.1}]})
    ckpt, items = tmp_path / "ckpt", tmp_path / "items.jsonl"
    cfg = settings(ckpt, items, OPENCLAW_CHECKPOINT_SNAPSHOT_INTERVAL=60.0, CONCURRENT_REQUESTS=2)
    args = {"start_urls": site.start_urls, "proxy": proxy.url_with_credentials()}
    first = start_crawl(SPIDER, cfg, args, out_dir=tmp_path / "r1")
    assert wait_for(lambda: len(items_of(items)) >= 5, 30)
    first.send_signal(signal.SIGTERM)
    first.wait(30)
    assert read_result(tmp_path / "r1").stats.get("finish_reason") == "shutdown"
    second = run_crawl(SPIDER, cfg, {**args, "start_urls": []}, out_dir=tmp_path / "r2")
    assert second.returncode == 0, second.log[-3000:]
    restored = second.stats.get("openclaw/checkpoint/restored", 0)
    assert restored > 0 and not second.stats.get("openclaw/checkpoint/unrestorable"), second.log[-3000:]
    assert "refused" not in second.log
    assert {i["url"] for i in items_of(items)} == site.reachable().ok
    assert_all_through(proxy, site)
    # the proxy password is in the checkpoint (a resume needs it) but in no log line
    assert CREDENTIALS[1] not in second.log and CREDENTIALS[1] not in read_result(tmp_path / "r1").log


def test_a_proxied_crawl_runs_distributed_through_the_proxy(
    chaos_server: Any, redis_server: Any, proxy: ForwardProxy, tmp_path: Path
) -> None:
    site = chaos_server({"hosts": [{"address": "127.0.0.2", "pages": 30, "links_per_page": 3}]})
    cfg = bench.ours(redis_server.url)
    worker = start_crawl(
        SPIDER,
        cfg,
        {"start_urls": site.start_urls, "proxy": proxy.url_with_credentials()},
        out_dir=tmp_path / "w0",
    )
    try:
        worker.wait(120)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
    result = read_result(tmp_path / "w0", worker.returncode)
    assert result.returncode == 0, result.log[-3000:]
    assert "refused" not in result.log, result.log[-3000:]
    assert not result.stats.get("openclaw/distributed/rejected")
    scraped = {json.loads(raw)["url"] for raw in bench.client(redis_server.url).lrange("chaos:items", 0, -1)}
    assert scraped == site.reachable().ok
    assert_all_through(proxy, site)


def test_dead_letters_of_a_proxied_crawl_replay_through_the_proxy(
    chaos_server: Any, proxy: ForwardProxy, tmp_path: Path
) -> None:
    site = chaos_server(
        {
            "hosts": [
                {
                    "address": "127.0.0.2",
                    "pages": 8,
                    "links_per_page": "all",
                    "status_script": {"3": [503, 503, 503, 200]},
                }
            ]
        }
    )
    base = site.urls["127.0.0.2"]
    path = tmp_path / "dl.jsonl"
    cfg = dlq_settings(str(path), max_attempts=2)
    first = run_crawl(
        SPIDER, cfg, {"start_urls": [base], "proxy": proxy.url_with_credentials()}, out_dir=tmp_path / "c"
    )
    assert first.returncode == 0, first.log[-3000:]
    letters = list(JsonlStore(path).iter())
    assert [d.url for d in letters] == [f"{base}page/3"]
    before = proxy.forwarded().count(f"{base}page/3")
    assert before == 2
    require_cli()
    project = make_project(tmp_path / "proj", cfg)
    dry = cli(project, "replay", "chaos", "--class", "protocol_retryable", "--dry-run")
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "would replay 1" in dry.stdout and CREDENTIALS[1] not in dry.stdout + dry.stderr
    replay = cli(project, "replay", "chaos", "--class", "protocol_retryable")
    assert replay.returncode == 0, replay.stderr[-3000:]
    assert "replayed 1 dead letter(s) of chaos" in replay.stdout and "1 recovered" in replay.stdout
    assert CREDENTIALS[1] not in replay.stdout + replay.stderr
    assert proxy.forwarded().count(f"{base}page/3") == 4  # the replay: the last 503, then the 200
    assert_all_through(proxy, site)


def test_a_proxy_answering_407_is_named(chaos_server: Any, tmp_path: Path) -> None:
    site = chaos_server({"hosts": [{"address": "127.0.0.2", "pages": 3, "links_per_page": 2}]})
    path = tmp_path / "dl.jsonl"
    with ForwardProxy(CREDENTIALS) as proxy:
        wrong = f"http://crawler:wrong@{proxy.address}"
        result = run_crawl(SPIDER, dlq_settings(str(path)), {"start_urls": site.start_urls, "proxy": wrong})
    assert result.returncode == 0, result.log[-3000:]
    assert not site_requests(site) and proxy.record and not proxy.forwarded()
    message = f"proxy {proxy.address} refused authentication"
    assert result.log.count(message) == 1, result.log[-3000:]  # once per proxy, not once per request
    letters: list[DeadLetter] = list(JsonlStore(path).iter())
    assert letters and all(d.status == 407 and message in (d.exception_message or "") for d in letters)
    assert "wrong" not in result.log
