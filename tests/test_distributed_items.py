"""Items written to Redis once, with their page's acknowledgement (``distributed/items.py``),
against a real redis-server and a 3-master Redis Cluster."""

from __future__ import annotations

import json
from typing import Any

import pytest
from scrapy import Request
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler

from scrapy_openclaw.distributed import configure
from scrapy_openclaw.distributed.batching import REPLAY_WINDOW
from scrapy_openclaw.distributed.items import marks_key
from scrapy_openclaw.distributed.pipelines import RedisItemPipeline
from scrapy_openclaw.distributed.queue import LEASE
from scrapy_openclaw.exceptions import OpenClawConfigError
from scrapy_openclaw.settings import OpenClawSettings
from tests.test_distributed_queue import FakeClock, _Spider, queue_maker

ITEMS = "unit:items"
MARKS = marks_key(ITEMS)


@pytest.fixture
def queues(redis_any: Any) -> Any:
    """Leased queues on one Redis, then on a 3-master Redis Cluster (``test_distributed_queue``'s)."""
    yield from queue_maker(redis_any)


def _settle(*qs: Any, clock: FakeClock | None = None) -> None:
    """Rounds until nothing is owed (a cluster acknowledges a round after the items are in);
    with *clock*, past the time marks are kept for a failover's replay, and rounds again."""
    for _ in range(6):
        for q in qs:
            q._kick()
        if not any(q._pending_ack or q.items.owed() for q in qs):
            break
    else:
        raise AssertionError("writes still owed after 6 rounds")
    if clock is not None:
        clock.advance(REPLAY_WINDOW + 0.1)
        for q in qs:
            q._kick(counts=True)  # (a round: the writes older than the window leave it)
        _settle(*qs)


def _items(q: Any) -> list[dict]:
    return [json.loads(raw) for raw in q.server.lrange(ITEMS, 0, -1)]


def test_a_pages_items_reach_redis_with_its_ack_and_their_mark_is_forgotten_after(queues: Any) -> None:
    clock = FakeClock()
    q = queues(clock=clock)
    q.push(Request("http://a.test/1"))
    q.push(Request("http://a.test/2"))
    first, second = q.pop(), q.pop()
    q.add_item(first.meta[LEASE], ITEMS, json.dumps({"n": 1}))
    q.add_item(first.meta[LEASE], ITEMS, json.dumps({"n": 2}))
    q.add_item(second.meta[LEASE], ITEMS, json.dumps({"n": 3}))
    _settle(q)
    assert _items(q) == []  # the pages are not finished: nothing written
    q.ack(first.meta[LEASE])
    _settle(q)
    assert _items(q) == [{"n": 1}, {"n": 2}]
    assert q.server.hlen(MARKS) == 1  # (kept while a failover's replay may send the items again)
    _settle(q, clock=clock)
    assert q.server.hlen(MARKS) == 0  # (its ack counted: the mark is gone)
    q.release(second.meta[LEASE])  # not finished after all: fetched (and scraped) again
    _settle(q)
    again = q.pop()
    assert again.url == second.url
    q.add_item(again.meta[LEASE], ITEMS, json.dumps({"n": 3}))
    q.ack(again.meta[LEASE])
    _settle(q, clock=clock)
    assert _items(q) == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert q.stats.get_value("openclaw/distributed/items/written") == 3
    assert q.server.hlen(MARKS) == 0 and len(q) == 0


def test_a_page_fetched_again_after_its_worker_died_does_not_write_its_items_twice(queues: Any) -> None:
    """Worker *a* wrote a page's items and died before its acknowledgement; *b* fetches the page
    again when the lease expires, scrapes it again and acknowledges it: the items are those *a*
    wrote, once, and the page's mark goes with *b*'s acknowledgement."""
    clock = FakeClock()
    a, b = queues(clock=clock), queues(clock=clock)
    a.push(Request("http://a.test/1"))
    page = a.pop()
    a.add_item(page.meta[LEASE], ITEMS, json.dumps({"by": "a"}))
    a.items.finish(page.meta[LEASE])  # what a.ack() does first: the items, then the ack...
    a._kick()  # ...here the items reach Redis and the worker dies before its ack follows
    assert _items(a) == [{"by": "a"}] and a.server.hlen(MARKS) == 1
    clock.advance(2.2)  # (the lease is 2 s)
    again = b.pop()
    assert again.url == page.url
    b.add_item(again.meta[LEASE], ITEMS, json.dumps({"by": "b"}))
    b.ack(again.meta[LEASE])
    _settle(b, clock=clock)
    assert _items(b) == [{"by": "a"}]
    assert b.stats.get_value("openclaw/distributed/items/pages_written_before") == 1
    assert b.stats.get_value("openclaw/distributed/items/written") is None
    assert b.server.hlen(MARKS) == 0 and len(b) == 0


def test_a_worker_whose_lease_expired_while_it_was_slow_keeps_the_mark_for_the_new_holder(queues: Any) -> None:
    """*a* was slow, not dead: its lease expired and *b* holds the page when *a*'s items and ack
    arrive. The ack does not count, so *a* leaves the mark; *b*'s items find it (not written
    again) and *b*'s acknowledgement, which counts, removes it."""
    clock = FakeClock()
    a, b = queues(clock=clock), queues(clock=clock)
    a.push(Request("http://a.test/1"))
    page = a.pop()
    clock.advance(2.2)
    again = b.pop()
    a.add_item(page.meta[LEASE], ITEMS, json.dumps({"by": "a"}))
    a.ack(page.meta[LEASE])
    _settle(a)
    assert _items(a) == [{"by": "a"}] and a.server.hlen(MARKS) == 1  # (the ack missed: b holds it)
    b.add_item(again.meta[LEASE], ITEMS, json.dumps({"by": "b"}))
    b.ack(again.meta[LEASE])
    _settle(b, clock=clock)
    assert _items(b) == [{"by": "a"}]
    assert b.server.hlen(MARKS) == 0 and len(b) == 0


