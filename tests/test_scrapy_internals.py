"""Each Scrapy internal we rely on (scrapy_openclaw.scrapy_internals) does what we use it for,
on the installed Scrapy: CI runs this file on the newest and on the lowest supported Scrapy."""

from __future__ import annotations

import io
import json
from typing import TYPE_CHECKING, Any

import pytest
import scrapy
from scrapy import signals
from scrapy.exporters import JsonItemExporter
from scrapy.utils.test import get_crawler

from scrapy_openclaw import scrapy_internals as si
from scrapy_openclaw.testing.crawl import run_crawl
from scrapy_openclaw.testing.presets import fault_free_site

if TYPE_CHECKING:
    from pathlib import Path

SPIDER = "tests.scrapy_internals_spiders.ProbeSpider"
BASE_SETTINGS = {
    "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
    "DOWNLOAD_DELAY": 0,
    "ROBOTSTXT_OBEY": False,
    "RETRY_ENABLED": False,
    "LOG_LEVEL": "DEBUG",
}


def probe(chaos_server: Any, tmp_path: Path, name: str, **settings: Any) -> tuple[list[dict], list[dict]]:
    """Run the probe spider's *name* probe; its items and its other records, in order."""
    cfg = fault_free_site(n_hosts=1, pages=10, links_per_page=0).to_dict()
    server = chaos_server(cfg)
    records = tmp_path / "records.json"
    result = run_crawl(
        SPIDER,
        {**BASE_SETTINGS, **settings},
        spider_args={"base": server.start_urls[0], "probe": name, "records": str(records)},
        out_dir=tmp_path / "out",
        timeout=60,
    )
    result.assert_ok()
    return result.items, json.loads(records.read_text(encoding="utf-8"))


def by_event(rows: list[dict], event: str) -> list[dict]:
    return [row for row in rows if row["event"] == event]


# --- in a crawl ---------------------------------------------------------------------------


def test_pause_slot_delays_the_requests_queued_in_the_slot(chaos_server: Any, tmp_path: Path) -> None:
    items, _ = probe(chaos_server, tmp_path, "pause")
    [paused] = by_event(items, "paused")
    fetched = by_event(items, "fetched")
    assert len(fetched) == 2
    assert all(row["t"] >= paused["until"] - 0.05 for row in fetched)
    # slot_clock is the clock of Slot.lastseen (time.time and time.monotonic differ by decades)
    assert paused["clock_gap"] < 60


def test_resume_slot_releases_a_paused_slot_at_once(chaos_server: Any, tmp_path: Path) -> None:
    items, records = probe(chaos_server, tmp_path, "resume")
    [resumed] = by_event(records, "resumed")
    [fetched] = by_event(items, "fetched")
    assert resumed["t"] <= fetched["t"] < resumed["t"] + 10  # the pause was 60 s


def test_drain_slot_queue_takes_every_queued_request_and_its_errback_drops_it(
    chaos_server: Any, tmp_path: Path
) -> None:
    items, records = probe(chaos_server, tmp_path, "drain")
    assert [row["n"] for row in by_event(records, "drained")] == [3]
    failed = by_event(items, "failed")
    assert sorted(row["url"].rsplit("/", 1)[1] for row in failed) == ["1", "2", "3"]
    assert {row["error"] for row in failed} == {"IgnoreRequest"}
    assert not by_event(items, "fetched")


def test_wake_engine_pulls_from_the_scheduler_before_the_heartbeat(chaos_server: Any, tmp_path: Path) -> None:
    """The probe sets the engine's heartbeat to 60 s: a request put straight into the
    scheduler waits until the wake-up, and goes right after it."""
    items, records = probe(chaos_server, tmp_path, "wake")
    [activity] = by_event(items, "activity")
    assert activity["in_flight"] == 0  # (a callback runs after its download left the downloader)
    assert isinstance(activity["slots"], dict)
    [enqueued] = by_event(records, "enqueued")
    assert enqueued["pending"] == 1  # scheduler_of found the engine's scheduler
    [woken] = by_event(records, "woken")
    [fetched] = by_event(items, "fetched")
    assert woken["t"] <= fetched["t"] < woken["t"] + 10


