"""One domain key: health, queue, retry budgets, metrics and dead letters agree in a real crawl.

"Domain" is the download-slot key (``scrapy_internals.slot_key``), for a dead letter's
items as for its requests (``deadletter.domain_of``); these crawls
set ``meta["download_slot"]`` or ``CONCURRENT_REQUESTS_PER_IP``, where the slot
key is not the host name, and check every component filed the requests under it.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from scrapy.core.downloader import Downloader
from scrapy.http import Request

from scrapy_openclaw.scrapy_internals import slot_key
from scrapy_openclaw.testing.crawl import run_crawl
from scrapy_openclaw.testing.presets import mixed_failures_site
from scrapy_openclaw.testing.resolver import resolver_settings

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

SPIDER = "tests.slot_key_spiders.SlotKeySpider"
SETTINGS = {
    "ADDONS": {"scrapy_openclaw.Addon": 100},
    "SCHEDULER_PRIORITY_QUEUE": "tests.slot_key_spiders.RecordingQueue",
    "OPENCLAW_LOG_DOMAINS": 10,  # keeps the metrics extension on
    "ITEM_PIPELINES": {"tests.slot_key_spiders.RefuseRootPages": 300},  # + dead letters for items
    "LOG_LEVEL": "INFO",
}


def _crawl(
    chaos_server: Any, tmp_path: Path, starts: Callable[[Any], list[str]], settings: dict[str, Any], **spider_args: str
) -> tuple[dict[str, list[str]], set[str]]:
    server = chaos_server(mixed_failures_site(pages=30))
    starts = starts(server)
    records = tmp_path / "records.json"
    result = run_crawl(
        SPIDER,
        {**SETTINGS, "OPENCLAW_DLQ_URI": str(tmp_path / "dead.jsonl"), **settings},
        spider_args={"start_urls": ",".join(starts), "records": str(records), **spider_args},
        out_dir=tmp_path / "out",
        timeout=120,
    )
    result.assert_ok()
    assert result.items, result.log[-3000:]
    dead = tmp_path / "dead.jsonl"
    letters = [json.loads(line) for line in dead.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert letters, "the broken pages should end as dead letters"
    # the root pages' items too: one per start URL, under the same domain key as the requests
    assert sum(r["error_class"] == "business" for r in letters) == len(starts), letters
    return json.loads(records.read_text(encoding="utf-8")), {r["domain"] for r in letters}


def _agree(records: dict[str, list[str]], dead_letter_domains: set[str], keys: set[str]) -> None:
    for component in ("health", "queue", "budgets", "metrics"):
        assert set(records[component]) == keys, (component, records)
    assert dead_letter_domains <= keys


def test_download_slot_meta_is_the_domain(chaos_server: Any, tmp_path: Path) -> None:
    """Both hosts in one ``download_slot``: every component sees one domain, the slot."""
    records, dead = _crawl(chaos_server, tmp_path, lambda server: server.start_urls, {}, slot="pool")
    _agree(records, dead, {"pool"})
    assert dead == {"pool"}


def test_per_ip_concurrency_keys_by_ip(chaos_server: Any, tmp_path: Path) -> None:
    """Two host names on the broken host's IP, ``CONCURRENT_REQUESTS_PER_IP``: one domain, the IP."""
    hosts = {"a.test": "127.0.0.3", "www.a.test": "127.0.0.3"}

    def starts(server: Any) -> list[str]:
        port = server.urls["127.0.0.3"].rstrip("/").rsplit(":", 1)[1]
        return [f"http://{host}:{port}/" for host in hosts]

    records, dead = _crawl(
        chaos_server,
        tmp_path,
        starts,
        {"CONCURRENT_REQUESTS_PER_IP": 2, **resolver_settings(hosts)},
        dns=json.dumps(hosts),
    )
    _agree(records, dead, {"127.0.0.3"})
    assert dead == {"127.0.0.3"}


def test_slot_key_without_an_engine() -> None:
    """Before the crawl (no downloader): the meta slot, else the host name."""
    assert slot_key(None, Request("http://Example.COM:8080/x")) == "example.com"
    assert slot_key(None, Request("http://example.com/", meta={Downloader.DOWNLOAD_SLOT: "s"})) == "s"


def test_a_dead_letter_without_a_request_gets_the_key_a_request_for_its_url_would() -> None:
    from scrapy_openclaw.deadletter import domain_of

    assert domain_of(None, "http://Example.COM:8080/x") == "example.com"
    assert domain_of(None, "http://a.test/", Request("http://a.test/", meta={Downloader.DOWNLOAD_SLOT: "s"})) == "s"
    assert domain_of(None, "no scheme here") == ""
