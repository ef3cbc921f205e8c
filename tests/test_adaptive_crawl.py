"""Adaptive control on the add-on's defaults, against sites it was not tuned for (issue 15).

Every crawl runs with nothing but ``ADDONS`` (plus a dead-letter file) and is
judged from the chaos site's record of what it served: a sick page is not a
sick domain, dead hosts end as dead letters within seconds, robots.txt
Crawl-delay spaces the requests.
"""

from __future__ import annotations

import inspect
import json
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest
import scrapy

from scrapy_openclaw.testing.crawl import run_crawl
from scrapy_openclaw.testing.presets import (
    UNRESOLVABLE_HOST,
    crawl_delay_site,
    fault_free_site,
    limit_sweep_site,
    mixed_failures_site,
    page_urls,
)
from scrapy_openclaw.testing.resolver import resolver_settings
from scrapy_openclaw.testing.servers import refused_base_url

if TYPE_CHECKING:
    from pathlib import Path

ADDON = {"ADDONS": {"scrapy_openclaw.Addon": 100}, "LOG_LEVEL": "INFO"}


def _crawl(server: Any, tmp_path: Path, starts: list[str] | None = None, **settings: Any) -> Any:
    settings = {**ADDON, "OPENCLAW_DLQ_URI": str(tmp_path / "dead.jsonl"), **settings}
    result = run_crawl(settings=settings, spider_args={"start_urls": starts or server.start_urls}, timeout=120)
    result.assert_ok()
    return result


def _dead_letters(tmp_path: Path) -> Counter[str]:
    path = tmp_path / "dead.jsonl"
    if not path.exists():
        return Counter()
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return Counter(r["url"] for r in records)


def _served(truth: dict[str, Any], host: str) -> list[dict[str, Any]]:
    return [r for r in truth["hosts"][host]["requests"] if r["path"] != "/robots.txt"]


def test_broken_pages_on_a_healthy_host_are_the_pages_trouble(chaos_server: Any, tmp_path: Path) -> None:
    """Every 5th page of one host always answers 503 (and a few 404): the host keeps its pace
    and health, every reachable page is scraped, every failing URL is one dead letter."""
    server = chaos_server(mixed_failures_site(pages=120))
    result = _crawl(server, tmp_path)
    truth = server.truth()

    def url(host: str, record: dict[str, Any]) -> str:
        return server.urls[host].rstrip("/") + record["path"]

    ok = {url(h, r) for h in truth["hosts"] for r in _served(truth, h) if r["status"] == 200}
    failed = {url(h, r) for h in truth["hosts"] for r in _served(truth, h) if r["status"] != 200} - ok
    scraped = {item["url"] for item in result.items}
    assert scraped == ok
    assert len(failed) >= 20
    letters = _dead_letters(tmp_path)
    assert set(letters) == failed  # every failing URL, none of the good ones ...
    assert max(letters.values()) == 1  # ... exactly once
    stats = result.stats
    assert stats["finish_reason"] == "finished"
    for host in truth["hosts"]:
        assert stats[f"openclaw/health/final_health/{host}"] >= 80, host
    assert stats.get("openclaw/health/circuit_opened", 0) == 0
    assert stats["openclaw/health/page_failures"] > stats.get("openclaw/health/domain_failures", 0)
    # a page's retries come on the short page schedule: about 5 s for six attempts, not minutes
    per_url = Counter(r["path"] for h in truth["hosts"] for r in _served(truth, h) if r["status"] == 503)
    assert max(per_url.values()) == 6


def test_dead_hosts_end_as_dead_letters_within_seconds(chaos_server: Any, tmp_path: Path) -> None:
    """A host that refuses connections and a name that does not resolve, 10 start URLs each,
    beside a healthy host: all 20 dead URLs become one dead letter each and the crawl ends."""
    server = chaos_server(fault_free_site(n_hosts=1, pages=30))
    dead = page_urls(refused_base_url("127.0.0.254"), 10) + page_urls(f"http://{UNRESOLVABLE_HOST}/", 10)
    result = _crawl(server, tmp_path, starts=server.start_urls + dead, **resolver_settings({UNRESOLVABLE_HOST: None}))
    stats = result.stats
    assert stats["finish_reason"] == "finished"
    # (how soon: unreachable_give_up after the circuit opened, on the registry's injected clock
    # in test_health_registry; here the events: every dead URL lettered, few attempts spent)
    assert len(result.items) == 31  # the healthy host in full
    letters = _dead_letters(tmp_path)
    assert set(letters) == set(dead)
    assert max(letters.values()) == 1
    assert stats["openclaw/health/given_up_domains"] == 2
    assert "Giving up on" in result.log
    # each dead host was tried a few times, not 6 attempts x 10 URLs (IgnoreRequest: the dead letters)
    attempts = sum(
        v
        for k, v in stats.items()
        if k.startswith("downloader/exception_type_count/") and not k.endswith("IgnoreRequest")
    )
    assert attempts <= 20  # (10 URLs each: a fraction of one attempt per URL)


