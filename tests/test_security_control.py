"""A hostile client of the metrics port and the control API, and a hostile network around
``scrapy openclaw-ctl``: bodies refused unread, refusals condensed, ``Host`` checked
(DNS rebinding), the CLI's token never sent through a proxy or a redirect."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from test_control_crawl import TOKEN, api, wait_for

from scrapy_openclaw.testing.crawl import read_result, start_crawl
from scrapy_openclaw.testing.proxy import ForwardProxy
from scrapy_openclaw.testing.servers import free_port, stop_process, subprocess_env

GIB = 1024**3


def raw(port: int, head: str, *, body: bytes = b"", timeout: float = 20) -> tuple[int, bytes, float]:
    """Send *head* (and *body*), read the answer: ``(status, whole answer, seconds until it came)``."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head.replace("\n", "\r\n").encode() + b"\r\n" + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1]), answer, time.monotonic() - started


class Crawl:
    """A crawl with the control API on, slow enough to be talked to."""

    def __init__(self, proc: Any, port: int, out: Path):
        self.proc, self.port, self.out = proc, port, out

    def finish(self) -> Any:
        """Close it through the API; its log and stats."""
        assert api(self.port, "close", {"reason": "test_done"})[0] == 200
        self.proc.wait(60)
        return read_result(self.out, self.proc.returncode)


@pytest.fixture
def crawl(chaos_server: Any, tmp_path: Path) -> Any:
    site = chaos_server({"hosts": [{"address": "127.0.0.2", "pages": 400, "links_per_page": 3, "latency": 0.5}]})
    port = free_port()
    settings = {
        "ADDONS": {"scrapy_openclaw.Addon": 100},
        "OPENCLAW_METRICS_PORT": port,
        "OPENCLAW_CONTROL_TOKEN": TOKEN,
        "OPENCLAW_ALLOWED_HOSTS": ["crawler.internal"],
        "OPENCLAW_DLQ_URI": str(tmp_path / "dead.jsonl"),
        "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
        "CLOSESPIDER_TIMEOUT": 120,
        "LOG_LEVEL": "INFO",
    }
    proc = start_crawl(settings=settings, spider_args={"start_urls": site.start_urls}, out_dir=tmp_path / "r")
    try:
        wait_for(lambda: _answers(port), 30, "the control API")
        yield Crawl(proc, port, tmp_path / "r")
    finally:
        stop_process(proc)


def _answers(port: int) -> bool:
    try:
        return api(port, "domains")[0] == 200
    except OSError:
        return False


def test_control_api_refuses_before_reading_and_condenses_its_warnings(crawl: Crawl) -> None:
    port = crawl.port
    # 1 GiB declared, not one byte of it sent: the answer comes anyway, so the body was never awaited
    status, answer, _ = raw(port, f"POST /control/pause HTTP/1.1\nHost: 127.0.0.1:{port}\nContent-Length: {GIB}\n")
    assert status == 401 and b"WWW-Authenticate: Bearer" in answer
    status, answer, _ = raw(
        port,
        f"POST /control/pause HTTP/1.1\nHost: 127.0.0.1:{port}\nAuthorization: Bearer {TOKEN}\nContent-Length: {GIB}\n",
    )
    assert status == 413 and b"body larger than 65536 bytes" in answer
    status, _, _ = raw(
        port,
        f"POST /control/pause HTTP/1.1\nHost: 127.0.0.1:{port}\nAuthorization: Bearer {TOKEN}\n"
        "Transfer-Encoding: chunked\n",
    )
    assert status == 411
    for n in range(200):
        assert api(port, "hold", {"domain": "127.0.0.2", "for": 600}, token=f"wrong-{n}")[0] == 401
    state = api(port, "domains")[1]
    assert state["paused"] is False and state["domains"][0]["held_until"] is None  # nothing ran
    for _ in range(50):
        assert raw(port, "GET /metrics HTTP/1.1\nHost: evil.example\nConnection: close\n")[0] == 421
    result = crawl.finish()
    assert result.stats["openclaw/control/unauthorized"] == 201
    ours = [line for line in result.log.splitlines() if " WARNING: " in line and "refused" in line.lower()]
    assert 1 <= len(ours) <= 6, "\n".join(ours[:20])
    assert any("missing or wrong token" in line for line in ours)
    assert any("Host 'evil.example'" in line for line in ours)
    assert any("200 more warnings like this one were not logged: Control API: refused" in line for line in ours)
    assert any("49 more warnings like this one were not logged: Refused a request for Host" in line for line in ours)