def test_a_failovers_replay_of_the_last_seconds_does_not_write_their_items_twice(queues: Any) -> None:
    """After a failover the worker sends the writes of the last ``REPLAY_WINDOW`` seconds before
    the outage again (the new server may have lost them). A page's mark stays until its write
    left that window, so items the new server has are not written again; those it lost are (here:
    the first page's items and mark deleted, as a replica that never got them). The outage itself
    (no round confirmed) does not age the writes: marks timed by the clock went with the first
    round after it, just before the replayed items, and let them in twice."""
    clock = FakeClock()
    q = queues(clock=clock)
    for i in range(2):
        q.push(Request(f"http://a.test/{i}"))
    for n, page in enumerate([q.pop(), q.pop()]):
        q.add_item(page.meta[LEASE], ITEMS, json.dumps({"n": n}))
        q.ack(page.meta[LEASE])
        _settle(q)
        if n == 0:
            q.server.delete(ITEMS, MARKS)  # (the first page's items and mark: lost with the master)
    clock.advance(REPLAY_WINDOW + 2)  # the outage, until the worker sees another server answer
    q._replay()
    _settle(q, clock=clock)
    assert sorted(i["n"] for i in _items(q)) == [0, 1]
    assert q.server.hlen(MARKS) == 0


def test_an_item_of_no_page_held_here_is_written_with_the_next_round(queues: Any) -> None:
    q = queues()
    q.add_item(None, ITEMS, json.dumps({"from": "start"}))
    q.add_item("3/not-held", ITEMS, json.dumps({"from": "elsewhere"}))
    _settle(q)
    assert _items(q) == [{"from": "start"}, {"from": "elsewhere"}]
    assert q.server.hlen(MARKS) == 0
    assert q.stats.get_value("openclaw/distributed/items/without_page") == 2


def test_a_clean_close_writes_the_items_of_pages_still_held_and_a_shutdown_drops_them(queues: Any) -> None:
    q = queues()
    q.push(Request("http://a.test/1"))
    q.push(Request("http://a.test/2"))
    page = q.pop()
    q.add_item(page.meta[LEASE], ITEMS, json.dumps({"n": 1}))
    q.close("finished")
    assert _items(q) == [{"n": 1}]
    other = queues()
    held = other.pop()
    other.add_item(held.meta[LEASE], ITEMS, json.dumps({"n": 2}))
    other.close("shutdown")  # handed back: fetched and scraped again by whoever pops it
    assert _items(other) == [{"n": 1}] and len(other) == 1


@pytest.mark.parametrize(
    ("key", "marks"),
    [
        ("chaos:items", "{chaos:items}:written"),
        ("{crawl}:items", "{crawl}:items:written"),
        ("a{b}c", "a{b}c:written"),
        ("a{b", "{a{b}:written"),  # (no tag: the whole name decides the slot)
    ],
)
def test_the_marks_live_in_the_items_lists_cluster_slot(key: str, marks: str) -> None:
    from redis.cluster import key_slot

    assert marks_key(key) == marks
    assert key_slot(marks.encode()) == key_slot(key.encode())


def test_an_items_list_name_no_key_can_share_a_slot_with_is_refused_at_start() -> None:
    crawler = get_crawler(_Spider, {"REDIS_URL": "redis://127.0.0.1:1", "REDIS_ITEMS_KEY": "%(spider)s{}:items"})
    with pytest.raises(OpenClawConfigError, match=r"REDIS_ITEMS_KEY: the items list 'unit\{\}:items'"):
        RedisItemPipeline.from_crawler(crawler)


def _pipelines(**settings: Any) -> dict:
    base = Settings({"REDIS_URL": "redis://127.0.0.1:1", "OPENCLAW_DISTRIBUTED": True, **settings})
    configure(base, OpenClawSettings.from_settings(base))
    return base.getdict("ITEM_PIPELINES")


def test_distributed_mode_puts_ours_in_the_place_of_scrapy_redis_pipeline_only() -> None:
    from scrapy_redis.pipelines import RedisPipeline

    class Theirs(RedisPipeline):
        pass

    assert _pipelines(ITEM_PIPELINES={"scrapy_redis.pipelines.RedisPipeline": 300, "x.Other": 400}) == {
        RedisItemPipeline: 300,
        "x.Other": 400,
    }
    assert _pipelines(ITEM_PIPELINES={RedisPipeline: 300}) == {RedisItemPipeline: 300}
    keep = {
        "scrapy_redis.pipelines.RedisPipeline": 300,
        "scrapy_openclaw.distributed.pipelines.RedisItemPipeline": None,
    }
    assert _pipelines(ITEM_PIPELINES=keep) == keep  # ours listed with None: theirs is kept
    assert _pipelines(ITEM_PIPELINES={Theirs: 300}) == {Theirs: 300}  # a subclass of theirs is theirs
    assert _pipelines() == {}


def test_outside_a_distributed_crawl_the_pipeline_writes_as_redis_pipeline_does(redis_server: Any) -> None:
    crawler = get_crawler(_Spider, {"REDIS_URL": redis_server.url, "REDIS_ITEMS_KEY": "%(spider)s:out"})
    crawler.spider = _Spider.from_crawler(crawler)
    pipeline = RedisItemPipeline.from_crawler(crawler)
    pipeline._process_item({"n": 1}, crawler.spider)  # (what process_item runs on a thread)
    assert [json.loads(raw) for raw in pipeline.server.lrange("unit:out", 0, -1)] == [{"n": 1}]