@pytest.mark.skipif(scrapy.version_info < (2, 18), reason="RobotParser.crawl_delay() came in Scrapy 2.18")
def test_robots_crawl_delay_spaces_requests(chaos_server: Any, tmp_path: Path) -> None:
    server = chaos_server(crawl_delay_site(pages=5, crawl_delay=2.0))
    result = _crawl(server, tmp_path, ROBOTSTXT_OBEY=True)
    truth = server.truth()
    (host,) = truth["hosts"]
    times = sorted(r["t"] for r in _served(truth, host))
    assert len(times) == 5 and len(result.items) == 5
    gaps = [b - a for a, b in zip(times, times[1:])]
    # four delays of 2 s between the five: the span holds at least three (the server may log
    # the first arrival late on a busy machine), and no two came within one delay
    assert times[-1] - times[0] >= 3 * 2.0 and min(gaps) > 1.0, gaps
    assert result.stats[f"openclaw/health/crawl_delay/{host}"] == 2.0
    assert "asks for Crawl-delay 2" in result.log


def test_a_healthy_site_is_not_paced(chaos_server: Any, tmp_path: Path) -> None:
    """No fixed ceiling: a fault-free host's pace doubles with its answers (slow start) until it
    cannot bind, whatever the machine's speed; how fast that crawls beside plain Scrapy is the
    ``overhead`` benchmark's figure."""
    server = chaos_server(fault_free_site(n_hosts=1, pages=400, links_per_page="all"))
    result = _crawl(server, tmp_path)
    truth = server.truth()
    (host,) = truth["hosts"]
    assert len(result.items) == 400
    assert result.stats[f"openclaw/health/final_rate/{host}"] == float("inf")  # unpaced at the end
    assert result.stats.get("openclaw/health/domain_failures", 0) == 0
    assert not any(k.startswith("openclaw/health/rate_cuts/") for k in result.stats)  # never slowed


def test_a_site_whose_bucket_holds_two_keeps_the_domains_pace(chaos_server: Any, tmp_path: Path) -> None:
    """40 req/s with a bucket of 2 (nginx ``limit_req`` with a small burst): the burst a
    Retry-After hold saves up is refused as the domain resumes. That costs the domain its
    burst, not its pace. Here the events of a real crawl: every page, few 429s, each cut
    caused by a 429 the site really sent, none by latency (a busy crawler is no slow site);
    the pace itself on an injected clock below, and in the ``smallbucket`` benchmark."""
    server = chaos_server(limit_sweep_site(limits=(40,), seconds=8.0, burst=2))
    result = _crawl(server, tmp_path)
    truth = server.truth(include_requests=True)
    (host,) = truth["hosts"]
    served = _served(truth, host)
    refused = sum(1 for r in served if r["status"] == 429)
    assert len(result.items) == len(server.reachable().ok)
    assert refused <= 0.05 * len(served)
    cuts = {k.rsplit("/", 1)[1]: v for k, v in result.stats.items() if k.startswith("openclaw/health/rate_cuts/")}
    assert set(cuts) <= {"429"} and cuts.get("429", 0) <= refused, (cuts, refused)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_bucket_of_two_costs_the_burst_not_the_pace_on_an_injected_clock(seed: int) -> None:
    """The same site simulated: once the limit is found the domain is sent at 0.9-1.0 x 40 req/s,
    with a handful of 429s in 20 s (read as a limit, the refused bursts cut it to ~0.3 x 40)."""
    from scrapy_openclaw.metrics.collector import effective_rate
    from tests.test_moving_limits import Limiter, answered_between, crawl

    reg, run = crawl(Limiter([(0.0, 40.0, 2)], retry_after=1.0), 20.0, seed=seed)
    answers, _ = answered_between(run, 8.0, 16.0)
    assert answers >= 0.9 * 40 * 8, answers
    assert sum(1 for _, ok in run.sent if not ok) <= 4
    assert 0.9 * 40 <= effective_rate(reg.state("a", run.sent[-1][0])) <= 1.02 * 40


