"""DeadlinePriorityQueue in real crawls against the chaos site (server ground truth)."""

from __future__ import annotations

from collections import Counter

from scrapy_openclaw.testing.chaos import ChaosConfig, HostConfig
from scrapy_openclaw.testing.crawl import run_crawl
from scrapy_openclaw.testing.presets import address, fault_free_site

QUEUE = {"SCHEDULER_PRIORITY_QUEUE": "scrapy_openclaw.pqueues.DeadlinePriorityQueue"}


def test_jobdir_pause_and_resume_with_scrapys_scheduler(chaos_server, tmp_path):
    config = fault_free_site(n_hosts=3, pages=25, links_per_page=3)
    server = chaos_server(config)
    jobdir = tmp_path / "job"
    settings = {**QUEUE, "JOBDIR": str(jobdir), "CONCURRENT_REQUESTS": 4}
    first = run_crawl(
        settings={**settings, "CLOSESPIDER_PAGECOUNT": 12},
        spider_args={"start_urls": server.start_urls},
        out_dir=tmp_path / "first",
    )
    assert first.stats.get("finish_reason") == "closespider_pagecount", first.log[-3000:]
    assert first.stats.get("openclaw/queue/persisted", 0) > 0
    assert (jobdir / "requests.queue" / "openclaw-queue.json").exists()

    # resumed without start URLs: start requests are dont_filter, Scrapy would fetch them again
    second = run_crawl(settings=settings, out_dir=tmp_path / "second")
    assert second.stats.get("finish_reason") == "finished", second.log[-3000:]
    assert second.stats.get("openclaw/queue/restored") == first.stats["openclaw/queue/persisted"]
    assert "Resuming crawl" in second.log

    scraped = Counter(item["url"] for item in first.items + second.items)
    reachable = server.reachable()
    assert set(scraped) == set(reachable.ok)
    assert max(scraped.values()) == 1  # every page scraped exactly once over both runs
    truth = server.truth()
    assert all(n == 1 for host in truth["hosts"].values() for n in host["counts"].values())


def test_a_due_retry_is_fetched_promptly_not_at_the_heartbeat(chaos_server, tmp_path):
    host = HostConfig(address=address(0), pages=1, links_per_page=0, status_script={0: (503, 200)})
    server = chaos_server(ChaosConfig(hosts=(host,), seed=1))
    delay = 1.5
    settings = {
        **QUEUE,
        "DOWNLOADER_MIDDLEWARES": {
            "scrapy.downloadermiddlewares.retry.RetryMiddleware": None,
            "scrapy_openclaw.retry.ClassifiedRetryMiddleware": 550,
        },
        "OPENCLAW_POLICY": {
            "defaults": {"retry": {"protocol_retryable": {"base_delay": delay, "max_delay": delay, "jitter": "none"}}}
        },
    }
    result = run_crawl(settings=settings, spider_args={"start_urls": server.start_urls}, out_dir=tmp_path / "out")
    assert result.stats.get("finish_reason") == "finished", result.log[-3000:]
    requests = server.truth()["hosts"][host.address]["requests"]
    assert [r["status"] for r in requests] == [503, 200]
    gap = requests[1]["t"] - requests[0]["t"]
    # the retry is due `delay` after the 503; the engine's heartbeat alone would add up to 5 s
    assert delay * 0.95 <= gap < delay + 1.5, gap
    assert result.stats.get("openclaw/queue/wakeups", 0) >= 1
    assert len(result.items) == 1


def test_a_domain_never_has_more_downloads_than_its_slot_concurrency(chaos_server, tmp_path):
    """The queue counts requests still in the downloader middlewares (not yet in ``slot.active``):
    one engine loop used to hand a fast domain every free CONCURRENT_REQUESTS place, and each
    download past CONCURRENT_REQUESTS_PER_DOMAIN opened (and closed) a TCP connection."""
    host = HostConfig(address=address(0), pages=80, links_per_page="all", latency=0.02)
    server = chaos_server(ChaosConfig(hosts=(host,), seed=1))
    settings = {
        "ADDONS": {"scrapy_openclaw.Addon": 100},
        "CONCURRENT_REQUESTS": 16,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 3,
    }
    result = run_crawl(settings=settings, spider_args={"start_urls": server.start_urls}, out_dir=tmp_path / "out")
    assert result.stats.get("finish_reason") == "finished", result.log[-3000:]
    truth = server.truth()["hosts"][host.address]
    assert len(truth["requests"]) == 80
    assert truth["max_in_flight"] <= 3
