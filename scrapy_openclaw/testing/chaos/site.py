"""The chaos site on a reactor: one listening port per host, start/stop, the rendered pages and the truth.

Stopping drops every open connection (hanging ones too) and cancels pending
answers, so a test's reactor is left clean.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from twisted.internet import defer
from twisted.web import resource, server

from scrapy_openclaw.testing.chaos.config import ChaosConfig
from scrapy_openclaw.testing.chaos.graph import Reachable, max_in_window, page_links, page_path, reachable_urls
from scrapy_openclaw.testing.chaos.hosts import _Host, _HostResource

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from twisted.web import http


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
    """The chaos site on the running reactor (the default one or ``AsyncioSelectorReactor``).

    In-process: ``ChaosSite(config).start()``; in a subprocess:
    ``python -m scrapy_openclaw.testing.chaos CONFIG.json`` (:mod:`.cli`). Presets live in
    :mod:`scrapy_openclaw.testing.presets`. The ground truth records ``/robots.txt``
    fetches too, under their own path.
    """

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

    def elapsed(self, now: float) -> float:
        """Seconds on the site's clock at ``now`` (wall time); a ``first_request`` clock starts here."""
        if self.started_at is None:
            self.started_at = now
        return now - self.started_at

    def start(self) -> dict[str, str]:
        if self._ports:
            raise RuntimeError("ChaosSite already started")
        if self.config.clock == "start":
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
                "bytes": sum(r.get("bytes", 0) for r in reqs),
                "max_in_flight": host.max_in_flight,
                "banned": sum(1 for r in reqs if r.get("banned")),
                "in_flight": host.in_flight,
            }
            if include_requests:
                entry["requests"] = [dict(r) for r in reqs]
            hosts[host.cfg.address] = entry
        return {"started_at": self.started_at, "now": time.time(), "hosts": hosts}


# --------------------------------------------------------------------------- subprocess
