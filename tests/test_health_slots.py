"""DomainHealthMiddleware and Scrapy's download slots: each new slot is tuned once, and what it keeps
per slot goes when Scrapy drops the slot (a broad crawl meets millions of domains)."""

from __future__ import annotations

import time
from typing import Any

from scrapy import Request, Spider
from scrapy.core.downloader import Slot
from scrapy.utils.test import get_crawler

from scrapy_openclaw.health import DomainHealthMiddleware
from scrapy_openclaw.health.middleware import _MIN_PRUNE
from scrapy_openclaw.scrapy_internals import new_slot_concurrency, slot_paused


class _Spider(Spider):
    name = "slots"


def test_dropped_slots_are_forgotten_and_a_new_slot_is_tuned_again():
    crawler = get_crawler(
        _Spider, {"CONCURRENT_REQUESTS_PER_DOMAIN": 4, "DOWNLOAD_SLOTS": {"slow.example": {"concurrency": 1}}}
    )
    crawler.spider = crawler._create_spider()
    crawler.engine = crawler._create_engine()
    downloader = crawler.engine.downloader
    middleware = DomainHealthMiddleware.from_crawler(crawler)

    def reach(domain: str) -> Slot:
        slot = downloader.slots.get(domain)
        if slot is None:  # as the downloader makes it
            slot = downloader.slots[domain] = Slot(new_slot_concurrency(downloader, domain), 0, 0)
        middleware._request_reached_downloader(Request(f"http://{domain}/"))
        return slot

    kept = reach("slow.example")
    assert kept.concurrency == 1  # its own concurrency (DOWNLOAD_SLOTS), at health 100
    for i in range(5 * _MIN_PRUNE):  # a broad crawl: each domain once, its idle slot dropped later
        reach(f"d{i}.example")
        downloader.slots.pop(f"d{i}.example")
    assert len(middleware._tuned) <= 2 * _MIN_PRUNE + 1
    assert "slow.example" in middleware._tuned  # a live slot stays known

    kept.concurrency = 7  # (a tuned slot is not re-tuned on every request)
    assert reach("slow.example").concurrency == 7
    downloader.slots.pop("slow.example")  # dropped by Scrapy, made again later
    again = reach("slow.example")
    assert again is not kept and again.concurrency == 1
    downloader.close()


def test_a_slot_paused_for_a_hold_that_ended_early_resumes_at_its_next_request():
    """An operator's release resumes the slot where it is applied; should the slot be paused again
    by a late view of the hold (in distributed mode a Redis reply sent before the release), the
    next request that reaches the slot resumes it, instead of it waiting out the old hold."""
    crawler, middleware, slot = _held_slot()
    downloader = crawler.engine.downloader
    middleware._request_reached_downloader(Request("http://a.test/1"))
    assert slot_paused(slot)  # still held: a request does not resume it
    middleware.registry.control("a.test", ctl_hold=0)
    middleware._request_reached_downloader(Request("http://a.test/2"))
    assert not slot_paused(slot)
    downloader.close()


def test_a_stopping_crawl_pauses_no_slot_for_a_hold():
    """Once the crawl is stopping (Crawler.stop: ``crawling`` False), a request already in a held
    domain's slot goes: it has left the scheduler, and waiting out the hold (up to 600 s) kept
    a Ctrl-C waiting for it."""
    crawler, middleware, slot = _held_slot()
    crawler.crawling = False  # (the stop)
    middleware._request_reached_downloader(Request("http://a.test/1"))
    assert not slot_paused(slot)
    crawler.engine.downloader.close()


def _held_slot() -> tuple[Any, DomainHealthMiddleware, Slot]:
    """A running crawl's health middleware and the download slot of a.test, paused for a 600-s hold."""
    crawler = get_crawler(_Spider, {"CONCURRENT_REQUESTS_PER_DOMAIN": 4})
    crawler.spider = crawler._create_spider()
    crawler.engine = crawler._create_engine()
    crawler.crawling = True  # (as Crawler.crawl sets it: a hold pauses slots only while the crawl runs)
    downloader = crawler.engine.downloader
    middleware = DomainHealthMiddleware.from_crawler(crawler)
    slot = downloader.slots["a.test"] = Slot(new_slot_concurrency(downloader, "a.test"), 0, 0)
    middleware.registry.control("a.test", ctl_hold=time.time() + 600)
    middleware._apply("a.test", slot)
    assert slot_paused(slot)
    return crawler, middleware, slot