def test_the_projects_concurrency_and_download_delay_keep_their_meaning(chaos_server: Any, tmp_path: Path) -> None:
    """CONCURRENT_REQUESTS_PER_DOMAIN = 2 caps the slot (the health controller only scales it
    down), and DOWNLOAD_DELAY bounds the rate the add-on reports."""
    server = chaos_server(fault_free_site(n_hosts=1, pages=30, links_per_page="all"))
    server_slow = server  # (one host, 0 latency: concurrency shows in the server's record below)
    result = _crawl(
        server_slow, tmp_path, CONCURRENT_REQUESTS_PER_DOMAIN=2, DOWNLOAD_DELAY=0.2, RANDOMIZE_DOWNLOAD_DELAY=False
    )
    truth = server.truth()
    (host,) = truth["hosts"]
    times = sorted(r["t"] for r in _served(truth, host))
    assert len(result.items) == 30
    # DOWNLOAD_DELAY still paces the slot: 29 delays between the 30, of which the span holds at
    # least 28 (the server may log the first arrival late on a busy machine); two at a time
    # (the slot's concurrency unpaced) would span half that
    assert times[-1] - times[0] >= 28 * 0.2, times
    assert result.stats[f"openclaw/health/final_rate/{host}"] <= 5.0  # reported: at most 1 / DOWNLOAD_DELAY


def test_slot_concurrency_is_the_slots_own_scaled_by_health() -> None:
    """CONCURRENT_REQUESTS_PER_DOMAIN (or a DOWNLOAD_SLOTS entry) is the slot's cap; health only
    scales it down. (A crawl cannot show it on Scrapy 2.19: its downloader starts every request
    queued in a slot at once, before any counts as transferring, whatever the slot's concurrency.)"""
    from scrapy import Spider
    from scrapy.core.downloader import Slot
    from scrapy.utils.misc import build_from_crawler
    from scrapy.utils.test import get_crawler

    from scrapy_openclaw.errors import Classification, ErrorClass
    from scrapy_openclaw.health import DomainHealthMiddleware

    class Named(Spider):
        name = "slots"

    crawler = get_crawler(
        Named, {"CONCURRENT_REQUESTS_PER_DOMAIN": 2, "DOWNLOAD_SLOTS": {"b.test": {"concurrency": 5}}}
    )
    crawler.spider = crawler._create_spider()
    crawler.engine = crawler._create_engine()  # (the slots' own concurrency comes from its downloader)
    middleware = build_from_crawler(DomainHealthMiddleware, crawler)

    def slot(concurrency: int) -> Slot:  # (Scrapy < 2.16 requires randomize_delay; later ones deprecate it)
        legacy = (
            "randomize_delay" in inspect.signature(Slot).parameters
            and "jitter" not in inspect.signature(Slot).parameters
        )
        return Slot(concurrency, 0.0, False) if legacy else Slot(concurrency, 0.0)

    own, listed = slot(2), slot(5)  # a DOWNLOAD_SLOTS entry of concurrency 5
    middleware._apply("a.test", own)
    middleware._apply("b.test", listed)
    assert (own.concurrency, listed.concurrency) == (2, 5)  # not the old fixed 8
    # (refused connections: a 429 is a rate signal and keeps health at or above 50)
    refused = Classification(ErrorClass.NETWORK, "connection_refused")
    now = time.time()
    for i in range(6):  # six domain failures (a success between them: the circuit stays closed)
        middleware.registry.record_failure("b.test", refused, now=now - 20 + 2 * i)
        middleware.registry.record_success("b.test", 0.01, now=now - 19 + 2 * i)
    assert middleware.registry.state("b.test").health == pytest.approx(46, abs=0.5)
    middleware._apply("b.test", listed)
    assert listed.concurrency == 2  # 5 x 46%
    crawler.engine.downloader.close()
