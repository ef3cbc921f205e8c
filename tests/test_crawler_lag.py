"""A crawler slow on its own is not a slow site: its event-loop stalls are subtracted from the
latency readings the health controller judges sites by (issue 35)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from scrapy_openclaw.health.lag import _PERIOD, BUSY_SHARE, CrawlerLag
from scrapy_openclaw.health.registry import HealthRegistry
from scrapy_openclaw.testing.chaos import ChaosConfig, HostConfig
from scrapy_openclaw.testing.crawl import run_crawl

if TYPE_CHECKING:
    from pathlib import Path


def test_stalled_time_is_the_overlap_of_the_stalls_with_a_span() -> None:
    lag = CrawlerLag(clock=lambda: 0.0)
    lag.note(10.0, 10.5)  # a tick due at 10.0 ran at 10.5: busy from 10.0 to 10.5
    lag.note(11.0, 11.001)  # on time (noise)
    lag.note(12.0, 12.2)
    assert lag.stalled(9.0, 13.0) == pytest.approx(0.7)
    assert lag.stalled(10.25, 12.1) == pytest.approx(0.35)  # half of the first, half of the second
    assert lag.stalled(10.5, 12.0) == 0.0
    assert (lag.total, lag.worst) == (pytest.approx(0.7), 0.5)


def test_a_stall_under_way_counts_before_its_tick_has_run() -> None:
    lag = CrawlerLag(clock=lambda: 0.0)
    lag._expected = 20.0  # the next tick was due at 20.0 and has not run by 20.3
    assert lag.stalled(19.9, 20.3) == pytest.approx(0.3)


def _readings(registry: HealthRegistry, lag: CrawlerLag | None, stalled: bool) -> int:
    """Feed a site answering in 20 ms; in the middle the crawler stalls 0.4 s every 0.5 s
    (the readings taken then are 0.4 s late). Returns the latency cuts."""
    registry.crawler_lag = lag
    now = 1000.0
    for i in range(400):
        now += 0.01
        inflated = stalled and 100 <= i < 300 and i % 50 < 10
        if inflated and lag is not None and i % 50 == 0:
            lag.note(now - 0.4, now)
        registry.record_success("site", 0.42 if inflated else 0.02, now=now)
    return registry.cuts_by_cause["latency"]


def test_a_stalled_crawler_does_not_cut_a_steady_sites_rate() -> None:
    assert _readings(HealthRegistry(), None, stalled=True) >= 1  # unwatched, the stalls read as congestion
    assert _readings(HealthRegistry(), CrawlerLag(clock=lambda: 0.0), stalled=True) == 0
    assert _readings(HealthRegistry(), CrawlerLag(clock=lambda: 0.0), stalled=False) == 0


def test_a_busy_crawler_is_reported_once() -> None:
    now = [0.0]
    said: list[tuple[float, float]] = []
    lag = CrawlerLag(clock=lambda: now[0], on_busy=lambda share, seconds: said.append((share, seconds)))
    lag._expected = lag.tick
    for _ in range(3 * int(_PERIOD / lag.tick)):  # every tick runs a tick late: half the time stalled
        now[0] = lag._expected + lag.tick
        lag._sample()
    assert len(said) == 1 and said[0][0] >= BUSY_SHARE


def test_a_crawl_whose_callbacks_stall_keeps_a_steady_sites_pace(chaos_server: Any, tmp_path: Path) -> None:
    """A plain-latency site crawled by a spider that holds the loop 0.4 s every 25 pages:
    the crawl sees its own stalls and cuts the site's rate for none of them."""
    server = chaos_server(ChaosConfig(hosts=(HostConfig("127.0.0.2", pages=300, links_per_page=20, latency=0.02),)))
    settings = {
        "ADDONS": {"scrapy_openclaw.Addon": 100},
        "OPENCLAW_DLQ_URI": str(tmp_path / "dead.jsonl"),
        "LOG_LEVEL": "INFO",
    }
    result = run_crawl(
        spider="scrapy_openclaw.testing.spiders.StallingSpider",
        settings=settings,
        spider_args={"start_urls": server.start_urls, "stall": 0.4, "every": 25},
        timeout=180,
    )
    assert result.returncode == 0, result.log[-3000:]
    assert len(result.items) == len(server.reachable().ok)
    stalls = sum(1 for item in result.items if item["stalled"])
    assert stalls >= 10
    stats = result.stats
    assert stats["openclaw/health/crawler_stalled_seconds"] >= 0.9 * 0.4 * stalls  # it saw its own stalls
    assert stats["openclaw/health/crawler_stall_max"] >= 0.35
    cuts = {k: v for k, v in stats.items() if k.startswith("openclaw/health/rate_cuts/")}
    assert cuts == {}, cuts  # the site never slowed: no cut of any cause
