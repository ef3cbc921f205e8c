"""DeadlinePriorityQueue's O(log domains) pick: the same choices as a scan, parked domains, scale."""

from __future__ import annotations

import random
from typing import Any

import pytest
from scrapy import Request
from scrapy.core.downloader import Slot
from scrapy.utils.test import get_crawler

from scrapy_openclaw import meta as M
from scrapy_openclaw.health import HealthRegistry
from tests.test_pqueues import FAST_HEALTH, HEALTH, QueueSpider, make_queue, urls


def _engine_crawler(settings: dict[str, Any] | None = None) -> Any:
    crawler = get_crawler(QueueSpider, {"CONCURRENT_REQUESTS_PER_DOMAIN": 2, **(settings or {})})
    crawler.spider = crawler._create_spider()
    crawler.engine = crawler._create_engine()
    return crawler


def _scan_choice(q: Any, now: float) -> Request | None:
    """What the former O(domains) scan picks: max (score, -busy, -rank) over domains whose slot has room."""
    q.delays.release_due(now)
    q._expire(now)
    slots = q.downloads.downloader().slots
    scored = []
    for name, dq in q.store.queues.items():
        slot = slots.get(name)
        busy = len(slot.active) if slot is not None else 0
        if slot is not None and busy >= slot.concurrency:
            continue
        best = dq.best(now)
        scored.append((best[0], -busy, -dq.rank, best[1], dq))
    if not scored:
        return None
    first = max(scored, key=lambda s: s[:3])
    return first[4].take(first[3], remove=False)


@pytest.mark.parametrize("seed", range(4))
def test_the_heap_picks_what_a_scan_over_every_domain_picks(seed: int) -> None:
    """Random pushes (priorities, deadlines, start requests, two aging slopes), pops, busy and full
    slots, time passing (aging, expired boosts): every pop is the scan's choice."""
    rng = random.Random(seed)
    crawler = _engine_crawler(
        {
            "OPENCLAW_POLICY": {
                "defaults": {"deadline": {"aging_window": 20.0, "expired": "boost"}},
                "domains": {"*.s.example": {"deadline": {"aging_window": 5.0}}},
            }
        }
    )
    downloader = crawler.engine.downloader
    q = make_queue(crawler=crawler)
    clock = q._clock
    hosts = [f"h{i}.s.example" if i % 3 == 0 else f"h{i}.example" for i in range(25)]
    active: dict[str, list[Request]] = {}
    n = 0
    for _ in range(1500):
        op = rng.random()
        if op < 0.5:
            host = rng.choice(hosts)
            meta: dict[str, Any] = {}
            if rng.random() < 0.4:
                meta[M.DEADLINE] = clock.now + rng.uniform(-2.0, 40.0)
            if rng.random() < 0.1:
                meta["is_start_request"] = True
            n += 1
            q.push(Request(f"http://{host}/{n}", priority=rng.randint(-2, 2), meta=meta))
        elif op < 0.8:
            expected = _scan_choice(q, clock.now)
            got = q.pop()
            assert got is expected, (got, expected)
            if got is not None and rng.random() < 0.6:  # it starts downloading
                host = got.url.split("/")[2]
                slot = downloader.slots.setdefault(host, Slot(2, 0, 0))
                slot.active.add(got)
                active.setdefault(host, []).append(got)
        elif op < 0.9:
            busy = [h for h, reqs in active.items() if reqs]
            if busy:  # a download finishes
                host = rng.choice(busy)
                downloader.slots[host].active.discard(active[host].pop())
        else:
            clock.now += rng.uniform(0.0, 4.0)
    while True:  # and the rest, every slot idle
        for slot in downloader.slots.values():
            slot.active.clear()
        expected = _scan_choice(q, clock.now)
        got = q.pop()
        assert got is expected
        if got is None:
            break
    assert len(q) == 0 and q.store.index.size == 0
    downloader.close()


