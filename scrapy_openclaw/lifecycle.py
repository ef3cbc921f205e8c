"""RequestLifecycle: when a request is in flight, and when it is truly finished.

Scrapy signals say when a request is scheduled, dropped or downloaded, but
none says "finished". The engine's slot knows: it calls ``add_request`` when
a request leaves the scheduler and ``remove_request`` only after the
download, the callback or errback, every request the callback yielded has
been scheduled, and every item has been through the pipelines. A spider
middleware sees the end of the callback's generator instead, which under the
asyncio reactor comes *before* the requests it yielded are scheduled (and it
never sees errbacks), so components that must not lose work (the checkpoint,
the distributed lease acknowledgements) listen here.

``add_request`` / ``remove_request`` are engine internals (present in Scrapy
2.14 .. 2.19). Without them the lifecycle refuses (:class:`OpenClawConfigError`
naming the components that need it) rather than silently lose requests.
One per crawler: every listener sees the same hook, installed once.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable

from scrapy import signals

from scrapy_openclaw.errors import OpenClawConfigError
from scrapy_openclaw.runtime import shared

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

Listener = Callable[["Request"], None]


class RequestLifecycle:
    """Calls ``on_started(request)`` / ``on_finished(request)`` listeners from the engine slot."""

    def __init__(self, crawler: Crawler):
        self.crawler = crawler
        self.installed = False
        self._users: list[str] = []
        self._started: list[Listener] = []
        self._finished: list[Listener] = []
        # spider_opened: the slot exists, no request has left the scheduler yet
        crawler.signals.connect(self._on_signal, signal=signals.spider_opened)
        crawler.signals.connect(self._on_signal, signal=signals.engine_started)

    @classmethod
    def for_crawler(cls, crawler: Crawler) -> RequestLifecycle:
        return shared(crawler, "request_lifecycle", lambda: cls(crawler))

    def listen(
        self, user: str, *, on_started: Listener | None = None, on_finished: Listener | None = None
    ) -> None:
        """Register listeners; *user* (e.g. a setting name) is named if the hook is refused."""
        self._users.append(user)
        if on_started is not None:
            self._started.append(on_started)
        if on_finished is not None:
            self._finished.append(on_finished)

    def install(self) -> None:
        """Hook the engine slot (idempotent); OpenClawConfigError if this Scrapy has no such hook."""
        if self.installed:
            return
        engine = self.crawler.engine
        slot = getattr(engine, "_slot", None) or getattr(engine, "slot", None)
        if slot is None or not hasattr(slot, "add_request") or not hasattr(slot, "remove_request"):
            users = ", ".join(dict.fromkeys(self._users)) or "scrapy_openclaw"
            raise OpenClawConfigError(
                f"{users}: this Scrapy version's engine has no slot add_request/remove_request; "
                "cannot track in-flight and finished requests"
            )
        add, remove = slot.add_request, slot.remove_request

        def add_request(request: Request) -> None:
            add(request)
            self._notify(self._started, request)

        def remove_request(request: Request) -> None:
            try:
                self._notify(self._finished, request)
            finally:  # the slot must forget it whatever a listener did, or the spider never closes
                remove(request)

        slot.add_request = add_request
        slot.remove_request = remove_request
        self.installed = True

    def _on_signal(self, **kwargs: Any) -> None:
        if self._users:
            self.install()

    def _notify(self, listeners: list[Listener], request: Request) -> None:
        for listener in listeners:
            try:
                listener(request)
            except Exception:
                logger.exception(
                    "Request lifecycle listener %(listener)r failed for %(request)s",
                    {"listener": listener, "request": request},
                    extra={"spider": self.crawler.spider},
                )