def test_host_names_that_are_not_ours_are_refused(crawl: Crawl) -> None:
    port = crawl.port
    metrics = "GET /metrics HTTP/1.1\nHost: {host}\nConnection: close\n"
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "crawler.internal", f"[::1]:{port}", "10.1.2.3:80"):
        status, answer, _ = raw(port, metrics.format(host=host))
        assert status == 200 and b"openclaw_" in answer, host
    for host in (f"evil.example:{port}", "rebind.attacker.test", "127.0.0.1.nip.io"):
        status, answer, _ = raw(port, metrics.format(host=host))
        assert status == 421 and b"openclaw_" not in answer, host
    control = f"POST /control/pause HTTP/1.1\nHost: evil.example\nAuthorization: Bearer {TOKEN}\nContent-Length: 2\n"
    assert raw(port, control, body=b"{}")[0] == 421
    assert api(port, "domains")[1]["paused"] is False
    assert crawl.finish().returncode == 0


class _Redirector(BaseHTTPRequestHandler):
    """Answers every call with a redirect to ``target`` and records what reached it."""

    target = ""
    seen: list[dict[str, Any]] = []

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _any(self) -> None:
        self.seen.append({"path": self.path, "authorization": self.headers.get("Authorization")})
        if self.target:
            self.send_response(307)
            self.send_header("Location", self.target)
            self.end_headers()
        else:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"ok": true}')

    do_GET = do_POST = _any


def _serve(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _ctl(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "scrapy", "openclaw-ctl", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd="/",
    )


def test_openclaw_ctl_ignores_environment_proxies(crawl: Crawl) -> None:
    port = crawl.port
    with ForwardProxy() as proxy:
        env = {k: v for k, v in subprocess_env().items() if k.lower() != "no_proxy"}  # (this checkout)
        env.update(http_proxy=proxy.url, HTTP_PROXY=proxy.url, all_proxy=proxy.url, OPENCLAW_CONTROL_TOKEN=TOKEN)
        listed = _ctl("domains", "--url", f"http://127.0.0.1:{port}", env=env)
        assert listed.returncode == 0 and "127.0.0.2" in listed.stdout, listed.stdout + listed.stderr
        assert proxy.record == []  # the proxy saw nothing, the token least of all


def test_openclaw_ctl_does_not_follow_redirects() -> None:
    class Sink(_Redirector):
        seen: list[dict[str, Any]] = []

    class Bounce(_Redirector):
        seen: list[dict[str, Any]] = []

    sink = _serve(Sink)
    Bounce.target = f"http://127.0.0.1:{sink.server_address[1]}/control/pause"
    bounce = _serve(Bounce)
    try:
        env = {**subprocess_env(), "OPENCLAW_CONTROL_TOKEN": TOKEN}
        for command in ("domains", "pause"):  # (urllib would follow a GET's 307 with the token)
            out = _ctl(command, "--url", f"http://127.0.0.1:{bounce.server_address[1]}", env=env)
            assert out.returncode == 1
            assert "answered a redirect to" in out.stdout and "not followed" in out.stdout, out.stdout + out.stderr
        assert len(Bounce.seen) == 2 and Sink.seen == []
    finally:
        for server in (sink, bounce):
            server.shutdown()
            server.server_close()
