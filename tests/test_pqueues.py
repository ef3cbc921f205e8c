"""DeadlinePriorityQueue as a unit: real Scrapy crawler objects, a controllable clock."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
import pytest_twisted
from scrapy import Request, Spider
from scrapy.core.downloader import Slot
from scrapy.pqueues import ScrapyPriorityQueue
from scrapy.squeues import FifoMemoryQueue, LifoMemoryQueue
from scrapy.utils.test import get_crawler
from twisted.internet import reactor
from twisted.internet.task import deferLater

from scrapy_openclaw import meta as M
from scrapy_openclaw import signals as openclaw_signals
from scrapy_openclaw.health import HealthRegistry
from scrapy_openclaw.pqueues import DeadlinePriorityQueue, queue_state

HEALTH = {"scrapy_openclaw.health.DomainHealthMiddleware": 560}
FAST_HEALTH = {"defaults": {"health": {"initial_rate": 1000, "base_rate": 1000, "burst": 1000}}}


class QueueSpider(Spider):
    name = "queue"

    def parse(self, response: Any) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def make_queue(
    settings: dict[str, Any] | None = None,
    *,
    key: str = "",
    startprios: Any = None,
    queue_cls: type = LifoMemoryQueue,
    start_cls: type | None = FifoMemoryQueue,
    crawler: Any = None,
) -> DeadlinePriorityQueue:
    if crawler is None:
        crawler = get_crawler(QueueSpider, settings or {})
        crawler.spider = crawler._create_spider()
    q = DeadlinePriorityQueue.from_crawler(crawler, queue_cls, key, startprios, start_queue_cls=start_cls)
    q._clock = Clock()
    return q


def deadline_policy(**deadline: Any) -> dict[str, Any]:
    return {"OPENCLAW_POLICY": {"defaults": {"deadline": deadline}}}


def urls(q: DeadlinePriorityQueue, n: int | None = None) -> list[str]:
    out = []
    while n is None or len(out) < n:
        r = q.pop()
        if r is None:
            break
        out.append(r.url)
    return out


@pytest.mark.parametrize(
    ("queue_cls", "start_cls"),
    [
        (LifoMemoryQueue, FifoMemoryQueue),
        (FifoMemoryQueue, FifoMemoryQueue),
        (LifoMemoryQueue, None),
    ],
)
def test_without_deadlines_the_order_is_scrapys(queue_cls, start_cls):
    q = make_queue(queue_cls=queue_cls, start_cls=start_cls)
    crawler = get_crawler(QueueSpider)
    ref = ScrapyPriorityQueue.from_crawler(crawler, queue_cls, "", start_queue_cls=start_cls)
    for i in range(60):
        meta = {"is_start_request": True} if i % 5 == 0 else {}
        for target in (q, ref):
            target.push(Request(f"http://a.example/{i}", priority=(i * 7) % 4 - 1, meta=dict(meta)))
    assert len(q) == len(ref) == 60
    expected = [ref.pop().url for _ in range(60)]
    assert urls(q) == expected
    assert len(q) == 0 and q.pop() is None


def test_aging_lets_an_old_low_priority_request_overtake_newer_high_priority_ones():
    q = make_queue(deadline_policy(aging_window=100.0))  # boost 100 points over 100 s
    clock = q._clock
    start = clock.now
    q.push(Request("http://a.example/old", priority=0, meta={M.DEADLINE: start + 100}))
    popped = []
    for step in range(10):  # every 10 s a newer priority-50 request arrives and one is sent
        clock.now = start + 10 * step
        q.push(Request(f"http://a.example/new{step}", priority=50))
        popped.append(q.pop().url)
    # line(t) = 0 + 100 * (t - 0) / 100 passes 50 at t = 50: the old request goes then
    assert popped.index("http://a.example/old") in (5, 6)
    assert all(u.startswith("http://a.example/new") for u in popped[:5])
    assert q.queue_state()["expired"] == 0  # sent before its deadline


def test_deadline_without_aging_pressure_keeps_priority_order():
    q = make_queue(deadline_policy(aging_window=10.0))
    now = q._clock.now
    q.push(Request("http://a.example/low", priority=0, meta={M.DEADLINE: now + 1000}))
    q.push(Request("http://a.example/high", priority=5))
    assert urls(q) == ["http://a.example/high", "http://a.example/low"]


def test_default_deadline_comes_from_the_policy_and_request_class():
    q = make_queue(deadline_policy(default=60.0, classes={"urgent": 5.0}))
    now = q._clock.now
    plain = Request("http://a.example/1")
    urgent = Request("http://a.example/2", meta={M.REQUEST_CLASS: "urgent"})
    own = Request("http://a.example/3", meta={M.DEADLINE: now + 1})
    for r in (plain, urgent, own):
        q.push(r)
    assert plain.meta[M.DEADLINE] == pytest.approx(now + 60, abs=1.0)
    assert urgent.meta[M.DEADLINE] == pytest.approx(now + 5, abs=1.0)
    assert own.meta[M.DEADLINE] == now + 1
    assert q.crawler.stats.get_value("openclaw/queue/deadline/defaulted") == 2


def test_expired_boost_sends_the_request_before_higher_priorities():
    q = make_queue(deadline_policy(expired="boost", aging_window=1.0))
    now = q._clock.now
    q.push(Request("http://a.example/late", priority=-10, meta={M.DEADLINE: now + 5}))
    q.push(Request("http://a.example/later", priority=-10, meta={M.DEADLINE: now + 6}))
    for i in range(3):
        q.push(Request(f"http://a.example/vip{i}", priority=1000))
    q._clock.now = now + 7
    assert urls(q, 2) == ["http://a.example/late", "http://a.example/later"]
    assert q.queue_state()["expired"] == 2
    assert q.crawler.stats.get_value("openclaw/queue/expired/boosted") == 2
    assert len(q) == 3


def test_expired_drop_dead_letters_each_request_once():
    q = make_queue(deadline_policy(expired="drop"))
    letters = []
    q.crawler.signals.connect(
        lambda dead_letter, spider: letters.append(dead_letter), signal=openclaw_signals.dead_letter, weak=False
    )
    now = q._clock.now
    q.push(Request("http://a.example/gone", meta={M.DEADLINE: now + 1}))
    q.push(Request("http://a.example/kept"))
    q._clock.now = now + 2
    assert q.peek().url == "http://a.example/kept"
    assert urls(q) == ["http://a.example/kept"]
    assert q.pop() is None and len(q) == 0
    assert [(dl.url, dl.error_class, dl.reason) for dl in letters] == [
        ("http://a.example/gone", "deadline", "deadline_expired")
    ]
    assert letters[0].request is not None  # replayable
    assert q.crawler.stats.get_value("openclaw/queue/expired/dropped") == 1


def test_delayed_request_waits_counts_in_len_and_arms_the_timer():
    q = make_queue()
    now = q._clock.now
    q.push(Request("http://a.example/later", priority=100, meta={M.NOT_BEFORE: now + 30}))
    q.push(Request("http://a.example/now"))
    assert len(q) == 2 and q.queue_state()["delayed"] == 1
    assert q.delays.timer_due == now + 30
    assert urls(q) == ["http://a.example/now"]
    assert len(q) == 1  # the spider must not close while the retry waits
    q._clock.now = now + 29.9
    assert q.pop() is None
    q._clock.now = now + 30
    assert urls(q) == ["http://a.example/later"]
    q.close()
    assert q.delays.timer_due == math.inf  # the timer is cancelled


@pytest_twisted.ensureDeferred
async def test_the_timer_releases_a_delayed_request_on_time():
    q = make_queue()
    q._clock = time.time
    due = time.time() + 0.3
    q.push(Request("http://a.example/x", meta={M.NOT_BEFORE: due}))
    assert q.pop() is None
    released_at = None
    for _ in range(300):  # bounded: at most ~3 s
        await deferLater(reactor, 0.01)
        if q.queue_state()["ready"]:
            released_at = time.time()
            break
    assert released_at is not None and due <= released_at < due + 0.5
    assert q.crawler.stats.get_value("openclaw/queue/wakeups") == 1
    assert q.pop().url == "http://a.example/x"
    q.close()


def test_a_held_domain_is_skipped_while_others_are_served():
    q = make_queue({"DOWNLOADER_MIDDLEWARES": HEALTH, "OPENCLAW_POLICY": FAST_HEALTH})
    registry = HealthRegistry.for_crawler(q.crawler)
    assert q.registry is registry
    now = q._clock.now
    registry.hold("held.example", now + 60)
    for i in range(3):
        q.push(Request(f"http://held.example/{i}", priority=100))
        q.push(Request(f"http://ok.example/{i}", priority=0))
    assert [u.split("/")[2] for u in urls(q)] == ["ok.example"] * 3
    assert len(q) == 3 and q.pop() is None  # nothing is handed out for the held domain
    assert q.delays.timer_due == pytest.approx(now + 60, abs=1.0)  # woken when the hold ends
    q._clock.now = now + 61
    assert [u.split("/")[2] for u in urls(q)] == ["held.example"] * 3
    q.close()


def test_a_domain_without_tokens_waits_and_pop_takes_tokens():
    policy = {"defaults": {"health": {"initial_rate": 8, "base_rate": 8, "burst": 2}}}
    q = make_queue({"DOWNLOADER_MIDDLEWARES": HEALTH, "OPENCLAW_POLICY": policy})
    now = q._clock.now
    for i in range(4):
        q.push(Request(f"http://a.example/{i}"))
    assert len(urls(q)) == 2  # the burst (two tokens: a quarter second's worth at 8 req/s)
    assert q.pop() is None and now < q.delays.timer_due <= now + 0.126
    q._clock.now = now + 0.125
    assert len(urls(q)) == 1
    q.close()


def test_a_domain_with_full_download_slot_is_skipped():
    crawler = get_crawler(QueueSpider, {"CONCURRENT_REQUESTS_PER_DOMAIN": 2})
    crawler.spider = crawler._create_spider()
    crawler.engine = crawler._create_engine()
    downloader = crawler.engine.downloader
    q = make_queue(crawler=crawler)
    for i in range(3):
        q.push(Request(f"http://busy.example/{i}", priority=10))
        q.push(Request(f"http://idle.example/{i}"))
    slot = downloader.slots["busy.example"] = Slot(2, 0, 0)
    slot.active.update({Request("http://busy.example/a"), Request("http://busy.example/b")})
    assert {u.split("/")[2] for u in urls(q)} == {"idle.example"}
    assert len(q) == 3
    slot.active.pop()
    assert q.pop().url.startswith("http://busy.example/")
    downloader.close()


def test_equal_priorities_are_served_round_robin():
    q = make_queue()
    for host in "abc":
        for i in range(3):
            q.push(Request(f"http://{host}.example/{i}"))
    hosts = [u.split("/")[2][0] for u in urls(q)]
    assert hosts[:3] != hosts[0] * 3 and sorted(hosts[:3]) == ["a", "b", "c"]
    assert sorted(hosts[3:6]) == ["a", "b", "c"]


def test_memory_and_disk_queues_count_each_others_handed_out_requests():
    """With JOBDIR Scrapy's scheduler keeps two of our queues (memory for what cannot be stored,
    disk for the rest) in front of one download slot: a domain's concurrency counts what both
    handed out that is still in the downloader middlewares."""
    crawler = get_crawler(QueueSpider, {"CONCURRENT_REQUESTS_PER_DOMAIN": 2})
    crawler.spider = crawler._create_spider()
    crawler.engine = crawler._create_engine()
    downloader = crawler.engine.downloader
    memory, disk = make_queue(crawler=crawler), make_queue(crawler=crawler)
    for i in range(3):
        memory.push(Request(f"http://a.example/memory/{i}"))
        disk.push(Request(f"http://a.example/disk/{i}"))
    first = memory.pop()
    downloader.active.add(first)  # (what the engine does with a popped request, at once)
    second = disk.pop()
    assert second is not None
    downloader.active.add(second)
    assert memory.pop() is None and disk.pop() is None  # the slot's 2, handed out by the two together
    downloader.active.discard(first)  # its download ended
    third = disk.pop()
    assert third is not None and third.url.startswith("http://a.example/disk/")
    downloader.active.add(third)
    assert memory.pop() is None
    memory.close()
    disk.close()
    downloader.close()


def test_ties_go_to_the_domain_with_fewest_active_downloads_then_round_robin():
    """As Scrapy's DownloaderAwarePriorityQueue: among equal effective priorities the least busy
    slot first; a higher priority or an expired deadline still comes first."""
    crawler = get_crawler(QueueSpider, {"CONCURRENT_REQUESTS_PER_DOMAIN": 8})
    crawler.spider = crawler._create_spider()
    crawler.engine = crawler._create_engine()
    downloader = crawler.engine.downloader
    q = make_queue(deadline_policy(expired="boost"), crawler=crawler)
    for host, busy in (("a", 3), ("b", 1), ("c", 2)):
        slot = downloader.slots[f"{host}.example"] = Slot(8, 0, 0)
        slot.active.update(Request(f"http://{host}.example/active/{i}") for i in range(busy))
        for i in range(3):
            q.push(Request(f"http://{host}.example/{i}"))

    def download() -> str:  # what the engine does with a popped request: its slot gets busier
        request = q.pop()
        downloader.slots[request.url.split("/")[2]].active.add(request)
        return request.url.split("/")[2][0]

    # b (1 active, now 2 as c) -> c (the least recently served; 3) -> b (2; now 3) -> a (3 each:
    # never served yet)
    assert [download() for _ in range(4)] == ["b", "c", "b", "a"]
    # equally busy: round-robin (the least recently served first)
    downloader.slots["a.example"].active.clear()
    downloader.slots["b.example"].active.clear()
    downloader.slots["c.example"].active.clear()
    assert [u.split("/")[2][0] for u in urls(q, 3)] == ["c", "b", "a"]
    assert len(urls(q)) == 2
    # priority, then an expired deadline, beat an idle slot
    downloader.slots["a.example"].active.update({Request("http://a.example/x")})
    q.push(Request("http://a.example/high", priority=1))
    q.push(Request("http://a.example/late", priority=-5, meta={M.DEADLINE: q._clock.now - 1}))
    q.push(Request("http://b.example/idle"))
    assert urls(q, 3) == ["http://a.example/late", "http://a.example/high", "http://b.example/idle"]
    downloader.close()


def test_queue_state_and_stats():
    q = make_queue(deadline_policy(expired="drop"))
    now = q._clock.now
    q.push(Request("http://a.example/1"))
    q.push(Request("http://a.example/2", meta={M.DEADLINE: now + 1}))
    q.push(Request("http://b.example/1", meta={M.NOT_BEFORE: now + 50}))
    assert q.queue_state() == {"ready": 2, "delayed": 1, "expired": 0, "domains": {"a.example": 2}}
    assert queue_state(q.crawler)["ready"] == 2
    q._clock.now = now + 2
    q.pop()
    assert q.queue_state() == {"ready": 0, "delayed": 1, "expired": 1, "domains": {}}
    stats = q.crawler.stats.get_stats()
    assert stats["openclaw/queue/pushed"] == 3 and stats["openclaw/queue/delayed"] == 1
    q.close()
    assert queue_state(q.crawler)["ready"] == 0


def test_disk_mode_persists_and_restores_in_order(tmp_path):
    q = make_queue(key=str(tmp_path))
    twin = make_queue(crawler=q.crawler)  # memory queue fed the same requests: the expected order
    now = q._clock.now
    for target in (q, twin):
        for i in range(6):
            target.push(Request(f"http://a.example/{i}", priority=i % 2, callback=q.crawler.spider.parse))
        target.push(Request("http://b.example/d", meta={M.DEADLINE: now + 1000}))
        target.push(Request("http://b.example/wait", meta={M.NOT_BEFORE: now + 1000}))
    with pytest.raises(ValueError, match="is not a method of the spider"):  # the scheduler keeps it in memory
        q.push(Request("http://a.example/lambda", callback=lambda r: None))
    state = q.close()
    assert state["count"] == 8 and (tmp_path / "openclaw-queue.json").exists()
    again = make_queue(key=str(tmp_path), startprios=state, crawler=q.crawler)
    assert len(again) == 8 and again.queue_state()["delayed"] == 1
    restored = [again.pop() for _ in range(7)]
    assert [r.url for r in restored] == urls(twin)
    assert restored[0].callback == q.crawler.spider.parse
    assert next(r for r in restored if r.url.endswith("/d")).meta[M.DEADLINE] == now + 1000
    assert again.pop() is None and len(again) == 1  # still waiting for its not-before time
    again.close()
    twin.close()


def test_disk_mode_says_loudly_when_a_request_can_only_stay_in_memory(tmp_path, caplog):
    """Scrapy's scheduler keeps a request the disk queue refuses (ValueError) in memory: crawled,
    but lost at a pause. Scrapy logs that only with SCHEDULER_DEBUG; we log an ERROR."""
    import datetime

    q = make_queue(key=str(tmp_path))
    q.push(Request("http://a.example/ok", meta={"when": datetime.date(2020, 1, 1), "ids": {1, 2}}))
    with pytest.raises(ValueError):
        q.push(Request("http://a.example/bad", meta={"handle": object()}))
    assert "http://a.example/bad" in caplog.text and "['meta']['handle'] holds a object" in caplog.text
    assert any(r.levelname == "ERROR" for r in caplog.records)
    assert q.crawler.stats.get_value("openclaw/unstorable/jobdir") == 1
    assert len(q) == 1
    q.close()


def test_disk_mode_refuses_state_of_another_queue_and_survives_a_corrupt_file(tmp_path):
    with pytest.raises(
        ValueError,
        match=r"written by scrapy\.pqueues\.DownloaderAwarePriorityQueue, which "
        r"scrapy_openclaw\.pqueues\.DeadlinePriorityQueue cannot resume",
    ):
        make_queue(key=str(tmp_path), startprios={"a.example": [0, -1]})
    with pytest.raises(ValueError, match=r"written by scrapy\.pqueues\.ScrapyPriorityQueue, which"):
        make_queue(key=str(tmp_path), startprios=[0, -1])
    q = make_queue(key=str(tmp_path))
    q.push(Request("http://a.example/1"))
    state = q.close()
    (tmp_path / "openclaw-queue.json").write_text('{"torn')
    again = make_queue(key=str(tmp_path), startprios=state, crawler=q.crawler)
    assert len(again) == 0
    assert q.crawler.stats.get_value("openclaw/queue/restore_failed") == 1
