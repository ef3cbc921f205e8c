"""The documented commands as a newcomer runs them, in a fresh ``scrapy startproject`` project:
``openclaw-ctl`` against a crawl without live control, and ``openclaw-dlq replay -o`` writing the
recovered pages' items (real processes, the chaos site)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from scrapy_openclaw.testing.servers import stop_process, subprocess_env
from tests.first_hour_project import add_settings, scrapy, start_project

FOLLOW = """import scrapy


class FollowSpider(scrapy.Spider):
    name = "follow"

    def __init__(self, start_urls="", **kwargs):
        super().__init__(**kwargs)
        self.start_urls = [u for u in start_urls.split(",") if u]

    def parse(self, response):
        yield {"url": response.url, "title": response.css("title::text").get()}
        yield from response.follow_all(css="a")
"""
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def follow_project(tmp_path: Path, settings: str = "") -> Path:
    root = start_project(tmp_path)
    (root / "proj" / "spiders" / "follow.py").write_text(FOLLOW, encoding="utf-8")
    add_settings(root, "LOG_LEVEL = 'INFO'\n" + settings)
    return root


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_ctl_against_a_crawl_without_a_token_names_the_setting(chaos_server: Any, tmp_path: Path) -> None:
    server = chaos_server({"hosts": [{"address": "127.0.0.2", "pages": 200, "links_per_page": 2, "latency": 0.5}]})
    port = free_port()
    root = follow_project(tmp_path, f"OPENCLAW_METRICS_PORT = {port}\nCONCURRENT_REQUESTS = 1")
    with open(tmp_path / "crawl.log", "wb") as log:
        crawl = subprocess.Popen(
            [sys.executable, "-m", "scrapy", "crawl", "follow", "-a", f"start_urls={server.start_urls[0]}"],
            cwd=root,
            env=subprocess_env(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 90
        while True:  # until the crawl serves /metrics
            assert crawl.poll() is None and time.monotonic() < deadline, (tmp_path / "crawl.log").read_text()
            try:
                with _OPENER.open(f"http://127.0.0.1:{port}/metrics", timeout=5):
                    break
            except OSError:
                time.sleep(0.2)
        run = scrapy(root, "openclaw-ctl", "domains")
    finally:
        stop_process(crawl, timeout=30)
    assert run.returncode != 0, run.output
    last = run.lines[-1]
    assert "live control is off" in last and "OPENCLAW_CONTROL_TOKEN" in last, run.output
    assert "Not Found" not in run.output and "Traceback" not in run.output


def test_replay_with_o_writes_the_recovered_items(chaos_server: Any, tmp_path: Path) -> None:
    """Page 3 fails its whole retry schedule (a dead letter), then answers: the replay's item lands in -o."""
    server = chaos_server(
        {
            "hosts": [
                {"address": "127.0.0.2", "pages": 6, "links_per_page": "all", "status_script": {"3": [503] * 6 + [200]}}
            ]
        }
    )
    base = server.start_urls[0]
    root = follow_project(tmp_path)
    crawl = scrapy(root, "crawl", "follow", "-a", f"start_urls={base}", timeout=180)
    assert crawl.returncode == 0, crawl.output[-3000:]
    assert "1 dead letter(s) written" in crawl.output, crawl.output[-3000:]
    replay = scrapy(root, "openclaw-dlq", "replay", "follow", "-o", "items.jsonl", timeout=180)
    assert replay.returncode == 0, replay.output[-3000:]
    assert "1 recovered" in replay.output, replay.output[-3000:]
    items = [json.loads(line) for line in (root / "items.jsonl").read_text().splitlines()]
    assert [item["url"] for item in items] == [f"{base}page/3"]
    truth = server.truth()["hosts"]["127.0.0.2"]
    assert [r["status"] for r in truth["requests"] if r["path"] == "/page/3"] == [503] * 6 + [200]
