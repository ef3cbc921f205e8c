"""Redis Cluster and Sentinel specifics: key layout, the CLI on a cluster, a pre-sharding queue refused."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from scrapy import Spider
from scrapy.utils.test import get_crawler

from scrapy_openclaw.distributed import configure, lua
from scrapy_openclaw.distributed.connection import client_for_url, client_from_settings
from scrapy_openclaw.distributed.shards import QUEUE_KEYS, ShardKeys, ShardLayoutError, health_key, shard_of
from scrapy_openclaw.settings import OpenClawSettings
from scrapy_openclaw.testing.servers import find_redis_server, free_port, stop_process


class _Spider(Spider):
    name = "unit"

    def parse(self, response: Any) -> None:
        pass


def _slot(key: str) -> int:
    from redis.crc import key_slot

    return key_slot(key.encode())


def test_a_shard_and_its_domains_health_share_one_slot() -> None:
    layout = ShardKeys("unit:requests", "unit", 16)
    for domain in ("a.test", "b.test", "example.com", ""):
        shard = layout.of(domain)
        slots = {_slot(k) for k in layout.keys(shard, "unit:dupefilter")}
        slots.add(_slot(health_key("unit", domain, 16)))
        assert len(slots) == 1, (domain, slots)
    assert len({_slot(layout.name("q", i)) for i in range(16)}) == 16  # shards spread over slots
    assert len(QUEUE_KEYS) == 16 and shard_of("a.test", 1) == 0
    assert len({_slot(k) for k in layout.workers()}) == 1  # the crawl's workers: one script, one slot
    with pytest.raises(ShardLayoutError, match="hash tag"):
        ShardKeys("{mine}:requests", "unit", 4)


def test_scripts_build_no_key_names() -> None:
    """Every key a queue script touches comes from KEYS (runs on a cluster, under ACL key patterns)."""
    for name in ("PUSH", "POP", "ACK", "HEARTBEAT", "RELEASE", "REJECT", "COUNTS", "RECLAIM", "WORKERS"):
        script = getattr(lua, name)
        assert ":q:" not in script and "K .. '" not in script and "ARGV[1] .. " not in script, name


def test_cli_domains_and_publish_on_a_cluster(redis_cluster: Any) -> None:
    from scrapy_openclaw.commands.ctl import redis_domains
    from scrapy_openclaw.control.channel import publish
    from scrapy_openclaw.distributed.health import RedisHealthRegistry

    crawler = get_crawler(_Spider, {"REDIS_URL": redis_cluster.url})
    registry = RedisHealthRegistry(crawler)
    assert type(registry.server).__name__ == "RedisCluster"
    for domain in ("a.test", "b.test", "c.test"):
        registry.ensure(domain)
    server = client_for_url(redis_cluster.url, socket_timeout=5)
    rows = redis_domains(server, "unit", "unit:requests", 16)["domains"]
    assert [r["domain"] for r in rows] == ["a.test", "b.test", "c.test"]
    assert publish(server, "unit", {"command": "pause"}, "tester")
    owners = {server.keyslot(health_key("unit", d, 16)) for d in ("a.test", "b.test", "c.test")}
    assert len(owners) >= 2  # the domains' state lives in several slots


def _refused_at_start(url: str, error: type[Exception], match: str) -> None:
    """A distributed scheduler of spider ``unit``, as the add-on configures it, refuses to open
    with *error*, before any background I/O started."""
    from scrapy.settings import Settings

    from scrapy_openclaw.distributed.scheduler import OpenClawRedisScheduler

    settings = Settings()
    configure(settings, OpenClawSettings.read(settings))
    names = ("SCHEDULER_QUEUE_CLASS", "SCHEDULER_SERIALIZER", "DUPEFILTER_CLASS", "SCHEDULER_PERSIST")
    crawler = get_crawler(
        _Spider, {"REDIS_URL": url, "OPENCLAW_HEALTH_ENABLED": False, **{name: settings[name] for name in names}}
    )
    scheduler = OpenClawRedisScheduler.from_crawler(crawler)
    spider = _Spider.from_crawler(crawler)
    crawler.spider = spider
    try:
        with pytest.raises(error, match=match):
            scheduler.open(spider)
    finally:
        if scheduler.queue is not None and scheduler.queue._loop.running:
            scheduler.queue._loop.stop()
    assert not scheduler.queue.link.background


def test_a_queue_in_the_old_layout_is_refused_with_a_clear_message(redis_server: Any) -> None:
    from scrapy_openclaw.distributed.scheduler import LegacyQueueError

    redis.Redis.from_url(redis_server.url).hset("unit:requests:data", "x", "{}")
    _refused_at_start(redis_server.url, LegacyQueueError, r"unit:requests:data.*SCHEDULER_FLUSH_ON_START")


def test_sentinel_settings_reach_the_master(redis_server: Any, tmp_path: Path) -> None:
    port = free_port()
    conf = tmp_path / "sentinel.conf"
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\nsentinel monitor mymaster 127.0.0.1 {redis_server.port} 1\n"
    )
    proc = subprocess.Popen(
        [find_redis_server(), str(conf), "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 20
        while not _answers(port):
            assert time.monotonic() < deadline and proc.poll() is None, "sentinel did not start"
            time.sleep(0.05)
        crawler = get_crawler(
            _Spider, {"OPENCLAW_REDIS_SENTINELS": [f"127.0.0.1:{port}"], "REDIS_PARAMS": {"socket_timeout": 5}}
        )
        client = client_from_settings(crawler.settings)
        client.set("via-sentinel", "1")
        assert redis.Redis.from_url(redis_server.url).get("via-sentinel") == b"1"
    finally:
        stop_process(proc)


def _answers(port: int) -> bool:
    try:
        with redis.Redis(port=port, socket_timeout=1) as conn:
            return bool(conn.ping())
    except redis.RedisError:
        return False


def test_redis_dead_letter_store_on_a_cluster(redis_cluster: Any) -> None:
    from test_dlq import letter

    from scrapy_openclaw.dlq import Filters, open_store

    store = open_store(redis_cluster.url)
    assert type(store.redis).__name__ == "RedisCluster" and store.prefix == "{openclaw:dlq}"
    a, b, c = letter(1, spider="s1"), letter(2, spider="s1", cls="network"), letter(3, spider="s2")
    for r in (a, b, c):
        store.append(r)
    store.append(a)  # a retried add never duplicates
    assert store.pending() == 0
    reader = open_store(redis_cluster.url)
    assert sorted(r.id for r in reader.iter()) == sorted([a.id, b.id, c.id])
    assert [r.id for r in reader.iter(Filters(spider="s1"))] == [a.id, b.id]
    assert reader.mark_replayed([a.id]) == 1
    assert reader.purge(Filters(spider="s1", error_class="protocol_permanent")) == 1
    assert sorted(r.id for r in reader.iter()) == sorted([b.id, c.id])


def test_a_crawl_a_newer_version_keeps_in_redis_is_refused_at_start(redis_server: Any) -> None:
    """The crawl's ``format`` key says how its entries and health records are stored: a worker
    refuses a crawl a newer version stores, at start, before any background I/O."""
    from scrapy_openclaw.distributed.queue import FORMAT
    from scrapy_openclaw.exceptions import QueueFormatError

    redis.Redis.from_url(redis_server.url).set("unit:requests:{unit#0}:format", FORMAT + 1)
    _refused_at_start(redis_server.url, QueueFormatError, rf"format {FORMAT + 1}.*newer.*Upgrade this worker")


def test_a_round_of_scripts_reaches_redis_in_one_read(redis_any: Any) -> None:
    """redis-py writes a pipeline in pieces of about 6 KB, and Redis reads a piece that arrives
    on its own as a request of its own; our connections send a round in one write. Ground
    truth: the server's ``total_reads_processed`` (one read per node the round goes to)."""
    from scrapy_openclaw.distributed.connection import run_scripts

    crawler = get_crawler(Spider, {"REDIS_URL": redis_any.url})
    server = client_from_settings(crawler.settings)
    script = server.register_script("return #ARGV")
    keys = [f"{{one}}:k{i}" for i in range(25)]  # (one slot: one node)
    calls = [(script, [k], ["x" * 300, "y" * 50]) for k in keys]  # ~11 KB: two pieces (Redis reads 16 KB at most)
    run_scripts(server, calls[:1])  # (the script loaded, the connection made)
    node = redis.Redis.from_url(redis_any.url)
    if hasattr(server, "get_node_from_key"):
        node = server.get_node_from_key(keys[0]).redis_connection
    before = int(node.info("stats")["total_reads_processed"])
    outcomes = run_scripts(server, calls)
    after = int(node.info("stats")["total_reads_processed"])
    assert [res for _, res in outcomes] == [2] * len(calls)
    assert after - before == 2  # the round, and the INFO that asked
