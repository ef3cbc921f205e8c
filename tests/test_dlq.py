"""Dead-letter stores: the jsonl file and the Redis stream (real redis-server)."""

from __future__ import annotations

import json
import logging
import os

import pytest
import redis
from redis.backoff import NoBackoff
from scrapy import Request, Spider

from scrapy_openclaw import deadletter
from scrapy_openclaw import meta as M
from scrapy_openclaw.deadletter import DeadLetter
from scrapy_openclaw.dlq import Filters, JsonlStore, RedisStore, default_uri, open_store
from scrapy_openclaw.dlq.replay import replay_request
from scrapy_openclaw.errors import Classification, ErrorClass, ItemValidationError
from scrapy_openclaw.serialization import SerializationError


class ReplaySpider(Spider):
    name = "replayer"

    def parse_page(self, response):  # pragma: no cover - only referenced by name
        pass


def letter(n: int, *, cls: str = "protocol_permanent", domain: str = "a.test", spider: str = "s", **kw) -> DeadLetter:
    return DeadLetter(
        url=f"http://{domain}/page/{n}",
        domain=domain,
        error_class=cls,
        reason="http_404",
        spider=spider,
        crawl_id="c1",
        status=404,
        **kw,
    )


# --------------------------------------------------------------------------- jsonl


def test_jsonl_roundtrip_filters_and_stats(tmp_path):
    store = JsonlStore(tmp_path / "dl.jsonl")
    records = [letter(1), letter(2, cls="network", domain="b.test"), letter(3, created_at=1000.0)]
    for r in records:
        store.append(r)
    # flushed per record: a second reader sees everything at once
    other = JsonlStore(tmp_path / "dl.jsonl")
    assert [r.to_dict() for r in other.iter()] == [r.to_dict() for r in records]
    assert other.get(records[1].id).url == "http://b.test/page/2"
    assert other.get("nope") is None
    assert [r.id for r in other.iter(Filters(domain="b.test"))] == [records[1].id]
    assert [r.id for r in other.iter(Filters(error_class="protocol_permanent"))] == [records[0].id, records[2].id]
    assert [r.id for r in other.iter(Filters(until=2000.0))] == [records[2].id]
    assert [r.id for r in other.iter(Filters(since=2000.0))] == [records[0].id, records[1].id]
    assert list(other.iter(Filters(spider="other"))) == []
    stats = other.stats()
    assert stats["total"] == 3
    assert stats["by_class"] == {"protocol_permanent": 2, "network": 1}
    assert stats["by_domain"] == {"a.test": 2, "b.test": 1}
    store.close()


def test_jsonl_tolerates_a_truncated_last_line(tmp_path, caplog):
    path = tmp_path / "dl.jsonl"
    store = JsonlStore(path)
    kept = [letter(1), letter(2)]
    for r in kept:
        store.append(r)
    store.close()
    torn = json.dumps(letter(3).to_dict())[:57]  # a crawl killed mid-write
    with open(path, "a", encoding="utf-8") as f:
        f.write(torn)

    with caplog.at_level(logging.WARNING, logger="scrapy_openclaw.dlq.stores"):
        assert [r.id for r in JsonlStore(path).iter()] == [r.id for r in kept]
    assert any("torn last line" in m and "line 3" in m for m in caplog.messages), caplog.messages

    # the next writer starts a fresh line instead of gluing onto the torn one
    later = letter(4)
    store = JsonlStore(path)
    store.append(later)
    store.close()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="scrapy_openclaw.dlq.stores"):
        assert [r.id for r in JsonlStore(path).iter()] == [*(r.id for r in kept), later.id]
    assert any("corrupt line" in m and "line 3" in m for m in caplog.messages), caplog.messages


def test_jsonl_skips_a_line_whose_checksum_does_not_match(tmp_path, caplog):
    path = tmp_path / "dl.jsonl"
    store = JsonlStore(path)
    for n in range(3):
        store.append(letter(n))
    store.close()
    lines = path.read_text(encoding="utf-8").splitlines()
    lines[1] = lines[1].replace("/page/1", "/page/9")  # still valid JSON, wrong content
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="scrapy_openclaw.dlq.stores"):
        urls = [r.url for r in JsonlStore(path).iter()]
    assert urls == ["http://a.test/page/0", "http://a.test/page/2"]
    assert any("fails the store key check" in m and "line 2" in m for m in caplog.messages)


