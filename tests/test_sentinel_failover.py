"""A Redis master that dies mid-crawl under Sentinel: the workers go on with the promoted replica.

A real master, a replica and one sentinel on loopback (quorum 1, a one-second
down-after); three workers (a plain ``scrapy.Spider`` among them) crawl the
chaos site, each with its own checkpoint and durable feed; the master is
killed -9 mid-crawl, with the replica in sync or a second behind (the
master's last writes lost). The crawl must finish on the promoted replica with
every reachable page scraped or accounted for, and no item twice in the feeds.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from scrapy_openclaw.testing.servers import RedisServer, find_redis_server, free_port, stop_process, subprocess_env

_spec = importlib.util.spec_from_file_location(
    "openclaw_bench_distributed_failover", Path(__file__).resolve().parents[1] / "benchmarks" / "distributed.py"
)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

ROOT = Path(__file__).resolve().parents[1]
MASTER_NAME = "mymaster"
SPIDERS = (
    "scrapy_openclaw.testing.spiders.ChaosSpider",  # plain: none of our hooks
    "tests.distributed_spiders.PidChaosSpider",
    "tests.distributed_spiders.PidChaosSpider",
)


class Replica(RedisServer):
    """A redis-server that replicates *master_port* from its start."""

    def __init__(self, master_port: int):
        super().__init__()
        self.extra_args = ("--replicaof", "127.0.0.1", str(master_port))


class Sentinel:
    """One ``redis-server --sentinel`` watching *master_port* (quorum 1, quick failover)."""

    def __init__(self, master_port: int):
        self.port = free_port()
        self._tmp = tempfile.TemporaryDirectory(prefix="openclaw-sentinel-")
        conf = Path(self._tmp.name) / "sentinel.conf"
        conf.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {self._tmp.name}\n"
            f"sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 1\n"
            f"sentinel down-after-milliseconds {MASTER_NAME} 1000\n"
            f"sentinel failover-timeout {MASTER_NAME} 3000\n"
            f"sentinel parallel-syncs {MASTER_NAME} 1\n",
            encoding="utf-8",
        )
        log = open(Path(self._tmp.name) / "sentinel.log", "wb")  # (closed in stop)
        self._log = log
        self.proc = subprocess.Popen([find_redis_server(), str(conf), "--sentinel"], stdout=log, stderr=log)
        deadline = time.monotonic() + 20
        while not self._answers():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                raise RuntimeError("sentinel did not start")
            time.sleep(0.05)

    def _answers(self) -> bool:
        try:
            with redis.Redis(port=self.port, socket_timeout=1) as conn:
                return bool(conn.ping())
        except redis.RedisError:
            return False

    def master_port(self) -> int:
        with redis.Redis(port=self.port, socket_timeout=2) as conn:
            return int(conn.sentinel_get_master_addr_by_name(MASTER_NAME)[1])

    def knows_replica(self) -> bool:
        with redis.Redis(port=self.port, socket_timeout=2) as conn:
            return bool(conn.sentinel_slaves(MASTER_NAME))

    def stop(self) -> None:
        stop_process(self.proc)
        self._log.close()
        self._tmp.cleanup()


@pytest.fixture
def sentinel_pair() -> Iterator[tuple[RedisServer, RedisServer, Sentinel]]:
    master = RedisServer().start()
    assert master.port is not None
    replica = sentinel = None
    try:
        replica = Replica(master.port).start()
        wait_until(lambda: _linked(replica), 20, "the replica never synced with the master")
        sentinel = Sentinel(master.port)
        wait_until(lambda: sentinel.knows_replica(), 30, "the sentinel never found the replica")
        yield master, replica, sentinel
    finally:
        if sentinel is not None:
            sentinel.stop()
        if replica is not None:
            replica.close()
        master.close()


def _linked(replica: RedisServer) -> bool:
    with redis.Redis.from_url(replica.url, socket_timeout=2) as conn:
        return conn.info("replication").get("master_link_status") == "up"


def wait_until(check: Any, timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, message
        time.sleep(0.05)


def _start_worker(i: int, settings: dict[str, Any], out: Path, start_urls: list[str]) -> subprocess.Popen[bytes]:
    """One worker with its own checkpoint directory and dead-letter file under *out*."""
    out.mkdir(parents=True, exist_ok=True)
    own = dict(settings, OPENCLAW_CHECKPOINT_DIR=str(out / "ckpt"), OPENCLAW_DLQ_URI=str(out / "dlq.jsonl"))
    cfg = out / "settings.json"
    cfg.write_text(json.dumps(own), encoding="utf-8")
    args = [sys.executable, "-m", "scrapy_openclaw.testing.runcrawl", "--spider", SPIDERS[i]]
    args += ["--settings-json", str(cfg), "--out", str(out)]
    if start_urls:
        args += ["-a", "start_urls=" + ",".join(start_urls)]
    return subprocess.Popen(args, cwd=ROOT, env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _feed_urls(outs: list[Path]) -> Counter[str]:
    urls: Counter[str] = Counter()
    for out in outs:
        path = out / "items.jsonl"
        if path.exists():
            data = path.read_bytes()
            assert not data or data.endswith(b"\n"), f"torn last line in {path}"
            urls.update(json.loads(line)["url"] for line in data.decode().splitlines())
    return urls


def _dead_letters(outs: list[Path]) -> list[dict[str, Any]]:
    letters = []
    for out in outs:
        path = out / "dlq.jsonl"
        if path.exists():
            letters += [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return letters


@pytest.mark.parametrize("lag", [0.0, 1.0], ids=["replica-in-sync", "replica-1s-behind"])
def test_the_crawl_goes_on_with_the_promoted_replica_when_the_master_is_killed(
    chaos_server: Any, sentinel_pair: Any, tmp_path: Path, lag: float
) -> None:
    """*lag*: the replica is cut off (stopped, its link killed by the master) that long before the
    master dies, so the master's last writes (pushes, leases, acknowledgements) are lost with it."""
    master, replica, sentinel = sentinel_pair
    site = chaos_server(bench._site(60, hosts=3, latency=0.5))
    settings = {
        "ADDONS": {"scrapy_openclaw.Addon": 100},
        "OPENCLAW_DISTRIBUTED": True,
        "OPENCLAW_STORE_KEY": bench.STORE_KEY,
        "REDIS_URL": master.url,  # scrapy-redis's own; ours ask the sentinel
        "OPENCLAW_REDIS_SENTINELS": [f"127.0.0.1:{sentinel.port}"],
        "OPENCLAW_REDIS_SENTINEL_MASTER": MASTER_NAME,
        "CONCURRENT_REQUESTS": 2,
        "LOG_LEVEL": "INFO",
        # the add-on's item pipeline takes its place: items written through the sentinels' master
        "ITEM_PIPELINES": {"scrapy_redis.pipelines.RedisPipeline": 300},
    }
    outs = [tmp_path / f"w{i}" for i in range(3)]
    procs = [_start_worker(0, settings, outs[0], site.start_urls)]
    try:
        conn = redis.Redis.from_url(master.url)
        wait_until(lambda: bool(conn.keys("chaos:*")) or procs[0].poll() is not None, 60, "no crawl in Redis")
        procs += [_start_worker(i, settings, outs[i], []) for i in (1, 2)]
        assert bench.wait_for_workers(master.url, 3, 60) == 3, "not every worker joined the crawl"
        total = len(site.reachable().ok)
        wait_until(lambda: sum(_feed_urls(outs).values()) >= total // 4, 120, "the crawl never got going")
        assert all(p.poll() is None for p in procs), "a worker ended before the master was killed"
        old_port = master.port
        if lag:
            os.kill(replica._proc.pid, signal.SIGSTOP)
            conn.client_kill_filter(_type="replica")
            time.sleep(lag)  # the workers write on; none of it reaches the replica
        os.kill(master._proc.pid, signal.SIGKILL)  # (RedisServer has no kill -9 of its own)
        if lag:
            os.kill(replica._proc.pid, signal.SIGCONT)
        killed_at = time.monotonic()
        wait_until(lambda: sentinel.master_port() != old_port, 30, "the sentinel never promoted the replica")
        promoted_after = time.monotonic() - killed_at
        assert sentinel.master_port() == replica.port
        deadline = time.monotonic() + 150
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        codes = [p.returncode for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    logs = [(out / "crawl.log").read_text(errors="replace") if (out / "crawl.log").exists() else "" for out in outs]
    stats = [json.loads((out / "stats.json").read_text()) if (out / "stats.json").exists() else {} for out in outs]
    assert codes == [0, 0, 0], (codes, [log[-2000:] for log in logs])
    assert [s.get("finish_reason") for s in stats] == ["finished"] * 3
    urls = _feed_urls(outs)
    expected = site.reachable().ok
    dead = {d.get("url") for d in _dead_letters(outs)}
    missing = expected - set(urls) - dead
    assert not missing, f"{len(missing)} pages neither scraped nor dead-lettered: {sorted(missing)[:5]}"
    twice = {u: n for u, n in urls.items() if n > 1}
    assert not twice, f"{len(twice)} items in the feeds more than once: {sorted(twice)[:5]}"
    assert promoted_after < 30
    for log in logs:  # every worker felt the failover as an outage, and rode it out
        assert "Redis unreachable" in log and "Redis is back after" in log
        assert "Redis answers from another server" in log
    for s in stats:  # each found the new server and sent its recent writes again; no lease waited out
        assert s.get("openclaw/distributed/failovers") == 1 and s.get("openclaw/distributed/replayed_writes", 0) > 0
        assert not s.get("openclaw/distributed/lease_expired")
    promoted = f"redis://127.0.0.1:{replica.port}/0"
    assert bench.queue_size(promoted, "inflight") == 0 and bench.queue_size(promoted, "data") == 0
    # the items in Redis: every page once, those the dead master took with it sent again, none twice
    in_redis = bench.scraped_urls(promoted)
    assert set(in_redis) == set(urls), sorted(set(urls) ^ set(in_redis))[:5]
    assert max(in_redis.values()) == 1, in_redis.most_common(3)


def test_a_worker_that_finds_no_master_names_the_sentinels() -> None:
    """Started while the sentinels name a master that is down (a failover not done yet): the
    start-up error names the sentinels and the master, not REDIS_URL, which our components do not use."""
    from scrapy import Spider
    from scrapy.settings import Settings
    from scrapy.utils.test import get_crawler

    from scrapy_openclaw.distributed import configure
    from scrapy_openclaw.distributed.scheduler import OpenClawRedisScheduler, RedisUnavailableError
    from scrapy_openclaw.settings import OpenClawSettings

    sentinel = Sentinel(free_port())  # nothing listens there
    try:
        settings = Settings()
        configure(settings, OpenClawSettings.read(settings))  # (what the add-on does in distributed mode)
        names = ("SCHEDULER_QUEUE_CLASS", "SCHEDULER_SERIALIZER", "DUPEFILTER_CLASS", "SCHEDULER_PERSIST")
        crawler = get_crawler(
            Spider,
            {
                "REDIS_URL": "redis://127.0.0.1:1/0",
                "OPENCLAW_REDIS_SENTINELS": [f"127.0.0.1:{sentinel.port}"],
                "REDIS_PARAMS": {"socket_timeout": 2, "socket_connect_timeout": 2},
                **{name: settings[name] for name in names},
            },
        )
        with pytest.raises(RedisUnavailableError) as info:
            OpenClawRedisScheduler.from_crawler(crawler)
        message = str(info.value)
        assert f"master 'mymaster' of sentinel(s) 127.0.0.1:{sentinel.port} (OPENCLAW_REDIS_SENTINELS)" in message
        assert "REDIS_URL" not in message and "start the worker again" in message
    finally:
        sentinel.stop()
