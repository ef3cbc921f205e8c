"""What "pending" means in a distributed crawl, end to end: a plain ``scrapy.Spider`` (``start_urls``,
no keep-alive of its own) keeps its worker open while the crawl has work anywhere in Redis (a retry's
not-before time, a held domain, another worker's lease), closes when the whole crawl is done, and a
killed worker's leases come back without waiting for them to expire."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from scrapy_openclaw.distributed import lua

_spec = importlib.util.spec_from_file_location(
    "openclaw_bench_distributed_pending", Path(__file__).resolve().parents[1] / "benchmarks" / "distributed.py"
)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

PLAIN = "scrapy_openclaw.testing.spiders.ChaosSpider"  # a plain scrapy.Spider with start_urls
CLOSE_LINE = re.compile(r"OpenClaw progress at close: (\d+) done of (\d+) discovered, (\d+) pending")


def _limited_site(hosts: int, pages: int = 40, retry_after: str = "1") -> dict[str, Any]:
    """Hosts that allow 5 req/s and answer 429 with Retry-After beyond that."""
    return bench._site(pages, hosts=hosts, latency=0.01, rate_limit={"rate": 5, "burst": 1, "retry_after": retry_after})


def _served_ok(site: Any) -> set[str]:
    """Pages the site answered with 200, from its own request record."""
    truth = site.truth()
    return {
        h["base_url"].rstrip("/") + r["path"]
        for h in truth["hosts"].values()
        for r in h["requests"]
        if r["status"] == 200
    }


def _statuses(site: Any) -> dict[str, int]:
    total: dict[str, int] = {}
    for host in site.truth(include_requests=False)["hosts"].values():
        for status, n in host["statuses"].items():
            total[status] = total.get(status, 0) + n
    return total


def _check_crawl(site: Any, redis_url: str, workers: Any, codes: list[int | None]) -> None:
    """Every page scraped once per the site's record, every worker closed "finished", Redis empty."""
    expected = site.reachable().ok
    urls = bench.scraped_urls(redis_url)
    assert codes == [0] * len(codes), codes
    assert _statuses(site).get("429", 0) > 0, "the site never answered 429: the test proves nothing"
    assert set(urls) == expected, f"missing {sorted(expected - set(urls))[:5]}"
    assert _served_ok(site) <= set(urls)
    for i in range(len(codes)):
        assert workers.stats(i).get("finish_reason") == "finished"
    assert bench.queue_size(redis_url, "inflight") == 0 and bench.queue_size(redis_url, "data") == 0


def _close_figures(workers: Any, i: int) -> tuple[int, int, int]:
    found = CLOSE_LINE.findall(workers.log(i))
    assert found, "no progress line at close"
    done, discovered, pending = (int(x) for x in found[-1])
    return done, discovered, pending


@pytest.mark.parametrize("hosts", [1, 2])
def test_a_plain_spider_waits_out_retry_after_and_holds(
    chaos_server: Any, redis_server: Any, tmp_path: Path, hosts: int
) -> None:
    """One worker: requests that wait in Redis (a retry's not-before time, a held domain) keep it open."""
    site = chaos_server(_limited_site(hosts))
    workers = bench.Workers(1, bench.ours_defaults(redis_server.url), site.start_urls, tmp_path, spider=PLAIN)
    codes = workers.wait(240)
    _check_crawl(site, redis_server.url, workers, codes)
    expected = len(site.reachable().ok)
    assert _close_figures(workers, 0) == (expected, expected, 0)  # the whole crawl's figures, not 0 of 0


def test_two_plain_workers_share_the_crawl_to_the_end(chaos_server: Any, redis_server: Any, tmp_path: Path) -> None:
    """Another worker's lease and a held domain are pending for both; both close when all is done."""
    site = chaos_server(_limited_site(2))
    workers = bench.Workers(
        2, bench.ours_defaults(redis_server.url), site.start_urls, tmp_path, spider=PLAIN, first_alone=True
    )
    codes = workers.wait(240)
    _check_crawl(site, redis_server.url, workers, codes)
    assert all(workers.stats(i).get("openclaw/distributed/leased", 0) > 0 for i in range(2))
    expected = len(site.reachable().ok)
    assert [_close_figures(workers, i) for i in range(2)] == [(expected, expected, 0)] * 2


def test_a_redis_spider_keeps_its_own_idle_behaviour(chaos_server: Any, redis_server: Any, tmp_path: Path) -> None:
    """scrapy-redis's RedisSpider: its MAX_IDLE_TIME_BEFORE_CLOSE counts only time with no work
    anywhere (a 3 s Retry-After hold is not idle time), and it still closes by it when the crawl is done."""
    site = chaos_server(_limited_site(1, pages=20, retry_after="3"))
    redis.Redis.from_url(redis_server.url).lpush("chaos:start_urls", *site.start_urls)
    settings = dict(bench.ours_defaults(redis_server.url), MAX_IDLE_TIME_BEFORE_CLOSE=1)
    workers = bench.Workers(1, settings, [], tmp_path, spider="tests.distributed_spiders.RedisChaosSpider")
    codes = workers.wait(240)
    _check_crawl(site, redis_server.url, workers, codes)


def _held_by(redis_url: str, pid: int) -> int:
    """Leases the worker with this pid holds in Redis."""
    return len(bench.leased_urls(redis_url, pid))


