"""One way to serve Prometheus ``/metrics`` from the Twisted reactor (the crawl's and the scheduler's)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.web.resource import Resource
from twisted.web.server import Site

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry


class QuietSite(Site):
    """A Site without access logging: Prometheus scrapes would flood the log."""

    noisy = False

    def log(self, request: Any) -> None:
        pass


def serve_metrics(
    reactor: Any, port: int, host: str, registry: CollectorRegistry, *, children: dict[bytes, Any] | None = None
) -> Any:
    """Listen on *host*:*port* serving *registry* at ``/metrics`` (and *children* beside it);
    the listening port, or CannotListenError for the caller to report."""
    from prometheus_client.twisted import MetricsResource  # (imports the global reactor: installed by now)

    root = Resource()
    metrics: Any = MetricsResource(registry=registry)  # (an IResource: mypy cannot see zope interfaces)
    root.putChild(b"metrics", metrics)
    for name, child in (children or {}).items():
        root.putChild(name, child)
    return reactor.listenTCP(port, QuietSite(root), interface=host)
