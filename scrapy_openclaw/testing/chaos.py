"""A deterministic, misbehaving HTTP site for proving crawl behaviour.

Every host is its own loopback address (127.0.0.2, 127.0.0.3, ...) so Scrapy
sees distinct domains and download slots. Faults (latency, 503 windows, 429
with Retry-After, dropped and hanging connections, 404s, parse failures,
scripted statuses; a status script's last status repeats, so ``{5: [503]}``
is a page broken for good) come from configuration and a seeded RNG, and the
site records what it really served (the *ground truth*, ``/robots.txt``
fetches included under their own path), so tests assert on facts rather than
on wall-clock guesses.

In-process: ``ChaosSite(config).start()`` on the running reactor.
Subprocess: ``python -m scrapy_openclaw.testing.chaos CONFIG.json``.
Presets live in :mod:`scrapy_openclaw.testing.presets`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import time
from collections import Counter, deque
from dataclasses import asdict, dataclass, field
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from twisted.internet import defer
from twisted.web import resource, server

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from twisted.web import http
    from twisted.web.server import Request

CONTROL_PATHS = ("/__truth__", "/__reset__")
ROBOTS_PATH = "/robots.txt"
DROP = "drop"
HANG = "hang"
_PAGE_RE = re.compile(r"^/page/(\d+)$")
_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
#: The id of the captcha form on a chaos ban page: the marker a policy lists for it.
BAN_MARKER = "chaos-captcha-form"
BAN_TITLE = "Verify you are human"
BAN_PAGE = (
    f'<html><head><title>{BAN_TITLE}</title></head><body><h1 id="title">{BAN_TITLE}</h1>'
    f'<form id="{BAN_MARKER}" action="/verify"><div class="g-recaptcha"></div></form></body></html>'
).encode()


@dataclass(frozen=True)
class FailWindows:
    """During the first ``down`` seconds of every ``period`` every request gets ``status``."""

    period: float
    down: float
    status: int = 503
    offset: float = 0.0

    def __post_init__(self) -> None:
        if self.period <= 0 or not 0 <= self.down <= self.period:
            raise ValueError(f"fail_windows: need period > 0 and 0 <= down <= period, got {self}")

    def is_down(self, elapsed: float) -> bool:
        """Whether ``elapsed`` seconds after the site started fall in a down window."""
        return (elapsed + self.offset) % self.period < self.down


@dataclass(frozen=True)
class RateLimit:
    """Token bucket; a request finding no token gets 429 (+ ``Retry-After`` unless None)."""

    rate: float
    burst: int = 1
    retry_after: str | None = "1"

    def __post_init__(self) -> None:
        if self.rate < 0 or self.burst < 1:
            raise ValueError(f"rate_limit: need rate >= 0 and burst >= 1, got {self}")


@dataclass(frozen=True)
class HostConfig:
    address: str
    port: int = 0
    pages: int = 50
    links_per_page: int | str = 5
    cross_links: int = 0
    latency: float = 0.0
    latency_jitter: float = 0.0
    fail_windows: FailWindows | None = None
    rate_limit: RateLimit | None = None
    drop_rate: float = 0.0
    hang_rate: float = 0.0
    not_found: tuple[int, ...] = ()
    parse_fail: dict[int, int] = field(default_factory=dict)
    status_script: dict[int, tuple[int, ...]] = field(default_factory=dict)
    robots_txt: str | None = None  # served at /robots.txt with 200; None: 404 like any unknown path
    # a ban: after this many requests (robots.txt aside) every page answers ban_status with a
    # captcha page (BAN_MARKER in it, and an h1#title a careless spider would scrape) ...
    ban_after: int | None = None
    ban_seconds: float | None = None  # ... for this long from the first ban page (None: for good)
    ban_status: int = 200

    def __post_init__(self) -> None:
        # Accept plain JSON data (dicts, lists, string keys) and normalise it.
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        if isinstance(self.fail_windows, dict):
            put("fail_windows", FailWindows(**self.fail_windows))
        if isinstance(self.rate_limit, dict):
            put("rate_limit", RateLimit(**self.rate_limit))
        put("not_found", tuple(sorted(int(p) for p in self.not_found)))
        put("parse_fail", {int(k): int(v) for k, v in self.parse_fail.items()})
        put("status_script", {int(k): tuple(int(s) for s in v) for k, v in self.status_script.items()})
        where = f"host {self.address}"
        if self.pages < 1:
            raise ValueError(f"{where}: pages must be >= 1")
        if self.links_per_page != "all" and not (isinstance(self.links_per_page, int) and self.links_per_page >= 0):
            raise ValueError(f"{where}: links_per_page must be an int >= 0 or 'all'")
        for name in ("drop_rate", "hang_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{where}: {name} must be within [0, 1]")
        if self.latency < 0 or self.latency_jitter < 0 or self.cross_links < 0:
            raise ValueError(f"{where}: latency, latency_jitter and cross_links must be >= 0")
        if any(not v for v in self.status_script.values()):
            raise ValueError(f"{where}: status_script lists must not be empty")
        if self.ban_after is not None and self.ban_after < 0 or (self.ban_seconds or 0) < 0:
            raise ValueError(f"{where}: ban_after and ban_seconds must be >= 0")


@dataclass(frozen=True)
class ChaosConfig:
    hosts: tuple[HostConfig, ...]
    seed: int = 1

    def __post_init__(self) -> None:
        hosts = tuple(h if isinstance(h, HostConfig) else HostConfig(**h) for h in self.hosts)
        object.__setattr__(self, "hosts", hosts)
        addresses = [h.address for h in hosts]
        if not hosts or len(set(addresses)) != len(addresses):
            raise ValueError(f"ChaosConfig needs at least one host and unique addresses: {addresses}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ChaosConfig:
        return cls(hosts=tuple(data["hosts"]), seed=int(data.get("seed", 1)))

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe (``json.dumps`` turns the int keys into strings; ``from_dict`` reads them back)."""
        return asdict(self)