def test_track_engine_requests_reports_a_request_finished_only_after_its_items_left_the_pipelines(
    chaos_server: Any, tmp_path: Path
) -> None:
    items, records = probe(
        chaos_server,
        tmp_path,
        "lifecycle",
        ITEM_PIPELINES={"tests.scrapy_internals_spiders.SlowPipeline": 100},
    )
    first, child = (row["url"] for row in by_event(records, "added"))
    order = [(row["event"], row["url"]) for row in records]
    assert order.index(("pipeline_done", first)) < order.index(("removed", first))
    assert order.index(("added", child)) < order.index(("removed", child))
    assert len(by_event(records, "removed")) == 2


# --- without a crawl ----------------------------------------------------------------------


class _Spider(scrapy.Spider):
    name = "unit"


def test_outside_a_crawl_there_is_no_engine_slot_or_scheduler() -> None:
    crawler = get_crawler(_Spider)
    assert si.engine_of(crawler) is None
    assert si.engine_slot(None) is None
    assert si.scheduler_of(None) is None
    assert si.downloader_activity(None) is None
    assert si.download_slot(crawler, "example.com") is None
    assert list(si.drain_slot_queue(None)) == []
    assert not si.track_engine_requests(None, print, print)
    assert not si.start_requests_pending(None)
    si.wake_engine(crawler)  # a no-op, not an error


def test_download_error_types_are_those_this_scrapy_has() -> None:
    found = si.download_error_types("DownloadTimeoutError", "CannotResolveHostError", "NoSuchError")
    assert len(found) == (2 if scrapy.version_info >= (2, 15) else 0)
    assert all(issubclass(t, Exception) for t in found)
    assert issubclass(si.tunnel_error(), Exception)


def test_is_robots_refusal_knows_the_robots_middlewares_refusal_and_nothing_else() -> None:
    from scrapy.downloadermiddlewares.robotstxt import RobotsTxtMiddleware
    from scrapy.exceptions import IgnoreRequest
    from scrapy.robotstxt import ProtegoRobotParser

    crawler = get_crawler(settings_dict={"ROBOTSTXT_OBEY": True})
    middleware = RobotsTxtMiddleware.from_crawler(crawler)
    parser = ProtegoRobotParser(b"User-agent: *\nDisallow: /private\n", None)
    with pytest.raises(IgnoreRequest) as refused:
        middleware.process_request_2(parser, scrapy.Request("http://127.0.0.2/private/1"))
    assert si.is_robots_refusal(refused.value)
    assert middleware.process_request_2(parser, scrapy.Request("http://127.0.0.2/public")) is None
    assert not si.is_robots_refusal(IgnoreRequest("Offsite"))
    assert not si.is_robots_refusal(ValueError("Forbidden by robots.txt"))


def test_robots_parsed_signal_exists_from_2_18() -> None:
    sig = si.robots_parsed_signal()
    assert sig is (signals.robots_parsed if scrapy.version_info >= (2, 18) else None)


def test_continue_json_array_writes_a_comma_before_the_next_item() -> None:
    out = io.BytesIO()
    exporter = JsonItemExporter(out)
    exporter.start_exporting()
    si.continue_json_array(exporter)
    exporter.export_item({"a": 1})
    exporter.finish_exporting()
    text = out.getvalue().decode()
    assert text.startswith("[,") and text.rstrip().endswith("]")


@pytest.mark.parametrize("newer", [scrapy.version_info >= (2, 16)])
def test_slot_clock_is_the_lastseen_clock(newer: bool) -> None:
    import time

    assert si.slot_clock is (time.monotonic if newer else time.time)


def test_new_slot_concurrency_is_the_one_the_downloader_gives_a_new_slot() -> None:
    from scrapy.core.downloader import Downloader

    crawler = get_crawler(
        settings_dict={"CONCURRENT_REQUESTS_PER_DOMAIN": 3, "DOWNLOAD_SLOTS": {"slow.example": {"concurrency": 1}}}
    )
    downloader = Downloader(crawler)
    assert si.new_slot_concurrency(downloader, "fast.example") == 3
    assert si.new_slot_concurrency(downloader, "slow.example") == 1
