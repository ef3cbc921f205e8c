"""What a request read back from storage may be: its scheme, its meta keys, and callbacks that name
the spider's own public methods (never Spider API, private or special methods).

Stored requests come from Redis, dead letters and checkpoint files, all of
which someone else may have written.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy_openclaw.exceptions import RefusedRequest
from scrapy_openclaw.runtime import shared
from scrapy_openclaw.settings import DEFAULTS, OpenClawSettings

if TYPE_CHECKING:
    from collections.abc import Iterable

    from scrapy import Request, Spider

#: Callbacks Scrapy's own spider classes give their requests (CrawlSpider rules,
#: SitemapSpider); every other name a Scrapy or scrapy-redis base class defines
#: is Spider API (``start``, ``close``, ``from_crawler``, ...), never a callback.
FRAMEWORK_CALLBACKS = frozenset({"parse", "parse_start_url", "_callback", "_errback", "_parse_sitemap"})
#: Hooks Scrapy calls by name that a spider may define itself.
SPIDER_HOOKS = frozenset(
    {
        "start",
        "start_requests",
        "closed",
        "close",
        "from_crawler",
        "update_settings",
        "handles_request",
        "set_crawler",
        "make_requests_from_url",
        "log",
        "logger",
    }
)
_FRAMEWORK_PACKAGES = ("scrapy", "scrapy_redis")


@functools.lru_cache(maxsize=256)
def _framework_names(cls: type) -> frozenset[str]:
    names: set[str] = set()
    for base in cls.__mro__:
        if base.__module__.partition(".")[0] in _FRAMEWORK_PACKAGES:
            names.update(vars(base))
    return frozenset(names)


def _check_callback(name: Any, spider: Spider | None, which: str, url: str) -> None:
    """A stored callback must name one of the spider's own public methods (or a Scrapy rule callback)."""

    def refuse(why: str) -> RefusedRequest:
        return RefusedRequest(f"request {url}: {which} {name!r} refused: {why}", kind="callback", url=url)

    if not isinstance(name, str) or not name.isidentifier():
        raise refuse("not a method name")
    if name not in FRAMEWORK_CALLBACKS:
        if name.startswith("_"):
            raise refuse("private and special methods are never callbacks")
        # (as a plain ``type``: mypy finds ``type[Spider]`` unhashable for lru_cache, python/mypy#11470)
        spider_cls: type = type(spider)
        if name in SPIDER_HOOKS or (spider is not None and name in _framework_names(spider_cls)):
            raise refuse("a Spider API method, not a callback")
    if spider is None:
        return
    # looked up without running any code (a property, a descriptor)
    static = inspect.getattr_static(spider, name, None)
    if not inspect.isfunction(static) or name in vars(spider):
        raise refuse("not a method of the spider")


@dataclass(frozen=True)
class StoredRequestRules:
    """What a request read back from storage may be: settings ``OPENCLAW_STORED_*``."""

    schemes: frozenset[str]
    meta_deny: frozenset[str]

    @classmethod
    def from_config(cls, config: OpenClawSettings) -> StoredRequestRules:
        return cls.of(config.stored_schemes, config.stored_meta_deny)

    @classmethod
    def of(cls, schemes: Iterable[str], meta_deny: Iterable[str]) -> StoredRequestRules:
        return cls(frozenset(str(s).lower() for s in schemes), frozenset(str(k) for k in meta_deny))

    @classmethod
    def for_spider(cls, spider: Spider | None) -> StoredRequestRules:
        crawler = getattr(spider, "crawler", None)
        if crawler is None:
            return _default_rules()
        config = OpenClawSettings.for_crawler(crawler)
        return shared(crawler, "stored_request_rules", lambda: cls.from_config(config))

    def check(self, request: Request) -> None:
        """Raise :class:`RefusedRequest` if *request* must not be sent."""
        scheme = request.url.partition(":")[0].lower()
        if scheme not in self.schemes:
            raise RefusedRequest(
                f"request {request.url}: scheme {scheme!r} refused (OPENCLAW_STORED_SCHEMES: "
                f"{', '.join(sorted(self.schemes))})",
                kind="scheme",
                url=request.url,
            )
        denied = sorted(k for k in request.meta if k in self.meta_deny)
        if denied:
            raise RefusedRequest(
                f"request {request.url}: meta key(s) {', '.join(denied)} refused (OPENCLAW_STORED_META_DENY)",
                kind="meta",
                url=request.url,
            )


@functools.lru_cache(maxsize=1)
def _default_rules() -> StoredRequestRules:
    return StoredRequestRules.of(DEFAULTS["OPENCLAW_STORED_SCHEMES"], DEFAULTS["OPENCLAW_STORED_META_DENY"])
