"""A JOBDIR written with our queue and resumed with Scrapy's (or the reverse) stops at start, saying why.

Neither side can read the other's pending requests (Scrapy's disk queues are
pickle, which we never load; Scrapy's queues do not know our JSON file), so the
promise is: no silent resume of nothing, no bare TypeError, but a message that
names both queue classes, before any page is fetched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from scrapy_openclaw.pqueues.queuefile import FOREIGN_READER_STOP
from scrapy_openclaw.testing.crawl import run_crawl
from scrapy_openclaw.testing.presets import fault_free_site

OURS = "scrapy_openclaw.pqueues.DeadlinePriorityQueue"
SCRAPYS = ["scrapy.pqueues.DownloaderAwarePriorityQueue", "scrapy.pqueues.ScrapyPriorityQueue"]
LIFO, FIFO = "scrapy.squeues.PickleLifoDiskQueue", "scrapy.squeues.PickleFifoDiskQueue"


def _paused(chaos_server: Any, tmp_path: Path, queue: str, disk_queue: str) -> tuple[Any, dict[str, Any]]:
    server = chaos_server(fault_free_site(n_hosts=2, pages=15, links_per_page=3))
    settings = {
        "JOBDIR": str(tmp_path / "job"),
        "CONCURRENT_REQUESTS": 2,
        "SCHEDULER_DISK_QUEUE": disk_queue,
        "SCHEDULER_PRIORITY_QUEUE": queue,
    }
    first = run_crawl(
        settings={**settings, "CLOSESPIDER_PAGECOUNT": 5},
        spider_args={"start_urls": server.start_urls},
        out_dir=tmp_path / "first",
    )
    assert first.stats.get("finish_reason") == "closespider_pagecount", first.log[-3000:]
    assert first.stats.get("scheduler/enqueued/disk", 0) > first.stats.get("scheduler/dequeued/disk", 0)
    return server, settings


def _stopped_at_start(result: Any) -> None:
    assert not result.items, "a page was fetched from a JOBDIR that could not be resumed"
    assert result.stats.get("downloader/request_count", 0) == 0, result.log[-3000:]


@pytest.mark.parametrize("disk_queue", [LIFO, FIFO], ids=["lifo", "fifo"])
@pytest.mark.parametrize("theirs", SCRAPYS, ids=["downloader-aware", "scrapy-priority"])
def test_ours_resumed_with_scrapys_queue_stops_at_start(
    chaos_server: Any, tmp_path: Path, theirs: str, disk_queue: str
) -> None:
    _, settings = _paused(chaos_server, tmp_path, OURS, disk_queue)
    second = run_crawl(settings={**settings, "SCHEDULER_PRIORITY_QUEUE": theirs}, out_dir=tmp_path / "second")
    _stopped_at_start(second)
    assert FOREIGN_READER_STOP in second.log, second.log[-3000:]
    assert "scrapy.pqueues.DownloaderAwarePriorityQueue and ScrapyPriorityQueue cannot resume" in second.log


@pytest.mark.parametrize("theirs", SCRAPYS, ids=["downloader-aware", "scrapy-priority"])
def test_scrapys_resumed_with_ours_stops_at_start(chaos_server: Any, tmp_path: Path, theirs: str) -> None:
    _, settings = _paused(chaos_server, tmp_path, theirs, LIFO)
    second = run_crawl(settings={**settings, "SCHEDULER_PRIORITY_QUEUE": OURS}, out_dir=tmp_path / "second")
    _stopped_at_start(second)
    assert f"was written by {theirs}, which {OURS} cannot resume" in second.log, second.log[-3000:]


def test_ours_still_resumes_ours(chaos_server: Any, tmp_path: Path) -> None:
    """The marker that stops Scrapy's queues changes nothing for ours (every request resumes)."""
    server, settings = _paused(chaos_server, tmp_path, OURS, LIFO)
    second = run_crawl(settings=settings, out_dir=tmp_path / "second")
    assert second.stats.get("finish_reason") == "finished", second.log[-3000:]
    assert second.stats.get("openclaw/queue/restored", 0) > 0
    first_items = (tmp_path / "first" / "items.jsonl").read_text().splitlines()
    assert len(first_items) + len(second.items) >= len(server.reachable().ok)