# --------------------------------------------------------------------------- graph


def page_path(page: int) -> str:
    return f"/page/{page}"


def page_links(config: ChaosConfig, host_index: int, page: int) -> list[tuple[int, int]]:
    """Outgoing links of a page as ``(host_index, page)``; same seed, same links."""
    host = config.hosts[host_index]
    rng = random.Random(f"links:{config.seed}:{host.address}:{page}")
    links: list[tuple[int, int]] = []
    if host.links_per_page == "all":
        if page == 0:
            links.extend((host_index, k) for k in range(1, host.pages))
    else:
        k = min(int(host.links_per_page), host.pages - 1)
        links.extend((host_index, p + (p >= page)) for p in rng.sample(range(host.pages - 1), k))
    others = [i for i in range(len(config.hosts)) if i != host_index]
    for _ in range(host.cross_links if others else 0):
        other = rng.choice(others)
        links.append((other, rng.randrange(config.hosts[other].pages)))
    return links


def _page_fails_for_good(host: HostConfig, page: int) -> bool:
    script = host.status_script.get(page)
    return (
        page >= host.pages or (script is not None and script[-1] != 200) or (script is None and page in host.not_found)
    )


@dataclass(frozen=True)
class Reachable:
    """URLs a crawler reaches from the start URLs: ``ok`` pages, and ``failing`` ones (404 for good)."""

    ok: frozenset[str]
    failing: frozenset[str]


def reachable_urls(config: ChaosConfig, urls: Mapping[str, str], start: Iterable[str] | None = None) -> Reachable:
    """BFS over URLs (the root ``/`` and ``/page/0`` are distinct URLs, as for Scrapy's dupefilter).

    ``urls`` maps address -> base URL; ``start`` defaults to every host's root.
    Failing pages are not expanded; parse-fail pages count as ok (they recover).
    """
    base = {h.address: urls[h.address].rstrip("/") for h in config.hosts}
    by_netloc = {base[h.address].split("//", 1)[1]: i for i, h in enumerate(config.hosts)}

    def locate(url: str) -> tuple[int, int]:
        netloc, _, path = url.split("//", 1)[1].partition("/")
        match = _PAGE_RE.match("/" + path)
        return by_netloc[netloc], (0 if path == "" else int(match.group(1)) if match else -1)

    queue = deque(start if start is not None else [base[h.address] + "/" for h in config.hosts])
    seen: set[str] = set(queue)
    ok: set[str] = set()
    failing: set[str] = set()
    while queue:
        url = queue.popleft()
        index, page = locate(url)
        host = config.hosts[index]
        if page < 0 or _page_fails_for_good(host, page):
            failing.add(url)
            continue
        ok.add(url)
        for other, target in page_links(config, index, page):
            link = base[config.hosts[other].address] + page_path(target)
            if link not in seen:
                seen.add(link)
                queue.append(link)
    return Reachable(frozenset(ok), frozenset(failing))


def max_in_window(times: Iterable[float], window: float = 1.0) -> int:
    """Most events in any half-open interval of length ``window``."""
    ts = sorted(times)
    best = lo = 0
    for hi, t in enumerate(ts):
        while t - ts[lo] >= window:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