def test_a_killed_workers_leases_come_back_before_they_expire(
    chaos_server: Any, redis_any: Any, tmp_path: Path
) -> None:
    """3 workers with the default 60 s lease; worker 1 is killed -9 while it holds leases (slow
    pages keep them held): the survivors see it dead, hand its leases back, and lose nothing."""
    redis_url = redis_any.url
    # enough pages that worker 0 alone needs ~40 s: a late start of worker 1 (a busy machine)
    # still finds leases to take
    site = chaos_server(bench._site(150, hosts=2, latency=0.5))
    settings = dict(bench.ours_defaults(redis_url), CONCURRENT_REQUESTS=4)
    workers = bench.Workers(3, settings, site.start_urls, tmp_path, spider=PLAIN, first_alone=True)
    pid = workers.procs[1].pid
    deadline = time.monotonic() + 60
    while _held_by(redis_url, pid) == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    workers.kill(1)
    held = _held_by(redis_url, pid)
    assert held > 0, "worker 1 held no lease when it was killed"
    codes = workers.wait(240)
    assert codes[0] == 0 and codes[2] == 0, codes
    urls = bench.scraped_urls(redis_url)
    assert site.reachable().ok - set(urls) == set(), "pages lost after a worker was killed"
    survivors = [workers.stats(0), workers.stats(2)]
    assert sum(s.get("openclaw/distributed/leases_reclaimed", 0) for s in survivors) == held
    assert not any(s.get("openclaw/distributed/lease_expired") for s in survivors)  # not by expiry
    assert bench.queue_size(redis_url, "inflight") == 0 and bench.queue_size(redis_url, "data") == 0


def _sha(script: str) -> str:
    return hashlib.sha1(script.encode()).hexdigest()


def _calls_of(redis_url: str, pid: int, seconds: float, *, after: str) -> list[str]:
    """The commands process *pid* sends in the *seconds* after the first one that matches the
    pattern *after* (MONITOR; scripts' inner calls left out); bounded by time and count. Its clients are
    told by their ports, read again when a client not seen before speaks (its connection pool
    opens a connection when a thread needs one)."""
    monitor = redis.Redis.from_url(redis_url, socket_timeout=seconds + 60)
    calls: list[str] = []
    mine, others = _ports_of(pid), set()
    stop = time.monotonic() + 60 + seconds  # (if *after* never comes)
    with monitor.monitor() as m:
        for _ in range(100_000):
            cmd = m.next_command()
            now = time.monotonic()
            if now > stop:
                break
            client = f"{cmd['client_address']}:{cmd['client_port']}"
            if cmd.get("client_type") == "lua" or client in others:
                continue
            if client not in mine:
                mine = _ports_of(pid)
                if client not in mine:
                    others.add(client)
                    continue
            if not calls and not re.search(after, cmd["command"]):
                continue
            if not calls:
                stop = now + seconds
            calls.append(cmd["command"])
    monitor.close()
    return calls


def _ports_of(pid: int) -> set[str]:
    """``127.0.0.1:port`` of the TCP connections process *pid* holds (from /proc: which of a
    Redis server's clients are this worker's)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # (closed meanwhile)
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes:
                ports.add(f"127.0.0.1:{int(fields[1].rsplit(':', 1)[1], 16)}")
    return ports


def test_an_idle_worker_looks_at_the_workers_not_at_every_shard(
    chaos_server: Any, redis_server: Any, tmp_path: Path
) -> None:
    """While another worker is busy (its one request hangs), a worker with nothing to do sends
    its liveness, a look at the workers and the wake stream's blocking read, and no count of
    the shards (issue 37: at most 2 calls per second; it was 16 script calls per count). Its
    looks still find a worker killed -9 and hand its lease back."""
    host = bench._site(1, hosts=1)
    host["hosts"][0].update(links_per_page=0, hang_rate=1.0)
    site = chaos_server(host)
    url = redis_server.url
    client = redis.Redis.from_url(url, decode_responses=True)
    settings = bench.ours_defaults(url)
    busy = bench.Workers(1, settings, site.start_urls, tmp_path / "busy", spider=PLAIN)
    try:
        bench.wait_for_workers(url, 1, 90)  # (a worker that finds no crawl at all closes at once)
        idle = bench.Workers(1, settings, [], tmp_path / "idle", spider=PLAIN, first_alone=False)
        try:
            live, busy_set = (f"chaos:requests:{{chaos#0}}:{k}" for k in ("live", "busy"))
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:  # both alive, only the first one busy
                members = client.smembers(busy_set)
                if client.zcard(live) == 2 and len(members) == 1 and f":{busy.procs[0].pid}:" in next(iter(members)):
                    break
                time.sleep(0.1)
            else:
                raise AssertionError(
                    f"the second worker never joined, idle, beside the busy one: live {client.zrange(live, 0, -1)}, "
                    f"busy {client.smembers(busy_set)}, pids {busy.procs[0].pid} {idle.procs[0].pid}"
                )
            # from its first look on (its count at the join, and the round that said it idle, are
            # behind it; on a busy machine that round can come after both show up here): looks, no counts
            window = 6.0
            calls = _calls_of(url, idle.procs[0].pid, window, after=rf"{_sha(lua.WORKERS)} 4 .* look ")
            assert calls and " look " in calls[0], calls
            scripts = [c.split()[1] for c in calls if c.split()[0].upper() == "EVALSHA"]
            assert _sha(lua.COUNTS) not in scripts, calls
            # (a lease sweep, one pipeline of a script per shard every lease / 3 s, left out)
            rest = [c for c in calls if _sha(lua.HEARTBEAT) not in c]
            assert len(rest) <= 2 * window + 1, rest

            asked = sum(len(h["requests"]) for h in site.truth()["hosts"].values())
            busy.kill(0)
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:  # the idle worker takes the dead one's lease
                hosts = site.truth()["hosts"]
                if sum(len(h["requests"]) for h in hosts.values()) > asked:
                    break
                time.sleep(0.1)
            else:
                raise AssertionError("the dead worker's lease never came back to the idle one")
        finally:
            idle.close()
    finally:
        busy.close()
