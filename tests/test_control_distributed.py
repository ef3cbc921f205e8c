"""Live control in distributed mode: overrides in the shared health state (Lua = Python), commands
through the Redis stream, and two workers on one Redis obeying a hold issued to one of them."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

import redis
from scrapy import Spider
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler

from scrapy_openclaw.commands.ctl import Command
from scrapy_openclaw.distributed.health import RedisHealthRegistry
from scrapy_openclaw.distributed.shards import ShardKeys
from scrapy_openclaw.errors import Classification, ErrorClass
from scrapy_openclaw.health import HealthRegistry
from scrapy_openclaw.policy import PolicySet
from scrapy_openclaw.testing.chaos import ChaosConfig, HostConfig
from scrapy_openclaw.testing.crawl import read_result, start_crawl
from scrapy_openclaw.testing.presets import address
from scrapy_openclaw.testing.servers import free_port, stop_process
from tests.test_control_crawl import TOKEN, api, wait_for

C503 = Classification(ErrorClass.PROTOCOL_RETRYABLE, "http_503", 503)
SPIDER = "tests.distributed_spiders.WorkerChaosSpider"


class _Spider(Spider):
    name = "ctlparity"


def test_overrides_lua_matches_python(redis_server):
    crawler = get_crawler(
        _Spider,
        {
            "REDIS_URL": redis_server.url,
            "OPENCLAW_POLICY": {
                "defaults": {
                    "health": {
                        "base_rate": 50.0,
                        "initial_rate": 10.0,
                        "give_up_after": 5.0,
                        "circuit_failures": 2,
                        "circuit_jitter": 0.0,
                    }
                }
            },
        },
    )
    local = HealthRegistry(PolicySet.for_crawler(crawler))
    shared = RedisHealthRegistry(crawler)
    t = 1000.0
    events: list[tuple[str, dict[str, Any]]] = [
        ("ok", {}),
        ("ctl", {"ctl_hold": t + 30}),
        ("acquire", {}),
        ("ctl", {"ctl_rate": 2.0, "ctl_concurrency": 3}),
        ("ok", {}),
        ("ok", {}),
        ("ctl", {"ctl_hold": 0}),
        ("acquire", {}),
        ("fail", {}),
        ("fail", {}),
        ("ctl", {"ctl_down": 1}),
        ("ctl", {"ctl_down": 0, "ctl_rate": 0}),
        ("ok", {}),
        ("acquire", {}),
    ]
    for i, (kind, changes) in enumerate(events):
        now = t + i * 0.7
        for reg in (local, shared):
            if kind == "ok":
                reg.record_success("a", 0.05, now=now)
            elif kind == "fail":
                reg.record_failure("a", C503, now=now, retry_after=None)
            elif kind == "acquire":
                reg.try_acquire("a", now)
            else:
                reg.control("a", now, **changes)
        assert local.given_up("a", now) == shared.given_up("a", now), i
        assert local.blocked_until("a", now) == shared.blocked_until("a", now), i
        ours, theirs = local.snapshot()["domains"]["a"], shared.snapshot()["domains"]["a"]
        for name, value in ours.items():
            other = theirs[name]
            if isinstance(value, float) and other is not None:
                assert math.isclose(value, other, rel_tol=1e-9, abs_tol=1e-9), (i, name, value, other)
            else:
                assert value == other, (i, name, value, other)
    assert (
        shared.overrides("a")
        == local.overrides("a")
        == {"hold_until": None, "rate": None, "concurrency": 3, "given_up": False}
    )


def ctl(capsys: Any, *argv: str) -> str:
    command = Command()
    command.settings = Settings()
    parser = argparse.ArgumentParser()
    command.add_options(parser)
    opts, args = parser.parse_known_args(list(argv))
    command.run(args, opts)
    out = capsys.readouterr().out
    assert command.exitcode == 0, out
    return out


def test_a_hold_issued_to_one_worker_holds_both(chaos_server, redis_server, tmp_path, capsys):
    a, b = address(0), address(1)
    site = chaos_server(
        ChaosConfig(
            hosts=(
                HostConfig(address=a, pages=400, links_per_page=3, latency=0.1),
                HostConfig(address=b, pages=400, links_per_page=3, latency=0.4),
            ),
            seed=7,
        )
    )
    port = free_port()
    common = {
        "ADDONS": {"scrapy_openclaw.Addon": 100},
        "OPENCLAW_DISTRIBUTED": True,
        "REDIS_URL": redis_server.url,
        "OPENCLAW_DISTRIBUTED_HEARTBEAT": 0.5,
        "ITEM_PIPELINES": {"scrapy_redis.pipelines.RedisPipeline": 900},
        "CONCURRENT_REQUESTS": 4,
        "OPENCLAW_CONTROL_TOKEN": TOKEN,
        "OPENCLAW_CONTROL_POLL": 0.2,
        "CLOSESPIDER_TIMEOUT": 120,
        "LOG_LEVEL": "INFO",
    }
    workers = [
        start_crawl(
            SPIDER, {**common, "OPENCLAW_METRICS_PORT": port}, {"start_urls": site.start_urls}, out_dir=tmp_path / "w0"
        ),
        start_crawl(SPIDER, common, {}, out_dir=tmp_path / "w1"),
    ]
    client = redis.Redis.from_url(redis_server.url)
    live_key = ShardKeys("chaos:requests", "chaos", 16).workers()[0]

    def count(host: str) -> int:
        return site.truth(include_requests=False)["hosts"][host]["total"]

    def in_flight(host: str) -> int:
        return site.truth(include_requests=False)["hosts"][host]["in_flight"]

    def going_on(host: str, n: int) -> None:
        since = count(host)
        wait_for(lambda: count(host) >= since + n, 60, f"{n} more requests to {host}")

    def logged(proc: Any) -> str:
        path = proc.out_dir / "crawl.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def workers_with_items() -> int:
        return len({json.loads(x)["worker"] for x in client.lrange("chaos:items", 0, -1)})

    try:
        wait_for(lambda: workers_with_items() == 2 and count(a) >= 5, 120, "both workers to crawl")  # (a hang guard)
        assert api(port, "hold", {"domain": a, "for": 600}, token="wrong-token-0123456789")[0] == 401
        status, out = api(port, "hold", {"domain": a, "for": 600})
        assert status == 200, out
        # worker 1 learns it through Redis: from then on the domain gets at most what the two
        # workers had on the wire, while b goes on (events: on a busy machine they take longer)
        wait_for(lambda: "Control command hold" in logged(workers[1]), 60, "worker 1 to apply the hold")
        at_hold = count(a)
        going_on(b, 6)
        held_a = count(a)
        assert held_a - at_hold <= 2 * common["CONCURRENT_REQUESTS"], "the held domain got requests"
        going_on(b, 6)
        assert count(a) == held_a, "a worker sent requests to the held domain"
        listed = ctl(capsys, "domains", "--redis", redis_server.url, "--spider", "chaos")
        assert a in listed and "hold" in listed

        # The CLI through Redis: every worker applies it.
        assert "sent through Redis" in ctl(capsys, "release", a, "--redis", redis_server.url, "--spider", "chaos")
        wait_for(lambda: count(a) > held_a, 30, "the released domain to be crawled again")
        ctl(capsys, "pause", "--redis", redis_server.url, "--spider", "chaos")
        for proc in workers:
            wait_for(lambda proc=proc: "Control command pause" in logged(proc), 60, "each worker to pause")
        wait_for(lambda: not in_flight(a) and not in_flight(b), 30, "the wire to drain")
        paused = count(a) + count(b)

        def liveness() -> dict[bytes, float]:
            return dict(client.zrange(live_key, 0, -1, withscores=True))

        # both workers alive and running their loops while paused: each refreshed its liveness
        # deadline by a second's worth (events, not a sleep), and the site heard nothing meanwhile
        beats = liveness()
        assert len(beats) == 2, beats
        wait_for(lambda: all(liveness().get(w, 0) >= t + 1.0 for w, t in beats.items()), 60, "two liveness beats")
        assert count(a) + count(b) == paused, "a worker sent requests while paused"

        assert api(port, "close", {"reason": "ops_stop"})[0] == 200
        for proc in workers:
            proc.wait(60)
    finally:
        for proc in workers:
            stop_process(proc)
    for i, proc in enumerate(workers):
        result = read_result(proc.out_dir, proc.returncode)
        assert result.returncode == 0, result.log[-3000:]
        assert result.stats["finish_reason"] == "ops_stop", i
        assert result.stats["openclaw/control/hold"] == 1 and result.stats["openclaw/control/pause"] == 1
    w1 = read_result(workers[1].out_dir).log
    assert "Control command hold {'domain': '127.0.0.2'" in w1 and "(via redis)" in w1
