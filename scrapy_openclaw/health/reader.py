"""The one way other components find the crawl's health registry, and what they may call on it.

The health middleware owns the registry (:class:`HealthRegistry`, or the class
``OPENCLAW_HEALTH_REGISTRY_CLASS`` names, e.g. the Redis one); the queue,
retries, metrics and the checkpoint read it through :func:`health_registry`,
typed by :class:`HealthReader`, so a registry class only has to offer these.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from scrapy.utils.conf import build_component_list

from scrapy_openclaw.health.registry import HealthRegistry
from scrapy_openclaw.runtime import shared
from scrapy_openclaw.settings import OpenClawSettings

if TYPE_CHECKING:
    from collections.abc import Container

    from scrapy.crawler import Crawler

    from scrapy_openclaw.health.registry import DomainState

HEALTH_MIDDLEWARE = "scrapy_openclaw.health.DomainHealthMiddleware"


class HealthReader(Protocol):
    """What the components other than the health middleware call on the registry."""

    #: seconds after which an idle domain may be forgotten; 0: never
    idle_ttl: float

    def domains(self) -> list[str]: ...
    def state(self, domain: str, now: float | None = None) -> DomainState: ...
    def blocked_until(self, domain: str, now: float | None = None) -> float: ...
    def ready_at(self, domain: str, now: float | None = None) -> float: ...
    def given_up(self, domain: str, now: float | None = None) -> bool: ...
    def try_acquire(self, domain: str, now: float | None = None, *, token: bool = True) -> bool: ...
    def evict_idle(self, now: float | None = None, keep: Container[str] = ()) -> list[str]: ...
    def bytes_per_domain(self, sample: int = 50) -> float: ...


def health_enabled(crawler: Crawler) -> bool:
    """Whether the health middleware runs in this crawl (``OPENCLAW_HEALTH_ENABLED`` and listed
    in ``DOWNLOADER_MIDDLEWARES``, by path or as a subclass named ``DomainHealthMiddleware``)."""
    if not OpenClawSettings.for_crawler(crawler).health_enabled:
        return False
    enabled = build_component_list(crawler.settings.getwithbase("DOWNLOADER_MIDDLEWARES"))
    names = {c if isinstance(c, str) else f"{c.__module__}.{c.__qualname__}" for c in enabled}
    return any(n == HEALTH_MIDDLEWARE or n.endswith(".DomainHealthMiddleware") for n in names)


def health_registry(crawler: Crawler) -> HealthReader | None:
    """The crawl's health registry when the health middleware runs, else None (every domain ready)."""
    if not shared(crawler, "health_enabled", lambda: health_enabled(crawler)):
        return None
    registry: Any = HealthRegistry.for_crawler(crawler)
    return registry
