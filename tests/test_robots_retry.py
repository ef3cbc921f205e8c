"""robots.txt (Scrapy's own request, fetched past the scheduler) retried as a user expects.

A crawl's robots.txt is downloaded with ``engine.download``: a retry copy returned by a
middleware is sent again at once, whatever its not-before time. Found by a QA crawl on a
fresh project: six robots.txt requests in 14 ms to a host answering 503, and one Ctrl-C
that took two minutes while robots.txt answered 429 + ``Retry-After: 20``. Judged from
the chaos site's record of what it served.
"""

from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING, Any

from scrapy_openclaw.testing.chaos import ChaosConfig, FailWindows, HostConfig, RateLimit
from scrapy_openclaw.testing.crawl import read_result, run_crawl, start_crawl
from scrapy_openclaw.testing.servers import stop_process

if TYPE_CHECKING:
    from pathlib import Path

ADDON = {"ADDONS": {"scrapy_openclaw.Addon": 100}, "LOG_LEVEL": "DEBUG", "ROBOTSTXT_OBEY": True}
HOST = "127.0.0.2"


def _robots(server: Any) -> list[float]:
    requests = server.truth()["hosts"][HOST]["requests"]
    return [r["t"] for r in requests if r["path"] == "/robots.txt"]


def test_a_failing_robots_txt_is_retried_as_scrapy_retries_it_with_its_backoff(
    chaos_server: Any, tmp_path: Path
) -> None:
    """Every answer a 503: robots.txt gets Scrapy's RETRY_TIMES (2), each after its backoff (the
    page schedule: 0.25-0.5 s, then 0.5-1 s), not six requests at once; then the crawl goes on
    (robots.txt failed: everything allowed, as in Scrapy) and the page is a dead letter."""
    site = ChaosConfig(hosts=(HostConfig(address=HOST, pages=3, fail_windows=FailWindows(period=3600, down=3600)),))
    server = chaos_server(site)
    settings = {**ADDON, "OPENCLAW_DLQ_URI": str(tmp_path / "dead.jsonl")}
    result = run_crawl(settings=settings, spider_args={"start_urls": server.start_urls}, timeout=180)
    result.assert_ok()
    times = _robots(server)
    assert len(times) == 3, times  # (6 before: the page's retries)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert min(gaps) >= 0.2, gaps  # (waited: a lower bound, which a busy machine only lengthens)
    assert "Gave up retrying <GET http://127.0.0.2" in result.log and "robots.txt" in result.log
    assert (tmp_path / "dead.jsonl").exists()  # the page itself: retried, then one dead letter


def test_a_stop_is_not_kept_waiting_by_a_robots_txt_under_a_long_retry_after(chaos_server: Any, tmp_path: Path) -> None:
    """Every answer a 429 + ``Retry-After: 600``: the crawl is stopped (SIGTERM, as Scrapy's Ctrl-C)
    while robots.txt waits for its retry, and it ends without asking for robots.txt again, and
    without waiting out the hold for the page that waited for it in its download slot (before,
    each retry waited out the hold: two minutes at ``Retry-After: 20``, 10 at 600)."""
    limit = RateLimit(rate=0.0, every=1, retry_after="600")  # (every request refused)
    server = chaos_server(ChaosConfig(hosts=(HostConfig(address=HOST, pages=3, rate_limit=limit),)))
    proc = start_crawl(settings=ADDON, spider_args={"start_urls": server.start_urls}, out_dir=tmp_path / "crawl")
    try:
        for _ in range(600):  # (bounded: the first robots.txt request, then the stop)
            if _robots(server) or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert len(_robots(server)) == 1
        time.sleep(1.0)  # (its retry is waiting now)
        proc.send_signal(signal.SIGTERM)
        proc.wait(90)  # (a hold of 600 s before)
    finally:
        stop_process(proc)
    result = read_result(tmp_path / "crawl", proc.returncode)
    assert proc.returncode == 0, result.log[-3000:]
    assert "Received SIGTERM" in result.log or "shutting down gracefully" in result.log, result.log[-3000:]
    assert len(_robots(server)) == 1  # not asked again
    # the start page had left the scheduler to wait for robots.txt: it goes once, not after the hold
    assert len([r for r in server.truth()["hosts"][HOST]["requests"] if r["path"] != "/robots.txt"]) <= 1


def test_a_missing_robots_txt_is_no_dead_letter_in_the_stats(chaos_server: Any, tmp_path: Path) -> None:
    """robots.txt answering 404 (no robots.txt) is never stored as a dead letter, so
    ``openclaw/retry/permanent_dead_letters`` counts only the page's own 404 (it counted both)."""
    server = chaos_server(ChaosConfig(hosts=(HostConfig(address=HOST, pages=4, links_per_page="all", not_found=(2,)),)))
    settings = {**ADDON, "OPENCLAW_DLQ_URI": str(tmp_path / "dead.jsonl")}
    result = run_crawl(settings=settings, spider_args={"start_urls": server.start_urls}, timeout=120)
    result.assert_ok()
    assert _robots(server) and result.stats["robotstxt/response_status_count/404"] == 1
    assert result.stats["openclaw/retry/permanent_dead_letters"] == 1
    assert result.stats["openclaw/dlq/count"] == 1
