"""One way to serve Prometheus ``/metrics`` from the Twisted reactor (the crawl's and the scheduler's).

Requests are judged on their headers, before a byte of their body is read: a
``Host`` name that is not ours (a DNS-rebinding page in a browser) gets 421,
and a guard (the control API's token and size check) may refuse others.
Twisted would otherwise spool a body of any size to a temporary file first.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import socket
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from twisted.python.threadpool import ThreadPool
from twisted.web.http import RESPONSES, HTTPChannel
from twisted.web.resource import Resource
from twisted.web.server import Site

from scrapy_openclaw._condensed import CondensedWarnings

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from twisted.web.http_headers import Headers

logger = logging.getLogger(__name__)

#: ``(status, JSON body, extra headers)`` to answer instead of reading the request.
Refusal = tuple[int, dict[str, Any], dict[bytes, bytes]]
#: Judges a request by ``(method, path, headers, declared body length or None)``.
Guard = Callable[[bytes, bytes, "Headers", "int | None"], "Refusal | None"]

#: The largest body any request to this port may declare (a control command is a few hundred bytes).
MAX_BODY = 64 * 1024
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})
#: Warnings about refused requests, condensed (a client can send thousands); the control API's too.
refusal_warnings = CondensedWarnings(logger, every=60.0)


def summarise_refusals(**kwargs: Any) -> int:
    """Log the refusals counted but not yet logged (when the endpoint closes); how many lines."""
    return refusal_warnings.summarise(**kwargs)


def host_name(header: bytes) -> str:
    """The name in a ``Host`` header, without port or brackets, lower case."""
    text = header.decode("latin-1").strip().lower()
    if text.startswith("["):
        return text[1:].partition("]")[0]
    if text.count(":") == 1:
        return text.partition(":")[0]
    return text


def host_guard(listen_host: str, allowed: Iterable[str] = ()) -> Guard:
    """Refuse a ``Host`` *name* that is not loopback, this machine's name, the listening host or
    in *allowed*.

    Addresses are always accepted: a page reached by its IP address has that
    address as its origin, so it cannot rebind a name to us.
    """
    names = LOOPBACK_NAMES | {listen_host.lower(), socket.gethostname().lower()} | {h.lower() for h in allowed}

    def guard(method: bytes, path: bytes, headers: Headers, length: int | None) -> Refusal | None:
        given = headers.getRawHeaders(b"host") or []
        if not given:
            return None  # (HTTP/1.0 clients, curl --http1.0: no browser sends a request without one)
        name = host_name(given[0])
        if name in names or name.endswith(".localhost") or _is_address(name):
            return None
        refusal_warnings.warn(
            "host",
            "Refused a request for Host %(host)r on the metrics port (a DNS-rebinding page?); "
            "add the name to OPENCLAW_ALLOWED_HOSTS if it is yours",
            {"host": name[:100]},
        )
        return 421, {"ok": False, "error": "Host not allowed (see OPENCLAW_ALLOWED_HOSTS)"}, {}

    return guard


def body_guard(method: bytes, path: bytes, headers: Headers, length: int | None) -> Refusal | None:
    """Refuse a body larger than :data:`MAX_BODY`, or of a length not declared (chunked), unread."""
    if length is None and headers.getRawHeaders(b"transfer-encoding"):
        return 411, {"ok": False, "error": "a body needs a Content-Length"}, {}
    if length is not None and length > MAX_BODY:
        refusal_warnings.warn(
            "body", "Refused a %(n)d-byte body on the metrics port (at most %(max)d)", {"n": length, "max": MAX_BODY}
        )
        return 413, {"ok": False, "error": f"body larger than {MAX_BODY} bytes"}, {}
    return None


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class GuardedChannel(HTTPChannel):
    """An HTTP channel that asks the site's guards once the headers are in, before the body.

    A refused request is answered at once and the connection closed; nothing
    more it sends is parsed or stored.
    """

    _refused = False

    def allHeadersReceived(self) -> None:
        request = self.requests[-1]
        # (the request line as HTTPChannel parsed it: Twisted 21-26 keep it in these attributes)
        method, path = getattr(self, "_command", b""), getattr(self, "_path", b"")
        for guard in getattr(getattr(self, "site", None), "guards", ()):
            refusal = guard(method, path, request.requestHeaders, self.length)
            if refusal is not None:
                self._refuse(*refusal)
                return
        super().allHeadersReceived()

    def _refuse(self, status: int, data: dict[str, Any], headers: dict[bytes, bytes]) -> None:
        self._refused = True
        body = json.dumps(data, sort_keys=True).encode("utf-8")
        head = [b"HTTP/1.1 %d %s" % (status, RESPONSES.get(status, b"Refused"))]
        extra = {b"Content-Type": b"application/json", b"Cache-Control": b"no-store", **headers}
        head += [b"%s: %s" % item for item in extra.items()]
        head += [b"Content-Length: %d" % len(body), b"Connection: close"]
        transport: Any = self.transport
        transport.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
        self.loseConnection()

    def lineReceived(self, line: bytes) -> None:
        if not self._refused:
            super().lineReceived(line)

    def rawDataReceived(self, data: bytes) -> None:
        if not self._refused:
            super().rawDataReceived(data)

    def allContentReceived(self) -> None:
        if not self._refused:
            super().allContentReceived()


class QuietSite(Site):
    """A Site without access logging (Prometheus scrapes would flood the log), with guards."""

    noisy = False
    protocol = GuardedChannel  # type: ignore[assignment]  # (HTTP/1.1 only: no HTTP/2 negotiation here)

    def __init__(self, resource: Any, guards: Iterable[Guard] = ()):
        super().__init__(resource)
        self.guards = tuple(guards)

    def log(self, request: Any) -> None:
        pass


def serve_metrics(
    reactor: Any,
    port: int,
    host: str,
    registry: CollectorRegistry,
    *,
    children: dict[bytes, Any] | None = None,
    allowed_hosts: Iterable[str] = (),
) -> Any:
    """Listen on *host*:*port* serving *registry* at ``/metrics`` (and *children* beside it);
    the listening port, or CannotListenError for the caller to report.

    A child with a ``guard`` method is asked for requests under its path before they are read.

    The page is rendered on a thread of its own (``_own_threads``), not in the reactor's pool
    that ``prometheus_client.twisted.MetricsResource`` uses: that pool also runs the project's
    blocking work (scrapy-redis's ``RedisPipeline`` pushes each item there), and while Redis
    is away its threads all wait, which would leave ``/metrics`` unanswered just when it matters.
    """
    from prometheus_client.exposition import make_wsgi_app
    from twisted.web.wsgi import WSGIResource

    threads = _own_threads(reactor)
    root = Resource()
    metrics: Any = WSGIResource(reactor, threads, make_wsgi_app(registry))  # (mypy cannot see zope interfaces)
    root.putChild(b"metrics", metrics)
    guards = [host_guard(host, allowed_hosts)]
    for name, child in (children or {}).items():
        root.putChild(name, child)
        if hasattr(child, "guard"):
            guards.append(_under(b"/" + name, child.guard))
    guards.append(body_guard)
    try:
        listening = reactor.listenTCP(port, QuietSite(root, guards), interface=host)
    except Exception:
        _stop(threads)
        raise
    stop_listening = listening.stopListening

    def stop() -> Any:  # (the port and its thread end together)
        _stop(threads)
        return stop_listening()

    listening.stopListening = stop
    return listening


def _own_threads(reactor: Any) -> ThreadPool:
    """One thread for the ``/metrics`` page, stopped with its port or the reactor."""
    threads = ThreadPool(minthreads=0, maxthreads=1, name="openclaw-metrics")
    threads.start()
    reactor.addSystemEventTrigger("during", "shutdown", _stop, threads)
    return threads


def _stop(threads: ThreadPool) -> None:
    if threads.started:
        threads.stop()


def _under(prefix: bytes, guard: Guard) -> Guard:
    def scoped(method: bytes, path: bytes, headers: Headers, length: int | None) -> Refusal | None:
        bare = path.split(b"?", 1)[0]
        if bare == prefix or bare.startswith(prefix + b"/"):
            return guard(method, path, headers, length)
        return None

    return scoped