# --------------------------------------------------------------------------- server


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

    def _take_token(self) -> bool:
        limit = self.cfg.rate_limit
        assert limit is not None
        now = time.monotonic()
        self.tokens = min(float(limit.burst), self.tokens + (now - self.tokens_at) * limit.rate)
        self.tokens_at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False

    def decide(self, path: str, now: float) -> tuple[_Outcome, float]:
        cfg = self.cfg
        r_drop, r_hang, r_latency = self.rng.random(), self.rng.random(), self.rng.random()
        delay = cfg.latency + cfg.latency_jitter * r_latency
        if cfg.rate_limit is not None and not self._take_token():
            retry_after = cfg.rate_limit.retry_after
            headers = (("Retry-After", retry_after),) if retry_after is not None else ()
            return _Outcome(429, _error_body(429), headers), delay
        if r_drop < cfg.drop_rate:
            return _Outcome(DROP), delay
        if r_hang < cfg.hang_rate:
            return _Outcome(HANG), delay
        if self._banned(path, now):
            return _Outcome(cfg.ban_status, BAN_PAGE), delay
        windows = cfg.fail_windows
        if windows is not None and windows.is_down(now - (self.site.started_at or now)):
            return _Outcome(windows.status, _error_body(windows.status)), delay
        if path == ROBOTS_PATH and cfg.robots_txt is not None:
            headers = (("Content-Type", "text/plain; charset=utf-8"),)
            return _Outcome(200, cfg.robots_txt.encode(), headers), delay
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
        with_title = True
        if page in cfg.parse_fail:
            with_title = self.parse_fetches[page] >= cfg.parse_fail[page]
            self.parse_fetches[page] += 1
        return _Outcome(200, self.site.render_page(self.index, page, with_title)), delay

    def handle(self, request: Request, path: str) -> int:
        now = time.time()
        record: dict[str, Any] = {
            "t": now,
            "path": path,
            "method": request.method.decode("latin-1"),
            "status": None,
            "end": None,
        }
        self.requests.append(record)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        outcome, delay = self.decide(path, now)
        record["status"] = outcome.status
        if outcome.body is BAN_PAGE:
            record["banned"] = True
        pending: list[Any] = []

        def finished(_: Any) -> None:
            for call in pending:
                self.site.forget_call(call)
            record["end"] = time.time()
            self.in_flight -= 1

        request.notifyFinish().addBoth(finished)
        if outcome.status == HANG:
            return server.NOT_DONE_YET
        if delay > 0:
            pending.append(self.site.call_later(delay, _act, request, outcome))
        else:
            _act(request, outcome)
        return server.NOT_DONE_YET


def _error_body(status: int) -> bytes:
    return f"<html><body><h2>Error {status}</h2></body></html>".encode()


def _act(request: Request, outcome: _Outcome) -> None:
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


class _ChaosFactory(server.Site):
    """A Site that stays quiet and can drop every open connection on demand."""

    noisy = False

    def __init__(self, res: resource.Resource, reactor: Any):
        super().__init__(res, reactor=reactor)
        self.open: dict[Any, Any] = {}  # protocol -> its transport
        self._waiters: list[defer.Deferred[None]] = []

    def log(self, request: http.Request) -> None:  # no access log
        pass

    def buildProtocol(self, addr: Any) -> Any:
        proto = super().buildProtocol(addr)
        make_connection, connection_lost = proto.makeConnection, proto.connectionLost

        def makeConnection(transport: Any) -> None:
            self.open[proto] = transport
            make_connection(transport)

        def connectionLost(reason: Any) -> None:
            self.open.pop(proto, None)
            try:
                connection_lost(reason)
            finally:
                if not self.open:
                    waiters, self._waiters = self._waiters, []
                    for d in waiters:
                        if not d.called:  # it may have timed out
                            d.callback(None)

        proto.makeConnection, proto.connectionLost = makeConnection, connectionLost
        return proto

    def abort_all(self) -> defer.Deferred[None]:
        """Abort every open connection; fires once they are all gone."""
        if not self.open:
            return defer.succeed(None)
        d: defer.Deferred[None] = defer.Deferred()
        self._waiters.append(d)
        for transport in list(self.open.values()):
            transport.abortConnection()
        return d