def test_jsonl_replayed_marks_are_appended_not_rewritten(tmp_path):
    path = tmp_path / "dl.jsonl"
    store = JsonlStore(path)
    a, b = letter(1), letter(2)
    store.append(a)
    store.append(b)
    before = path.read_bytes()
    assert store.mark_replayed([a.id, "unknown-is-harmless"]) == 2
    assert store.mark_replayed([a.id]) == 0  # already marked
    assert path.read_bytes().startswith(before)  # history untouched
    assert set(store.replayed()) == {a.id, "unknown-is-harmless"}
    assert [r.id for r in store.iter(Filters(include_replayed=False))] == [b.id]
    assert [r.id for r in store.iter()] == [a.id, b.id]
    assert store.stats()["replayed"] == 1
    store.close()


def test_jsonl_purge_is_atomic_and_keeps_a_running_writer(tmp_path):
    path = tmp_path / "dl.jsonl"
    writer = JsonlStore(path)  # e.g. a running crawl, its file handle open
    keep, gone = letter(1, cls="network"), letter(2)
    writer.append(keep)
    writer.append(gone)
    writer.mark_replayed([gone.id, keep.id])

    cli = JsonlStore(path)
    assert cli.purge(Filters(error_class="protocol_permanent")) == 1
    assert not (tmp_path / "dl.jsonl.tmp").exists()
    assert [r.id for r in cli.iter()] == [keep.id]
    assert set(cli.replayed()) == {keep.id}  # the purged record's mark went with it

    late = letter(3)
    writer.append(late)  # the writer notices the new file and appends there
    assert [r.id for r in cli.iter()] == [keep.id, late.id]
    assert cli.purge(Filters(error_class="nothing")) == 0
    assert cli.purge() == 2
    assert list(cli.iter()) == []
    writer.close()


def test_open_store_uris(tmp_path):
    assert isinstance(open_store(f"jsonl://{tmp_path}/x.jsonl"), JsonlStore)
    plain = open_store(str(tmp_path / "%(name)s" / "dl.jsonl"), spider="books")
    assert isinstance(plain, JsonlStore) and plain.path == tmp_path / "books" / "dl.jsonl"
    with pytest.raises(ValueError, match="no spider name"):
        open_store(str(tmp_path / "%(name)s.jsonl"))
    with pytest.raises(ValueError, match="unsupported scheme 'ftp'"):
        open_store("ftp://host/x")
    with pytest.raises(ValueError, match="only %\\(name\\)s"):
        open_store(str(tmp_path / "%(other)s.jsonl"), spider="s")
    assert isinstance(open_store("redis://127.0.0.1:1/0"), RedisStore)


def test_default_uri(tmp_path, monkeypatch):
    assert default_uri("redis://h/0") == "redis://h/0"
    # one store per spider, whether the crawl is checkpointed (or scheduled) or not,
    # in the project's directory whatever the working directory
    (tmp_path / "scrapy.cfg").write_text("[settings]\ndefault = x\n", encoding="utf-8")
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    expected = os.path.join(str(tmp_path), "openclaw-data", "%(name)s", "deadletters.jsonl")
    assert default_uri(None) == expected
    assert default_uri() == expected


# --------------------------------------------------------------------------- records


def test_replay_request_resets_the_failed_attempt():
    spider = ReplaySpider()
    request = Request(
        "http://a.test/page/1",
        callback=spider.parse_page,
        meta={
            M.RETRY_STATE: {"attempts": {"network": 5}},
            M.DEADLINE: 1.0,
            M.NOT_BEFORE: 2.0,
            "retry_times": 5,
            "keep": "me",
        },
    )
    record = deadletter.for_classified(
        request, Classification(ErrorClass.NETWORK, "timeout"), spider=spider, crawl_id="c"
    )
    assert record.attempts == 6
    rebuilt = replay_request(DeadLetter.from_dict(json.loads(json.dumps(record.to_dict()))), spider)
    assert rebuilt.url == request.url and rebuilt.callback == spider.parse_page
    assert rebuilt.dont_filter
    assert rebuilt.meta == {"keep": "me", M.REPLAY_OF: record.id}

    item_letter = deadletter.for_item({"a": 1}, spider=spider, crawl_id="c", exception=ItemValidationError("bad price"))
    assert item_letter.error_class == "business" and item_letter.validation_error == "bad price"
    with pytest.raises(SerializationError, match="holds no request"):
        replay_request(item_letter, spider)


