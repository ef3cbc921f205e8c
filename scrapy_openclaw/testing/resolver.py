"""A Scrapy DNS resolver for tests and benchmarks that never asks the network.

It answers IP literals with themselves and names under ``.test`` (RFC 2606)
from the ``CHAOS_HOSTS`` setting (``{"a.test": "127.0.0.2", "dead.test":
None}``, None meaning "does not resolve"); every other name fails with
Twisted's ``DNSLookupError`` at once, so a crawl of a dead host is
reproducible and no query reaches the system resolver. Enable it with
:func:`resolver_settings`, which picks the setting name of the installed Scrapy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.internet import defer
from twisted.internet.abstract import isIPAddress, isIPv6Address
from twisted.internet.error import DNSLookupError
from twisted.internet.interfaces import IResolverSimple
from zope.interface import implementer

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

RESOLVER_PATH = "scrapy_openclaw.testing.resolver.LoopbackResolver"
HOSTS_SETTING = "CHAOS_HOSTS"
SUFFIX = ".test"


def _check_hosts(hosts: Mapping[str, Any]) -> dict[str, str | None]:
    checked: dict[str, str | None] = {}
    for name, address in hosts.items():
        key = str(name).lower().rstrip(".")
        if not key.endswith(SUFFIX):
            raise ValueError(f"{HOSTS_SETTING}: {name!r} must end in {SUFFIX!r} (a name that can never be real)")
        if address is not None and not isIPAddress(str(address)):
            raise ValueError(f"{HOSTS_SETTING}[{name!r}]: {address!r} is not an IPv4 address or None")
        checked[key] = None if address is None else str(address)
    return checked


@implementer(IResolverSimple)
class LoopbackResolver:
    """``TWISTED_DNS_RESOLVER`` (``DNS_RESOLVER`` on older Scrapy) for crawls of the chaos site."""

    def __init__(self, reactor: Any, hosts: Mapping[str, str | None]):
        self.reactor = reactor
        self.hosts = _check_hosts(hosts)

    @classmethod
    def from_crawler(cls, crawler: Any, reactor: Any) -> LoopbackResolver:
        # Scrapy passes its CrawlerProcess here; only ``.settings`` is read.
        return cls(reactor, crawler.settings.getdict(HOSTS_SETTING))

    def install_on_reactor(self) -> None:
        self.reactor.installResolver(self)

    def getHostByName(self, name: str, timeout: Sequence[int] = ()) -> defer.Deferred[str]:
        if isIPAddress(name) or isIPv6Address(name):
            return defer.succeed(name)
        address = self.hosts.get(name.lower().rstrip("."))
        if address is None:
            return defer.fail(DNSLookupError(f"{name}: not resolved (LoopbackResolver, {HOSTS_SETTING})"))
        return defer.succeed(address)


def resolver_settings(hosts: Mapping[str, str | None] | None = None) -> dict[str, Any]:
    """Settings that install :class:`LoopbackResolver` with ``hosts`` on the installed Scrapy."""
    from scrapy.settings import default_settings

    name = "TWISTED_DNS_RESOLVER" if hasattr(default_settings, "TWISTED_DNS_RESOLVER") else "DNS_RESOLVER"
    return {name: RESOLVER_PATH, HOSTS_SETTING: dict(_check_hosts(hosts or {}))}