class ChaosSite:
    """The chaos site on the running reactor (the default one or ``AsyncioSelectorReactor``)."""

    def __init__(self, config: ChaosConfig | Mapping[str, Any], reactor: Any = None):
        self.config = config if isinstance(config, ChaosConfig) else ChaosConfig.from_dict(config)
        self._reactor = reactor
        self.started_at: float | None = None
        self._hosts = [_Host(self, i, h) for i, h in enumerate(self.config.hosts)]
        self._ports: list[Any] = []
        self._factories: list[_ChaosFactory] = []
        self._calls: set[Any] = set()

    @property
    def reactor(self) -> Any:
        if self._reactor is None:
            from twisted.internet import reactor

            self._reactor = reactor
        return self._reactor

    @property
    def urls(self) -> dict[str, str]:
        """address -> base URL (``http://127.0.0.2:PORT/``), in host order."""
        return {h.cfg.address: h.base_url for h in self._hosts if h.base_url}

    def start(self) -> dict[str, str]:
        if self._ports:
            raise RuntimeError("ChaosSite already started")
        self.started_at = time.time()
        for host in self._hosts:
            factory = _ChaosFactory(_HostResource(host), self.reactor)
            port = self.reactor.listenTCP(host.cfg.port, factory, interface=host.cfg.address)
            self._ports.append(port)
            self._factories.append(factory)
            host.port = port.getHost().port
            host.base_url = f"http://{host.cfg.address}:{host.port}/"
        return self.urls

    def stop(self) -> defer.Deferred[None]:
        """Stop listening, cancel pending answers and drop every open (even hanging) connection."""
        ports, self._ports = self._ports, []
        factories, self._factories = self._factories, []
        for call in list(self._calls):
            self.forget_call(call)
        waits = [defer.maybeDeferred(p.stopListening) for p in ports]
        waits += [f.abort_all().addTimeout(5, self.reactor) for f in factories]
        dl = defer.DeferredList(waits, consumeErrors=True)
        return dl.addCallback(lambda _: None)

    def call_later(self, delay: float, fn: Any, *args: Any) -> Any:
        def run() -> None:
            self._calls.discard(call)
            fn(*args)

        call = self.reactor.callLater(delay, run)
        self._calls.add(call)
        return call

    def forget_call(self, call: Any) -> None:
        self._calls.discard(call)
        if call.active():
            call.cancel()

    def render_page(self, host_index: int, page: int, with_title: bool = True) -> bytes:
        address = self.config.hosts[host_index].address
        title = f"Page {page} on {address}"
        urls = self.urls
        links = " ".join(
            f'<a href="{urls[self.config.hosts[h].address].rstrip("/")}{page_path(p)}">page {p}</a>'
            for h, p in page_links(self.config, host_index, page)
        )
        h1 = f'<h1 id="title">{title}</h1> ' if with_title else "<p>no title here</p> "
        return f"<html><head><title>{title}</title></head><body>{h1}{links}</body></html>".encode()

    def reachable(self, start: Iterable[str] | None = None) -> Reachable:
        return reachable_urls(self.config, self.urls, start)

    def reset(self) -> None:
        """Clear the truth and fault state (counters, buckets, RNG); the fail-window clock keeps running."""
        for host in self._hosts:
            host.reset()

    def truth(self, include_requests: bool = True) -> dict[str, Any]:
        hosts = {}
        for host in self._hosts:
            reqs = host.requests
            entry: dict[str, Any] = {
                "base_url": host.base_url,
                "total": len(reqs),
                "counts": dict(Counter(r["path"] for r in reqs)),
                "statuses": dict(Counter(str(r["status"]) for r in reqs)),
                "max_1s_window": max_in_window(r["t"] for r in reqs),
                "max_in_flight": host.max_in_flight,
                "banned": sum(1 for r in reqs if r.get("banned")),
                "in_flight": host.in_flight,
            }
            if include_requests:
                entry["requests"] = [dict(r) for r in reqs]
            hosts[host.cfg.address] = entry
        return {"started_at": self.started_at, "now": time.time(), "hosts": hosts}


# --------------------------------------------------------------------------- subprocess


def _install_asyncio_reactor() -> None:
    import asyncio

    from twisted.internet import asyncioreactor

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    asyncioreactor.install(eventloop=loop)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scrapy_openclaw.testing.chaos")
    parser.add_argument("config", help="path of a JSON file holding a ChaosConfig dict")
    parser.add_argument("--max-seconds", type=float, default=900.0, help="exit after this long")
    args = parser.parse_args(argv)
    with open(args.config, encoding="utf-8") as f:
        config = ChaosConfig.from_dict(json.load(f))
    _install_asyncio_reactor()
    from twisted.internet import reactor as installed_reactor

    # (zope interface methods take no self: without a zope plugin mypy misreads IReactorCore)
    reactor: Any = installed_reactor
    site = ChaosSite(config, reactor=reactor)
    urls = site.start()
    sys.stdout.write(json.dumps({"urls": urls, "pid": os.getpid()}) + "\n")
    sys.stdout.flush()
    reactor.addSystemEventTrigger("before", "shutdown", site.stop)
    reactor.callLater(args.max_seconds, reactor.stop)
    reactor.run()  # Twisted's own SIGINT/SIGTERM handlers stop it cleanly
    loop = getattr(reactor, "_asyncioEventloop", None)
    if loop is not None and not loop.is_closed():
        loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
