"""The request handler: what one host answers to a request (faults first, then the page), and the truth it records.

Each host draws its faults from its own seeded RNG; a delayed answer is a
reactor call the site can cancel, a dropped or hanging one never answers.
"""

from __future__ import annotations

import base64
import json
import math
import random
import struct
import time
import zlib
from collections import Counter, deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from twisted.web import resource, server

from scrapy_openclaw.testing.chaos.config import (
    _IMAGE_RE,
    _PAGE_RE,
    _REASONS,
    BAN_PAGE,
    CONTROL_PATHS,
    DROP,
    HANG,
    ROBOTS_PATH,
    HostConfig,
)

if TYPE_CHECKING:
    from twisted.web.server import Request

    from scrapy_openclaw.testing.chaos.site import ChaosSite


@dataclass(frozen=True)
class _Outcome:
    status: int | str
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()


class _Host:
    """Per-host serving state and ground truth."""

    def __init__(self, site: ChaosSite, index: int, cfg: HostConfig):
        self.site, self.index, self.cfg = site, index, cfg
        self.port: int | None = None
        self.base_url: str | None = None
        self.in_flight = 0
        self.serving = 0  # requests being served (at most ``capacity``)
        self.line: deque[Any] = deque()  # (start) of the requests waiting for a worker
        self.reset()

    def reset(self) -> None:
        self.rng = random.Random(f"faults:{self.site.config.seed}:{self.cfg.address}")
        self.requests: list[dict[str, Any]] = []
        self.max_in_flight = self.in_flight
        self.script_fetches: Counter[int] = Counter()
        self.parse_fetches: Counter[int] = Counter()
        self.tokens = float(self.cfg.rate_limit.burst) if self.cfg.rate_limit else 0.0
        self.tokens_at = time.monotonic()
        self.seen = 0  # requests so far, robots.txt aside (for ban_after)
        self.limited = 0  # requests the limiter judged (for rate_limit.every)
        self.window_at, self.window_count = -1, 0  # the fixed window in force and its requests (rate_limit.window)
        self.refusals = 0  # requests the limiter refused (numbers rate_limit.retry_after's "{n}")
        self.banned_at: float | None = None

    def _banned(self, path: str, now: float) -> bool:
        cfg = self.cfg
        if cfg.ban_after is None or path == ROBOTS_PATH:
            return False
        self.seen += 1
        if self.seen <= cfg.ban_after:
            return False
        if self.banned_at is None:
            self.banned_at = now
        return cfg.ban_seconds is None or now - self.banned_at < cfg.ban_seconds

    def _take_token(self, elapsed: float) -> bool:
        """Whether the limiter lets this request through (its bucket at the limit in force)."""
        limit = self.cfg.rate_limit
        assert limit is not None
        if limit.every:
            self.limited += 1
            return self.limited % limit.every != 0
        rate, burst = limit.at(elapsed)
        if limit.window:
            opened = math.floor(elapsed / limit.window)
            if opened != self.window_at:
                self.window_at, self.window_count = opened, 0
            self.window_count += 1
            return self.window_count <= round(rate * limit.window)
        now = time.monotonic()
        self.tokens = min(float(burst), self.tokens + (now - self.tokens_at) * rate)
        self.tokens_at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False

    def _declared(self, now: float) -> list[tuple[str, str]]:
        """The limit in force as the host's answers declare it (``rate_limit.declare``), after
        this request took its token: the quota per window, what is left, when a token is back."""
        limit = self.cfg.rate_limit
        if limit is None or not limit.declare or limit.every or limit.window:
            return []
        rate, _ = limit.at(self.site.elapsed(now))
        window = 1 if rate == int(rate) else 10  # (a quota is a whole number of requests)
        quota = round(rate * window)
        left = int(self.tokens)
        until = 0.0 if left or rate <= 0 else (1.0 - self.tokens) / rate  # seconds until a token is back
        reset = math.ceil(until)  # (whole seconds, as the drafts say)
        if limit.declare == "ietf":
            return [("RateLimit-Policy", f'"chaos";q={quota};w={window}'), ("RateLimit", f'"chaos";r={left};t={reset}')]
        if limit.declare == "garbage":
            return [("RateLimit-Policy", '"chaos";q=lots;w=1'), ("RateLimit", '"chaos";r=none;t=soon')]
        if limit.declare == "legacy":
            return [
                ("RateLimit-Limit", str(quota)),
                ("RateLimit-Remaining", str(left)),
                ("RateLimit-Reset", str(reset)),
                ("RateLimit-Policy", f"{quota};w={window}"),
            ]
        return [
            ("X-RateLimit-Limit", str(quota)),
            ("X-RateLimit-Remaining", str(left)),
            ("X-RateLimit-Reset", str(math.ceil(now + until))),
        ]

    def decide(self, path: str, now: float, authorization: bytes | None = None) -> tuple[_Outcome, float]:
        cfg = self.cfg
        elapsed = self.site.elapsed(now)  # (the site's clock: started by the first request, if so configured)
        r_drop, r_hang, r_latency = self.rng.random(), self.rng.random(), self.rng.random()
        delay = cfg.latency + cfg.latency_jitter * r_latency
        limit = cfg.rate_limit
        if limit is not None and not self._take_token(elapsed):
            self.refusals += 1
            value = None
            if limit.retry_after is not None:
                rest = math.ceil(limit.window - elapsed % limit.window) if limit.window else 0
                value = limit.retry_after.replace("{n}", str(self.refusals)).replace("{rest}", str(rest))
            headers = (("Retry-After", value),) if value is not None else ()
            return _Outcome(limit.status, _error_body(limit.status), headers), delay
        if r_drop < cfg.drop_rate:
            return _Outcome(DROP), delay
        if r_hang < cfg.hang_rate:
            return _Outcome(HANG), delay
        if self._banned(path, now):
            return _Outcome(cfg.ban_status, BAN_PAGE), delay
        windows = cfg.fail_windows
        if windows is not None and windows.is_down(elapsed):
            return _Outcome(windows.status, _error_body(windows.status)), delay
        if path == ROBOTS_PATH and cfg.robots_txt is not None:
            headers = (("Content-Type", "text/plain; charset=utf-8"),)
            return _Outcome(200, cfg.robots_txt.encode(), headers), delay
        if cfg.basic_auth is not None and path != ROBOTS_PATH and authorization != _basic(cfg.basic_auth):
            return _Outcome(401, _error_body(401), (("WWW-Authenticate", 'Basic realm="chaos"'),)), delay
        image = _IMAGE_RE.match(path)
        if image:
            return _Outcome(200, _png(int(image.group(1)) + 1), (("Content-Type", "image/png"),)), delay
        match = _PAGE_RE.match(path)
        page = 0 if path == "/" else int(match.group(1)) if match else -1
        if not 0 <= page < cfg.pages:
            return _Outcome(404, _error_body(404)), delay
        script = cfg.status_script.get(page)
        if script is not None:
            status = script[min(self.script_fetches[page], len(script) - 1)]
            self.script_fetches[page] += 1
            if status != 200:
                return _Outcome(status, _error_body(status)), delay
        elif page in cfg.not_found:
            return _Outcome(404, _error_body(404)), delay
        if page in cfg.redirects:
            return _Outcome(302, b"", (("Location", f"/page/{cfg.redirects[page]}"),)), delay
        if page in cfg.meta_refresh:
            refresh = f'<html><head><meta http-equiv="refresh" content="0; url=/page/{cfg.meta_refresh[page]}">'
            return _Outcome(200, f"{refresh}</head><body></body></html>".encode()), delay
        with_title = True
        if page in cfg.parse_fail:
            with_title = self.parse_fetches[page] >= cfg.parse_fail[page]
            self.parse_fetches[page] += 1
        body = self.site.render_page(self.index, page, with_title)
        size = cfg.page_sizes.get(page, 0)
        if len(body) < size:
            body = body.replace(b"</body>", b"<!--" + b"x" * (size - len(body) - 7) + b"--></body>")
        return _Outcome(200, body), delay

    def handle(self, request: Request, path: str) -> int:
        now = time.time()
        record: dict[str, Any] = {
            "t": now,
            "path": path,
            "method": request.method.decode("latin-1"),
            "status": None,
            "end": None,
        }
        cookie = request.getHeader(b"cookie")
        if cookie is not None:
            record["cookie"] = cookie.decode("latin-1")
        self.requests.append(record)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        outcome, delay = self.decide(path, now, request.getHeader(b"authorization"))
        if self.cfg.set_cookie is not None:
            request.setHeader("Set-Cookie", f"{self.cfg.set_cookie}; Path=/")
        for name, value in self._declared(now):
            request.setHeader(name, value)
        record["status"] = outcome.status
        if outcome.body is BAN_PAGE:
            record["banned"] = True
        pending: list[Any] = []
        served = False

        def start() -> None:
            nonlocal served
            served = True
            self.serving += 1
            if self.cfg.capacity is not None:
                record["wait"] = time.time() - now
            if outcome.status == HANG:
                return
            if delay > 0:
                pending.append(self.site.call_later(delay, _act, request, outcome, record))
            else:
                _act(request, outcome, record)

        def finished(_: Any) -> None:
            for call in pending:
                self.site.forget_call(call)
            record["end"] = time.time()
            self.in_flight -= 1
            if not served:  # gone while in line
                self.line.remove(start)
                return
            self.serving -= 1
            if self.line:
                self.line.popleft()()

        request.notifyFinish().addBoth(finished)
        if self.cfg.capacity is not None and self.serving >= self.cfg.capacity:
            self.line.append(start)
        else:
            start()
        return server.NOT_DONE_YET


