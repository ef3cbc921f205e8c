"""Issue 17: stored data is untrusted (Redis queue, dead letters), secrets stay out of logs.

Hostile records are refused (never fetched: the chaos site's ground truth says so),
malformed ones are skipped with a counted warning (never a traceback), and a
password in ``REDIS_URL`` appears in no log line and no CLI output.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from scrapy import Request, Spider
from scrapy.spiders import CrawlSpider
from scrapy.utils.test import get_crawler
from test_distributed import bench
from test_distributed_queue import queues  # noqa: F401 - fixture
from test_dlq_crawl import cli, dlq_settings, make_project, require_cli

from scrapy_openclaw import meta as M
from scrapy_openclaw import signals as openclaw_signals
from scrapy_openclaw.deadletter import DeadLetter
from scrapy_openclaw.delay import MAX_WAIT, not_before, request_class
from scrapy_openclaw.dlq import JsonlStore, open_store
from scrapy_openclaw.dlq.records import InvalidRecord, read_record, seal, unseal
from scrapy_openclaw.redact import mask_uri
from scrapy_openclaw.serialization import (
    RefusedRequest,
    SerializationError,
    request_from_data,
    request_to_data,
)

PASSWORD = "s3cr3t-PW-9f1c"
HOSTILE_CALLBACKS = [
    "__init__",
    "__class__",
    "close",
    "closed",
    "start",
    "start_requests",
    "from_crawler",
    "_private",
    "logger",
    "prop",
    "static",
]


class OwnSpider(Spider):
    name = "own"

    def parse_page(self, response: Any) -> None:
        pass

    def _private(self, response: Any) -> None:
        pass

    def closed(self, reason: str) -> None:
        pass

    @property
    def prop(self) -> Any:
        raise AssertionError("a property was evaluated while resolving a callback")

    @staticmethod
    def static(response: Any) -> None:
        pass


def crawler_spider(settings: dict[str, Any] | None = None) -> OwnSpider:
    crawler = get_crawler(OwnSpider, settings or {})
    crawler.spider = crawler._create_spider()
    return crawler.spider


# --------------------------------------------------------------------------- masking


def test_mask_uri_hides_passwords_and_secret_parameters() -> None:
    assert mask_uri(f"redis://:{PASSWORD}@127.0.0.1:6379/0") == "redis://:***@127.0.0.1:6379/0"
    assert mask_uri(f"rediss://user:{PASSWORD}@h:1/2?prefix=x") == "rediss://user:***@h:1/2?prefix=x"
    assert mask_uri(f"redis://:{PASSWORD}@x@h/0") == "redis://:***@h/0"  # an unescaped "@" in it
    assert mask_uri(f"redis://h:6379/0?password={PASSWORD}&db=1") == "redis://h:6379/0?password=***&db=1"
    assert mask_uri("redis://h:6379/0") == "redis://h:6379/0"
    assert mask_uri("/data/dl@x:1.jsonl") == "/data/dl@x:1.jsonl"  # a path has no credentials
    text = f"cannot reach redis://:{PASSWORD}@h:1/0 and unix://:{PASSWORD}@/tmp/r.sock"
    assert PASSWORD not in mask_uri(text)


def test_redis_store_and_bad_uri_messages_are_masked() -> None:
    store = open_store(f"redis://:{PASSWORD}@127.0.0.1:1/0?prefix=x:dlq")
    assert PASSWORD not in store.uri and "***" in store.uri
    with pytest.raises(ValueError) as info:
        open_store(f"ftp://u:{PASSWORD}@h/x")
    assert PASSWORD not in str(info.value)


# --------------------------------------------------------------------------- stored requests


@pytest.mark.parametrize("callback", HOSTILE_CALLBACKS)
def test_stored_callback_must_be_a_public_spider_method(callback: str) -> None:
    spider = crawler_spider()
    with pytest.raises(RefusedRequest) as info:
        request_from_data({"url": "http://a.test/", "callback": callback}, spider)
    assert info.value.kind == "callback"
    with pytest.raises(RefusedRequest):
        request_from_data({"url": "http://a.test/", "errback": callback}, spider)
    assert spider.crawler.stats.get_value("openclaw/stored/refused/callback") == 2


def test_own_methods_and_scrapy_rule_callbacks_still_resolve() -> None:
    spider = crawler_spider()
    assert request_from_data({"url": "http://a.test/", "callback": "parse_page"}, spider).callback == spider.parse_page
    assert request_from_data({"url": "http://a.test/", "callback": "parse"}, spider).callback == spider.parse

    class Rules(CrawlSpider):
        name = "rules"

    rules = Rules()
    request = request_from_data({"url": "http://a.test/", "callback": "_callback", "errback": "_errback"}, rules)
    assert request.callback == rules._callback and request.errback == rules._errback
    with pytest.raises(RefusedRequest):
        request_from_data({"url": "http://a.test/", "callback": "parse_with_rules"}, rules)


@pytest.mark.parametrize("url", ["file:///etc/passwd", " FILE:///etc/passwd", "data:,hello", "ftp://h/x", "s3://b/k"])
def test_stored_scheme_must_be_http(url: str) -> None:
    spider = crawler_spider()
    with pytest.raises(RefusedRequest) as info:
        request_from_data({"url": url}, spider)
    assert info.value.kind == "scheme"
    assert spider.crawler.stats.get_value("openclaw/stored/refused/scheme") == 1


def test_stored_schemes_and_meta_can_be_widened_by_the_operator() -> None:
    spider = crawler_spider(
        {"OPENCLAW_STORED_SCHEMES": ["http", "https", "data"], "OPENCLAW_STORED_META_DENY": ["bindaddress"]}
    )
    assert request_from_data({"url": "data:,hello"}, spider).url == "data:,hello"
    assert request_from_data({"url": "http://a.test/", "meta": {"proxy": "http://p:1"}}, spider).meta["proxy"]


@pytest.mark.parametrize("key", ["proxy", "_auth_proxy", "_scheme_proxy", "bindaddress"])
def test_stored_meta_deny_list(key: str) -> None:
    """An opt-in filter on top of the store key (by default a crawl's own sealed meta is kept whole)."""
    assert request_from_data({"url": "http://a.test/", "meta": {key: "http://p:1"}}, crawler_spider()).meta[key]
    spider = crawler_spider({"OPENCLAW_STORED_META_DENY": [key]})
    with pytest.raises(RefusedRequest) as info:
        request_from_data({"url": "http://a.test/", "meta": {key: "http://127.0.0.1:1"}}, spider)
    assert info.value.kind == "meta" and key in str(info.value)


def test_a_proxy_from_the_environment_is_not_stored() -> None:
    """HttpProxyMiddleware sets meta["proxy"] from http_proxy on every request (and a retry copy
    keeps it); stored, it would be refused. It is left out instead and set again on load."""
    spider = crawler_spider()
    request = Request(
        "http://a.test/",
        headers={"Proxy-Authorization": "Basic eDp5"},
        meta={"proxy": "http://p:3128", "_scheme_proxy": True, "_auth_proxy": "http://p:3128", "k": 1},
    )
    data = request_to_data(request, spider)
    assert data["meta"] == {"k": 1} and "Proxy-Authorization" not in json.dumps(data)
    assert request.meta["proxy"] == "http://p:3128"  # the live request is untouched
    assert request_from_data(data, spider).meta == {"k": 1}


@pytest.mark.parametrize(
    "data",
    [
        "not an object",
        ["url"],
        {"no": "url"},
        {"url": 5},
        {"url": "http://a.test/", "encoding": "no-such-codec"},
        {"url": "http://a.test/", "body": {"__bytes__": 5}},
        {"url": "http://a.test/", "meta": [1]},
        {"url": "http://a.test/", "_class": "os.system"},
    ],
)
def test_malformed_stored_requests_raise_serialization_error_only(data: Any) -> None:
    with pytest.raises(SerializationError):
        request_from_data(data, crawler_spider())


# --------------------------------------------------------------------------- Redis queue entries


def _dead_letters(q: Any) -> list[DeadLetter]:
    letters: list[DeadLetter] = []
    q.crawler.signals.connect(
        lambda dead_letter, **kw: letters.append(dead_letter), openclaw_signals.dead_letter, weak=False
    )
    return letters


def test_hostile_queue_entries_are_refused_at_once(queues: Any, tmp_path: Path) -> None:  # noqa: F811
    """A writer to Redis without the store key: every entry is refused unread (counted, moved aside);
    a sealed entry is the crawl's own (its proxy kept), and still only calls spider methods."""
    from scrapy_openclaw.distributed import serializer

    q = queues()
    letters = _dead_letters(q)
    secret = tmp_path / "secret.html"
    secret.write_text("<h1 id='title'>SECRET</h1>")
    forged = [
        {"url": secret.as_uri(), "callback": "parse"},
        {"url": "http://a.test/proxied", "meta": {"proxy": "http://127.0.0.1:9"}},
        {"url": "http://a.test/p", "priority": 99999999, "headers": {"Authorization": ["Basic eDp5"]}},
    ]
    foreign = [json.dumps(h) for h in forged] + [
        '{"url":"http://a.test/codec","encoding":"no-such-codec"}',
        '{"url":"http://a.test/deep","meta":{"x":' + "[" * 100000 + "]" * 100000 + "}}",
        serializer.dumps({"url": "http://a.test/tampered"}).replace("tampered", "elsewhere"),
        "x" * (serializer.MAX_ENTRY_BYTES + 1),
    ]
    bad_callbacks = [{"url": f"http://a.test/{name}", "callback": name} for name in ("__init__", "close", "_idle")]
    sealed = [serializer.dumps(h) for h in bad_callbacks]
    for i, raw in enumerate(foreign + sealed):
        q.server.zadd(q.key, {raw: -100 - i})
    q.push(Request("http://a.test/good", meta={"proxy": "http://127.0.0.1:3128"}))
    got = q.pop()
    assert got is not None and got.url == "http://a.test/good"
    assert got.meta["proxy"] == "http://127.0.0.1:3128"  # the crawl's own entry, trusted whole
    assert q.pop() is None
    # nothing left leased: refused entries are moved aside at once, not after a lease period
    inflight = q.shards.name("inflight", q.shards.of("a.test"))
    assert q.server.zcard(inflight) == 1 and list(q.held) == [got.meta[M.LEASE]]
    assert q.server.hlen(q.shards.name("rejected", 0)) == len(foreign) + len(sealed)
    assert q.stats.get_value("openclaw/distributed/rejected") == len(foreign) + len(sealed)
    assert q.stats.get_value("openclaw/distributed/refused") == len(foreign) - 1  # (the oversized one: unread)
    assert sorted(d.url for d in letters) == sorted(h["url"] for h in bad_callbacks)
    assert {d.error_class for d in letters} == {"refused"} and all(d.request is None for d in letters)


def test_request_class_not_a_string_and_absurd_not_before(queues: Any, caplog: Any) -> None:  # noqa: F811
    q = queues(OPENCLAW_POLICY={"defaults": {"deadline": {"classes": {"fast": 5}}}})
    with caplog.at_level(logging.WARNING):
        assert q.push(Request("http://a.test/list", meta={M.REQUEST_CLASS: ["fast"]}))
        assert q.push(Request("http://a.test/far", meta={M.NOT_BEFORE: 1e308}))
        assert q.push(Request("http://a.test/nan", meta={M.NOT_BEFORE: math.nan}))
    assert q.stats.get_value("openclaw/queue/request_class/invalid") == 1
    assert q.stats.get_value("openclaw/delay/clamped") == 1
    assert q.stats.get_value("openclaw/delay/invalid") == 1
    assert sum("openclaw_not_before" in m for m in caplog.messages) == 2
    assert {q.pop().url, q.pop().url} == {"http://a.test/list", "http://a.test/nan"}
    due = q.server.zrange(q.shards.name("delayed", q.shards.of("a.test")), 0, -1, withscores=True)
    assert len(due) == 1 and due[0][1] <= time.time() + MAX_WAIT + 1


def test_not_before_and_request_class_helpers() -> None:
    crawler = get_crawler(OwnSpider)
    stats = crawler.stats
    stats.open_spider()
    now = 1_000_000.0
    for value in (math.inf, 1e308, now + MAX_WAIT * 2):
        request = Request("http://a.test/", meta={M.NOT_BEFORE: value})
        assert not_before(request, stats, now=now) == now + MAX_WAIT
        assert not_before(request, stats, now=now) == now + MAX_WAIT  # written back: warned once
    for value in (math.nan, "soon", True, -math.inf):
        assert not_before(Request("http://a.test/", meta={M.NOT_BEFORE: value}), stats, now=now) == 0.0
    assert not_before(Request("http://a.test/", meta={M.NOT_BEFORE: now + 5}), stats, now=now) == now + 5
    assert stats.get_value("openclaw/delay/clamped") == 3 and stats.get_value("openclaw/delay/invalid") == 4
    request = Request("http://a.test/", meta={M.REQUEST_CLASS: {"a": 1}})
    assert request_class(request, stats) is None and M.REQUEST_CLASS not in request.meta
    assert request_class(Request("http://a.test/", meta={M.REQUEST_CLASS: "fast"})) == "fast"


def test_local_queue_survives_a_list_request_class_and_clamps_not_before() -> None:
    from test_pqueues import make_queue

    q = make_queue({"OPENCLAW_POLICY": {"defaults": {"deadline": {"classes": {"fast": 5}}}}})
    q.push(Request("http://a.test/list", meta={M.REQUEST_CLASS: ["fast"]}))
    q.push(Request("http://a.test/far", meta={M.NOT_BEFORE: 1e308}))
    assert q.stats.get_value("openclaw/queue/request_class/invalid") == 1
    assert q.stats.get_value("openclaw/delay/clamped") == 1
    assert q.delayed_requests()[0][0] <= q._clock() + MAX_WAIT


# --------------------------------------------------------------------------- dead-letter records

BAD_RECORDS: dict[str, Any] = {
    "created_at": "yesterday",
    "domain": ["x"],
    "id": 123,
    "version": 99,
    "attempts": "3",
    "status": 4.5,
    "request": "not an object",
    "url": None,
}


def good_letter(n: int = 0, **kw: Any) -> DeadLetter:
    return DeadLetter(
        url=f"http://a.test/{n}",
        domain="a.test",
        error_class="network",
        reason="timeout",
        spider="chaos",
        crawl_id="c",
        **kw,
    )


@pytest.mark.parametrize(("field", "value"), list(BAD_RECORDS.items()))
def test_read_record_names_the_bad_field(field: str, value: Any) -> None:
    data = good_letter().to_dict()
    data[field] = value
    with pytest.raises(InvalidRecord, match=field if field != "version" else "version 99"):
        read_record(unseal(seal(data)))


def test_read_record_wants_a_seal() -> None:
    with pytest.raises(InvalidRecord, match="not sealed"):
        read_record(unseal(json.dumps(good_letter().to_dict())))
    assert read_record(unseal(seal(good_letter().to_dict()))).url == "http://a.test/0"


def write_bad_jsonl(path: Path) -> list[str]:
    """Good records 0 and 1, and one line per kind of bad record; returns the good ids."""
    store = JsonlStore(path)
    good = [good_letter(0), good_letter(1)]
    for record in good:
        store.append(record)
    store.close()
    lines = []
    for field, value in BAD_RECORDS.items():
        data = good_letter(10).to_dict()
        data[field] = value
        lines.append(seal(data))
    lines.append(json.dumps(good_letter(11).to_dict()))  # no checksum
    lines.append(seal({"openclaw_mark": "replayed", "id": good[0].id, "at": "abc"}))
    lines.append(seal({"openclaw_mark": "replayed", "id": 5, "at": 1.0}))
    with open(path, "a", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return [r.id for r in good]


def test_jsonl_store_skips_bad_records_with_a_counted_warning(tmp_path: Path, caplog: Any) -> None:
    path = tmp_path / "dl.jsonl"
    ids = write_bad_jsonl(path)
    store = JsonlStore(path)
    with caplog.at_level(logging.WARNING, logger="scrapy_openclaw.dlq.stores"):
        assert [r.id for r in store.iter()] == ids
        stats = store.stats()
        assert store.replayed() == {}
    assert stats["total"] == 2 and stats["by_domain"] == {"a.test": 2}
    assert len(store.skipped) == len(BAD_RECORDS) + 3
    warnings = [m for m in caplog.messages if "Skipping dead letter" in m]
    assert len(warnings) == len(store.skipped)  # once per record, however often it is read
    assert any("line 3" in m and "created_at" in m for m in warnings)
    assert any("refused: not sealed" in m for m in warnings) and any("version 99" in m for m in warnings)


def test_redis_store_skips_bad_entries(redis_server: Any) -> None:
    store = open_store(redis_server.url + "?prefix=bad:dlq")
    store.append(good_letter(0))
    key = store.stream_key("chaos")
    client = redis.Redis.from_url(redis_server.url)
    for field, value in BAD_RECORDS.items():
        data = good_letter(10).to_dict()
        data[field] = value
        client.xadd(key, {"id": "x", "data": seal(data)})
    client.xadd(key, {"id": "y", "data": json.dumps(good_letter(11).to_dict())})
    client.xadd(key, {"id": "z", "data": b"\xff not json"})
    client.xadd(key, {"nodata": "1"})
    client.hset(key + ":replayed", "abc", "yesterday")
    assert [r.url for r in store.iter()] == ["http://a.test/0"]
    assert store.stats()["total"] == 1
    assert len(store.skipped) == len(BAD_RECORDS) + 4


# --------------------------------------------------------------------------- CLI and replay


def test_cli_survives_bad_records_and_replay_refuses_hostile_ones(chaos_server: Any, tmp_path: Path) -> None:
    require_cli()
    server = chaos_server({"hosts": [{"address": "127.0.0.2", "pages": 6, "links_per_page": 0}]})
    base = server.urls["127.0.0.2"]
    secret = tmp_path / "secret.html"
    secret.write_text("<html><h1 id='title'>SECRET-CONTENT</h1></html>", encoding="utf-8")
    path = tmp_path / "dl.jsonl"
    write_bad_jsonl(path)  # item 6: badly typed records in the same store
    store = JsonlStore(path)

    def letter(url: str, **request: Any) -> DeadLetter:
        return DeadLetter(
            url=url,
            domain="127.0.0.2",
            error_class="network",
            reason="timeout",
            spider="chaos",
            crawl_id="c",
            request={"url": url, **request},
        )

    good = letter(f"{base}page/3", callback="parse")
    # written by someone without the store key: refused unread
    forged = [
        letter(secret.as_uri(), callback="parse"),
        letter(f"{base}refused/proxy", meta={"proxy": base}),
        letter("http://127.0.0.9:9/refused/proxied", meta={"proxy": base}),
    ]
    # sealed, yet still only spider methods are called
    hostile = [letter(f"{base}refused/{name}", callback=name) for name in ("__init__", "close", "start", "_private")]
    malformed = DeadLetter(
        url=f"{base}refused/malformed",
        domain="127.0.0.2",
        error_class="network",
        reason="timeout",
        spider="chaos",
        crawl_id="c",
    )
    for record in [good, *hostile, malformed]:
        store.append(record)
    store.close()
    with open(path, "a", encoding="utf-8") as f:  # item 5: "request" not an object, seal valid
        data = good_letter(12).to_dict()
        data["request"] = "GET /etc/passwd"
        f.write(seal(data) + "\n")
        for record in forged:
            f.write(json.dumps(record.to_dict()) + "\n")
    items = tmp_path / "replay-items.jsonl"
    project = make_project(
        tmp_path / "proj", {**dlq_settings(str(path)), "FEEDS": {str(items): {"format": "jsonlines"}}}
    )

    for args in (
        ["list"],
        ["stats"],
        ["list", "--domain", "a.test"],
        ["show", good.id],
        ["purge", "--domain", "nowhere", "--yes"],
    ):
        out = cli(project, *args)
        assert out.returncode == 0, (args, out.stderr[-3000:])
        assert "Traceback" not in out.stderr, out.stderr[-3000:]
        unreadable = len(BAD_RECORDS) + 4 + len(forged)
        assert f"skipped {unreadable} unreadable dead-letter record(s)" in out.stderr, out.stderr[-2000:]
    assert "created_at" in out.stderr and "version 99" in out.stderr  # each bad record is named
    assert out.stderr.count("refused: not sealed") >= len(forged) + 1

    replay = cli(project, "replay", "chaos")
    assert replay.returncode == 1, replay.stderr[-3000:]
    assert "Traceback" not in replay.stderr, replay.stderr[-3000:]
    assert "replayed 1 dead letter(s) of chaos" in replay.stdout
    assert f"skipped {len(hostile)} that could not be rebuilt or were refused" in replay.stdout
    assert "must be an object" in replay.stderr or "not an object" in replay.stderr
    scraped = [json.loads(line) for line in items.read_text(encoding="utf-8").splitlines()]
    assert [i["url"] for i in scraped] == [f"{base}page/3"]
    assert "SECRET-CONTENT" not in items.read_text(encoding="utf-8")
    fetched = [r["path"] for h in server.truth()["hosts"].values() for r in h["requests"]]
    assert fetched == ["/page/3"], fetched  # nothing through a hostile record, not even via the proxy


# --------------------------------------------------------------------------- passwords


@pytest.fixture
def password_redis(redis_server: Any) -> str:
    """The test Redis with ``requirepass``; returns its URL with the password."""
    redis.Redis.from_url(redis_server.url).config_set("requirepass", PASSWORD)
    return f"redis://:{PASSWORD}@{redis_server.host}:{redis_server.port}/0"


def assert_no_password(where: str, text: str) -> None:
    assert PASSWORD not in text, f"password in {where}: ...{text[max(0, text.index(PASSWORD) - 300) :][:600]}"


def test_password_in_redis_url_reaches_no_log_or_cli_output(
    chaos_server: Any, password_redis: str, tmp_path: Path
) -> None:
    cfg = bench._site(8, hosts=1, latency=0.0)
    cfg["hosts"][0]["not_found"] = [2, 5]
    site = chaos_server(cfg)
    from scrapy_openclaw.distributed import serializer

    hostile = {"url": f"{site.start_urls[0]}refused", "callback": "close"}  # sealed: a dead letter "refused"
    redis.Redis.from_url(password_redis).zadd("chaos:requests", {serializer.dumps(hostile): -100})
    settings = dict(bench.ours(password_redis), LOG_LEVEL="DEBUG")
    workers = bench.Workers(1, settings, site.start_urls, tmp_path / "crawl")
    assert workers.wait(120) == [0]
    log = workers.log(0)
    assert "dead letter(s) written to redis://:***@" in log, log[-3000:]
    assert "Refused a Redis queue entry" in log
    assert_no_password("the crawl log", log)
    for file in (tmp_path / "crawl").rglob("*"):
        if file.is_file() and file.name != "settings.json":
            assert_no_password(str(file), file.read_text(errors="replace"))
    fetched = [r["path"] for h in site.truth()["hosts"].values() for r in h["requests"]]
    assert "/refused" not in fetched

    require_cli()
    project = make_project(tmp_path / "proj", {"OPENCLAW_DLQ_URI": password_redis, "LOG_LEVEL": "DEBUG"})
    letters = list(open_store(password_redis).iter())
    assert {d.error_class for d in letters} >= {"protocol_permanent", "refused"}
    outputs = [
        cli(project, *args)
        for args in (
            ["list"],
            ["stats"],
            ["show", letters[0].id],
            ["show", "f" * 32],
            ["list", "--uri", password_redis + "?prefix=other"],
            ["replay", "chaos", "--class", "refused"],
            ["purge", "--yes"],
        )
    ]
    for out in outputs:
        assert_no_password(f"openclaw-dlq {out.args}", out.stdout + out.stderr)
        assert "Traceback" not in out.stderr, out.stderr[-3000:]
    assert "redis://:***@" in outputs[0].stdout and outputs[-1].returncode == 0
    unreachable = cli(project, "list", "--uri", f"redis://:{PASSWORD}@127.0.0.1:1/0")
    assert_no_password("an unreachable store's error", unreachable.stdout + unreachable.stderr)


def test_password_in_redis_url_not_in_the_scheduler_log(chaos_server: Any, password_redis: str, tmp_path: Path) -> None:
    from test_schedule_run import SchedulerProcess, make_project, site, successes, wait_for, write_tasks

    from scrapy_openclaw.schedule.history import RedisHistory
    from scrapy_openclaw.schedule.locks import redis_client

    server = chaos_server(site(pages=1))
    project = make_project(tmp_path / "sched")
    tasks = write_tasks(
        project / "tasks.yaml",
        f"""
        tasks:
          shared:
            spider: chaos
            interval: 2
            args: {{start_urls: "{server.start_urls[0]}"}}
    """,
    )
    node = SchedulerProcess(project, tasks, f"REDIS_URL={password_redis}")
    try:
        history = RedisHistory(redis_client(password_redis), "openclaw:schedule:history")
        wait_for(lambda: successes(history.runs(), "shared"), 120, "a successful window", lambda: node.log)
    finally:
        assert node.stop() == 0
    assert "Scheduler started" in node.log
    for file in project.rglob("*"):
        if file.is_file():
            assert_no_password(str(file), file.read_text(errors="replace"))