def test_a_held_domain_is_parked_and_indexed_again_when_its_hold_ends() -> None:
    q = make_queue({"DOWNLOADER_MIDDLEWARES": HEALTH, "OPENCLAW_POLICY": FAST_HEALTH})
    registry = HealthRegistry.for_crawler(q.crawler)
    now = q._clock.now
    for i in range(3):
        q.push(Request(f"http://held.example/{i}", priority=10))
        q.push(Request(f"http://ok.example/{i}"))
    registry.hold("held.example", now + 30)
    assert q.pop().url.startswith("http://ok.example/")
    held = q.store.queues["held.example"]
    assert held.parked is not None and held.entries is None  # out of the index, in the waiting heap
    q.push(Request("http://held.example/late", priority=99))  # a push does not wake it
    assert [u.split("/")[2] for u in urls(q)] == ["ok.example"] * 2
    assert q.pop() is None and q.delays.timer_due == pytest.approx(now + 30)
    q._clock.now = now + 30.5
    assert urls(q, 2) == ["http://held.example/late", "http://held.example/2"]
    q.close()


def test_an_operator_release_wakes_a_parked_domain_at_once() -> None:
    """readiness_epoch: a hold cut short (openclaw-ctl release) is seen at the next pop, not when
    the old hold would have ended."""
    q = make_queue({"DOWNLOADER_MIDDLEWARES": HEALTH, "OPENCLAW_POLICY": FAST_HEALTH})
    registry = HealthRegistry.for_crawler(q.crawler)
    now = q._clock.now
    q.push(Request("http://a.example/1"))
    registry.control("a.example", now=now, ctl_hold=now + 3600)
    assert q.pop() is None and q.store.queues["a.example"].parked is not None
    registry.control("a.example", now=now, ctl_hold=0)
    assert q.pop().url == "http://a.example/1"
    q.close()


def test_a_paced_domain_waits_for_its_token_while_others_go() -> None:
    policy = {"defaults": {"health": {"initial_rate": 4, "base_rate": 4, "burst": 1}}}
    q = make_queue({"DOWNLOADER_MIDDLEWARES": HEALTH, "OPENCLAW_POLICY": policy})
    now = q._clock.now
    for i in range(3):
        q.push(Request(f"http://slow.example/{i}", priority=5))
    assert q.pop().url.startswith("http://slow.example/")  # its one token
    for i in range(3):
        q.push(Request(f"http://other{i}.example/"))
    assert sorted(u.split("/")[2] for u in urls(q)) == ["other0.example", "other1.example", "other2.example"]
    assert now < q.delays.timer_due <= now + 0.26
    q._clock.now = now + 0.25
    assert q.pop().url.startswith("http://slow.example/")
    q.close()


def test_a_full_slot_is_parked_until_a_download_leaves_it() -> None:
    crawler = _engine_crawler()
    downloader = crawler.engine.downloader
    q = make_queue(crawler=crawler)
    slot = downloader.slots["busy.example"] = Slot(1, 0, 0)
    slot.active.add(Request("http://busy.example/active"))
    q.push(Request("http://busy.example/1", priority=10))
    q.push(Request("http://idle.example/1"))
    assert q.pop().url == "http://idle.example/1"
    assert "busy.example" in q.readiness.full and q.pop() is None
    slot.active.clear()
    assert q.pop().url == "http://busy.example/1"
    assert not q.readiness.full and len(q) == 0
    downloader.close()


@pytest.mark.crawl  # runs a crawl or a subprocess
def test_many_domains_a_pop_looks_at_a_few_domains_not_all() -> None:
    """20,000 domains x 3 pages, equal priorities: each pop asks about one domain's readiness and
    slot; the heaps never hold much more than the live entries; round-robin over all domains."""
    crawler = _engine_crawler()
    q = make_queue(crawler=crawler)
    n = 20_000
    for page in range(3):
        for i in range(n):
            q.push(Request(f"http://d{i}.example/{page}"))
    calls = {"ready": 0, "busy": 0}
    ready, busy = q.readiness.check, q.downloads.busy

    def counted_ready(*args: Any, **kwargs: Any) -> Any:
        calls["ready"] += 1
        return ready(*args, **kwargs)

    def counted_busy(domain: str) -> int:
        calls["busy"] += 1
        return busy(domain)

    q.readiness.check, q.downloads.busy = counted_ready, counted_busy
    first = [r.url.split("/")[2] for r in (q.pop() for _ in range(n))]
    assert len(set(first)) == n  # every domain once before any twice
    assert calls["ready"] == n and calls["busy"] <= 2 * n
    assert q.store.index.entries_total() <= 2 * q.store.index.size + 64
    assert len(urls(q)) == 2 * n and q.store.index.size == 0
    crawler.engine.downloader.close()
