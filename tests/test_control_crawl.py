"""Live control against a real crawl: every command changes what the chaos site records.

One crawl (two hosts, slow enough to act on) goes through the commands in turn:
refused calls, hold and release, a rate ceiling, pause and resume, give-up and
restore, and a graceful close.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from scrapy_openclaw.testing.chaos import ChaosConfig, HostConfig
from scrapy_openclaw.testing.crawl import read_result, start_crawl
from scrapy_openclaw.testing.presets import address
from scrapy_openclaw.testing.servers import free_port, stop_process

TOKEN = "test-token-0123456789abcdef"


def api(
    port: int, name: str, body: dict[str, Any] | None = None, token: str | None = TOKEN, method: str | None = None
) -> tuple[int, dict[str, Any]]:
    data = None if body is None else json.dumps(body).encode()
    headers = {"X-OpenClaw-Operator": "pytest"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/control/{name}",
        data=data,
        headers=headers,
        method=method or ("GET" if body is None else "POST"),
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def wait_for(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def row(port: int, domain: str) -> dict[str, Any]:
    status, data = api(port, "domains")
    assert status == 200, data
    return next((r for r in data["domains"] if r["domain"] == domain), {})


def cli(*args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OPENCLAW_CONTROL_TOKEN": token} if token is not None else None
    return subprocess.run(
        [sys.executable, "-m", "scrapy", "openclaw-ctl", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd="/",
    )


#: Requests a domain's slot may have on the wire when a command lands (the test's
#: CONCURRENT_REQUESTS_PER_DOMAIN): all that may reach a held or paused domain.
ON_THE_WIRE = 2


def going_on(truth: Truth, host: str, n: int) -> None:
    """Until *host* got *n* more requests: the crawl went on meanwhile (as long as that takes)."""
    since = truth.count(host)
    wait_for(lambda: truth.count(host) >= since + n, 60, f"{n} more requests to {host}")


class Truth:
    def __init__(self, site: Any):
        self.site = site

    def in_flight(self, host: str) -> int:
        return self.site.truth(include_requests=False)["hosts"][host]["in_flight"]

    def requests(self, host: str) -> list[dict[str, Any]]:
        return [r for r in self.site.truth()["hosts"][host]["requests"] if r["path"] != "/robots.txt"]

    def count(self, host: str) -> int:
        return self.site.truth(include_requests=False)["hosts"][host]["total"]


def test_control_commands_change_what_the_site_sees(chaos_server, tmp_out):
    a, b = address(0), address(1)
    # (b is slow: it keeps the crawl open until the test closes it)
    site = chaos_server(
        ChaosConfig(
            hosts=(
                HostConfig(address=a, pages=400, links_per_page=3, latency=0.15),
                HostConfig(address=b, pages=400, links_per_page=3, latency=0.6),
            ),
            seed=5,
        )
    )
    truth = Truth(site)
    port = free_port()
    settings = {
        "ADDONS": {"scrapy_openclaw.Addon": 100},
        "OPENCLAW_METRICS_PORT": port,
        "OPENCLAW_CONTROL_TOKEN": TOKEN,
        "OPENCLAW_DLQ_URI": str(tmp_out / "deadletters.jsonl"),
        "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
        "CLOSESPIDER_TIMEOUT": 120,
        "LOG_LEVEL": "INFO",
    }
    proc = start_crawl(settings=settings, spider_args={"start_urls": site.start_urls}, out_dir=tmp_out)
    try:
        wait_for(lambda: truth.count(a) >= 5 and truth.count(b) >= 5, 30, "both hosts to be crawled")

        # Refused: no token, a wrong token; the refused hold changed nothing.
        assert api(port, "domains", token=None)[0] == 401
        assert api(port, "hold", {"domain": a, "for": 600}, token="wrong-token-0123456789")[0] == 401
        assert api(port, "hold", {"domain": a, "for": 600}, token="")[0] == 401
        assert row(port, a)["overrides"]["hold_until"] is None and row(port, a)["held_until"] is None
        assert api(port, "nonsense", {})[0] == 404
        assert api(port, "hold", {"domain": a})[0] == 400
        # the installed CLI (scrapy.commands entry point), refused and then allowed
        refused = cli("domains", "--url", f"http://127.0.0.1:{port}", "--token", "wrong-token-0123456789")
        assert refused.returncode == 1 and "error (HTTP 401): missing or wrong token" in refused.stdout
        listed = cli("domains", "--url", f"http://127.0.0.1:{port}", token=TOKEN)
        assert listed.returncode == 0 and a in listed.stdout and "crawl: running" in listed.stdout

        # Hold: the held host gets at most what its slot had on the wire (CONCURRENT_REQUESTS_PER_DOMAIN)
        # while the other goes on for several requests more (an event, not a time: on a busy
        # machine the wait is longer, the bound the same).
        at_hold = truth.count(a)
        status, out = api(port, "hold", {"domain": a, "for": 600})
        assert status == 200 and out["domain_state"]["held_until"] > time.time() + 500
        going_on(truth, b, 8)
        held_a = truth.count(a)
        assert held_a - at_hold <= ON_THE_WIRE, "a held domain got requests"
        going_on(truth, b, 8)
        assert truth.count(a) == held_a, "a held domain got requests"
        assert api(port, "release", {"domain": a})[0] == 200
        wait_for(lambda: truth.count(a) > held_a, 30, "the released domain to be crawled again")

        # A rate ceiling of 2 req/s: from the command on, the site's record of a conforms to a
        # bucket of 2 req/s (a quarter second of tokens: one) plus what was on the wire.
        status, out = api(port, "limit", {"domain": a, "rate": 2})
        assert status == 200 and out["domain_state"]["overrides"]["rate"] == 2
        limited_at = time.time()
        going_on(truth, b, 8)
        wait_for(lambda: len([r for r in truth.requests(a) if r["t"] > limited_at]) >= 6, 60, "a at its ceiling")
        after = sorted(r["t"] for r in truth.requests(a) if r["t"] > limited_at)
        beyond = max(j - i + 1 - 1 - 2 * (after[j] - after[i]) for i in range(len(after)) for j in range(i, len(after)))
        assert beyond <= ON_THE_WIRE, after
        assert api(port, "limit", {"domain": a, "rate": None})[0] == 200

        # Pause stops every request (after what was on the wire); resume starts them again.
        at_pause = truth.count(a) + truth.count(b)
        status, out = api(port, "pause", {})
        assert status == 200 and out["paused"] is True
        wait_for(lambda: not truth.in_flight(a) and not truth.in_flight(b), 30, "the wire to drain")
        paused = truth.count(a) + truth.count(b)
        assert paused - at_pause <= 2 * ON_THE_WIRE, "requests went out while paused"
        for _ in range(10):  # the crawl alive and asked, for a while, and still silent
            assert api(port, "domains")[1]["paused"] is True
            time.sleep(0.2)
        assert truth.count(a) + truth.count(b) == paused, "requests went out while paused"
        assert api(port, "resume", {})[1]["paused"] is False
        wait_for(lambda: truth.count(a) + truth.count(b) > paused, 30, "the crawl to resume")

        # Give up: the domain's pending requests become dead letters, the site sees no more of them.
        assert row(port, a)["pending"] > 10
        at_give_up = truth.count(a)
        assert api(port, "give-up", {"domain": a})[0] == 200
        wait_for(lambda: row(port, a).get("pending") == 0, 30, "the given-up domain's requests to drain")
        gone = truth.count(a)
        assert gone - at_give_up <= ON_THE_WIRE
        going_on(truth, b, 4)
        assert truth.count(a) == gone
        status, out = api(port, "restore", {"domain": a})
        assert status == 200 and out["domain_state"]["given_up"] is False

        status, out = api(port, "close", {"reason": "ops_maintenance"})
        assert status == 200
        proc.wait(60)
    finally:
        stop_process(proc)
    result = read_result(tmp_out, proc.returncode)
    stats = result.stats
    assert result.returncode == 0, result.log[-3000:]
    assert stats["finish_reason"] == "ops_maintenance"
    for name, n in {
        "hold": 1,
        "release": 1,
        "limit": 2,
        "pause": 1,
        "resume": 1,
        "give_up": 1,
        "restore": 1,
        "close": 1,
        "unauthorized": 4,
    }.items():
        assert stats.get(f"openclaw/control/{name}") == n, name
    assert "Control command hold {'domain': '127.0.0.2', 'until': " in result.log
    assert "by pytest@127.0.0.1 (via api)" in result.log
    letters = [json.loads(line) for line in (tmp_out / "deadletters.jsonl").read_text().splitlines() if line]
    operator = [x for x in letters if x.get("error_class") == "domain_down"]
    assert len(operator) > 10 and all(x["domain"] == a and "operator" in x["reason"] for x in operator)
    assert stats["openclaw/health/given_up_requests"] == len(operator)


def test_overrides_survive_a_checkpoint_resume(chaos_server, tmp_path):
    a, b = address(0), address(1)
    site = chaos_server(
        ChaosConfig(
            hosts=(
                HostConfig(address=a, pages=300, links_per_page=3, latency=0.15),
                HostConfig(address=b, pages=300, links_per_page=3, latency=0.6),
            ),
            seed=6,
        )
    )
    truth = Truth(site)
    port = free_port()
    settings = {
        "ADDONS": {"scrapy_openclaw.Addon": 100},
        "OPENCLAW_METRICS_PORT": port,
        "OPENCLAW_CONTROL_TOKEN": TOKEN,
        "OPENCLAW_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
        "OPENCLAW_DLQ_URI": str(tmp_path / "deadletters.jsonl"),
        "CLOSESPIDER_TIMEOUT": 120,
        "LOG_LEVEL": "INFO",
    }
    first = start_crawl(settings=settings, spider_args={"start_urls": site.start_urls}, out_dir=tmp_path / "one")
    try:
        wait_for(lambda: truth.count(a) >= 5 and truth.count(b) >= 5, 30, "both hosts to be crawled")
        assert api(port, "hold", {"domain": a, "for": 600})[0] == 200
        assert api(port, "limit", {"domain": b, "rate": 3})[0] == 200
        assert api(port, "close", {"reason": "ops_pause"})[0] == 200
        first.wait(60)
    finally:
        stop_process(first)
    assert read_result(tmp_path / "one").stats["finish_reason"] == "ops_pause"
    held_a = truth.count(a)

    second = start_crawl(settings=settings, spider_args={"start_urls": site.start_urls}, out_dir=tmp_path / "two")
    try:
        restored = wait_for(lambda: _row_or_none(port, a), 30, "the resumed crawl's endpoint")
        assert restored["overrides"]["hold_until"] and restored["held_until"]
        assert row(port, b)["overrides"]["rate"] == 3
        since = truth.count(b)
        wait_for(lambda: truth.count(b) > since + 3, 20, "the resumed crawl to fetch")
        assert truth.count(a) == held_a, "the hold was lost on resume"
        assert api(port, "release", {"domain": a})[0] == 200
        wait_for(lambda: truth.count(a) > held_a, 8, "the released domain to be crawled")
        assert api(port, "close", {"reason": "ops_done"})[0] == 200
        second.wait(60)
    finally:
        stop_process(second)
    result = read_result(tmp_path / "two", second.returncode)
    assert result.stats["finish_reason"] == "ops_done" and "Resuming crawl" in result.log


def _row_or_none(port: int, domain: str) -> dict[str, Any] | None:
    try:
        return row(port, domain) or None
    except OSError:  # (urllib's URLError: not listening yet)
        return None