# --------------------------------------------------------------------------- redis


def test_redis_store_roundtrip(redis_server):
    store = open_store(redis_server.url + "?prefix=t:dlq")
    a, b, c = letter(1, spider="s1"), letter(2, spider="s1", cls="network"), letter(3, spider="s2")
    for r in (a, b, c):
        store.append(r)
    store.append(a)  # a retried add never duplicates
    client = redis.Redis.from_url(redis_server.url)
    assert client.xlen("t:dlq:s1") == 2 and client.xlen("t:dlq:s2") == 1

    reader = open_store(redis_server.url + "?prefix=t:dlq")
    assert sorted(r.id for r in reader.iter()) == sorted([a.id, b.id, c.id])
    assert [r.id for r in reader.iter(Filters(spider="s1"))] == [a.id, b.id]
    assert reader.get(c.id).to_dict() == c.to_dict()
    assert reader.get("missing") is None
    assert reader.stats()["by_class"] == {"protocol_permanent": 2, "network": 1}

    assert reader.mark_replayed([a.id, "missing"]) == 1
    assert reader.mark_replayed([a.id]) == 0
    assert set(reader.replayed()) == {a.id}
    assert [r.id for r in reader.iter(Filters(spider="s1", include_replayed=False))] == [b.id]

    assert reader.purge(Filters(spider="s1", error_class="protocol_permanent")) == 1
    assert sorted(r.id for r in reader.iter()) == sorted([b.id, c.id])
    assert reader.replayed() == {}
    store.append(a)  # purged for good: adding it again is a new record
    assert reader.get(a.id) is not None
    client.close()


def test_redis_store_buffers_while_redis_is_down(redis_server, caplog):
    store = open_store(redis_server.url)
    first = letter(0)
    store.append(first)
    client = redis.Redis.from_url(redis_server.url)
    client.config_set("save", "3600 1")  # persist on shutdown, as a production Redis would
    redis_server.stop()
    later = [letter(n) for n in range(1, 6)]
    with caplog.at_level(logging.WARNING, logger="scrapy_openclaw.dlq.stores"):
        for r in later:
            store.append(r)  # never raises, never drops
    # no long blocking retries: one attempt per append (redis-py retries once, without backoff)
    assert store.failures == len(later)
    assert store.redis.get_retry()._retries == 1 and isinstance(store.redis.get_retry()._backoff, NoBackoff)
    assert store.pending() == 5
    assert any("unreachable" in m for m in caplog.messages)

    redis_server.start()
    store.sync()
    assert store.pending() == 0
    assert [r.id for r in open_store(redis_server.url).iter()] == [first.id] + [r.id for r in later]
    client.close()


def test_pipeline_is_switched_off_by_setting():
    from scrapy.exceptions import NotConfigured
    from scrapy.utils.misc import build_from_crawler
    from scrapy.utils.test import get_crawler

    from scrapy_openclaw.dlq import DeadLetterPipeline

    with pytest.raises(NotConfigured):
        build_from_crawler(DeadLetterPipeline, get_crawler(settings_dict={"OPENCLAW_DLQ_ENABLED": False}))
    pipeline = build_from_crawler(
        DeadLetterPipeline, get_crawler(settings_dict={"OPENCLAW_DLQ_URI": "x/%(name)s.jsonl"})
    )
    assert pipeline.uri_template == "x/%(name)s.jsonl"
    # the taxonomy works without the add-on: validation errors are business failures
    assert pipeline.taxonomy.classify_item_error(ItemValidationError("bad")) is not None