def _error_body(status: int) -> bytes:
    return f"<html><body><h2>Error {status}</h2></body></html>".encode()


def _basic(credentials: str) -> bytes:
    """The Authorization header that carries ``user:password``."""
    return b"Basic " + base64.b64encode(credentials.encode())


def _png(side: int) -> bytes:
    """A valid grey PNG *side* pixels square (8-bit greyscale, no Pillow needed)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + bytes([128]) * side for _ in range(side))
    header = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def _act(request: Request, outcome: _Outcome, record: dict[str, Any]) -> None:
    # A delayed answer is cancelled when its connection goes away (see ``_Host.handle``).
    if request.finished:
        return
    if outcome.status == DROP:
        assert request.transport is not None  # (the connected channel's, set when the request was made)
        request.transport.abortConnection()
        return
    status = int(outcome.status)
    request.setResponseCode(status, _REASONS.get(status, b"Chaos"))
    request.setHeader("Content-Type", "text/html; charset=utf-8")
    for name, value in outcome.headers:
        request.setHeader(name, value)
    request.write(outcome.body)
    record["bytes"] = len(outcome.body)  # body bytes sent (the truth's "bytes")
    request.finish()


class _HostResource(resource.Resource):
    isLeaf = True

    def __init__(self, host: _Host):
        super().__init__()
        self.host = host

    def render(self, request: Request) -> bytes | int:
        path = request.path.decode("utf-8", "replace")
        if path in CONTROL_PATHS:
            request.setHeader("Content-Type", "application/json")
            if path == "/__reset__":
                if request.method != b"POST":
                    request.setResponseCode(405)
                    return b'{"error": "POST only"}'
                self.host.site.reset()
                return b'{"ok": true}'
            full = request.args.get(b"requests", [b"1"])[0] != b"0"
            return json.dumps(self.host.site.truth(include_requests=full)).encode()
        return self.host.handle(request, path)
