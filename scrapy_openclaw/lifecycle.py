"""RequestLifecycle: when a request is queued, in flight, and truly finished.

Scrapy has no "finished" signal, and ``request_scheduled`` fires before the
offsite filter, a not-before hold and the duplicate filter may still veto the
request. Components that must not lose work (the checkpoint, the distributed
lease acknowledgements) listen here instead.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from scrapy import signals

from scrapy_openclaw.exceptions import OpenClawConfigError
from scrapy_openclaw.runtime import shared
from scrapy_openclaw.scrapy_internals import engine_of, scheduler_of, track_engine_requests

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

Listener = Callable[["Request"], None]
EnqueueListener = Callable[["Request", bool], None]
Admit = Callable[["Request"], bool]


class RequestLifecycle:
    """Calls ``on_started(request)`` / ``on_finished(request)`` listeners from the engine slot.

    The slot's ``remove_request`` (an engine internal, see
    :func:`~scrapy_openclaw.scrapy_internals.track_engine_requests`) comes only after the
    download, the callback or errback, the scheduling of every request it yielded and the
    pipelines of every item. A spider middleware sees the end of the callback's generator
    instead, which under the asyncio reactor precedes that scheduling (and it never sees
    errbacks). The scheduler's ``enqueue_request``, wrapped on the engine's instance, says
    whether a request really entered the queue (``on_enqueued``) after ``admit`` listeners
    may refuse it (the engine then sends ``request_dropped``), so a duplicate costs a
    listener nothing; :meth:`held` reports a request kept out of the queue until its
    not-before time. Without those hooks :meth:`install` refuses rather than lose requests.
    One per crawler (:meth:`for_crawler`): every listener sees the same hook.
    """

    def __init__(self, crawler: Crawler):
        self.crawler = crawler
        self.installed = False
        self._users: list[str] = []
        self._started: list[Listener] = []
        self._finished: list[Listener] = []
        self._enqueued: list[EnqueueListener] = []
        self._held: list[Listener] = []
        self._admit: list[Admit] = []
        # spider_opened: the slot exists, no request has left the scheduler yet
        crawler.signals.connect(self._on_signal, signal=signals.spider_opened)
        crawler.signals.connect(self._on_signal, signal=signals.engine_started)

    @classmethod
    def for_crawler(cls, crawler: Crawler) -> RequestLifecycle:
        return shared(crawler, "request_lifecycle", lambda: cls(crawler))

    def listen(
        self,
        user: str,
        *,
        on_started: Listener | None = None,
        on_finished: Listener | None = None,
        on_enqueued: EnqueueListener | None = None,
        on_held: Listener | None = None,
        admit: Admit | None = None,
    ) -> None:
        """Register listeners; *user* (e.g. a setting name) is named if the hook is refused.

        Call before the spider opens: the hooks are installed then, and only
        those some listener needs.
        """
        self._users.append(user)
        pairs: tuple[tuple[list[Any], Any], ...] = (
            (self._started, on_started),
            (self._finished, on_finished),
            (self._enqueued, on_enqueued),
            (self._held, on_held),
            (self._admit, admit),
        )
        for listeners, listener in pairs:
            if listener is not None:
                listeners.append(listener)

    def held(self, request: Request) -> None:
        """A request is kept out of the scheduler for now (it will be scheduled again later)."""
        self._notify(self._held, request)

    def install(self) -> None:
        """Hook the engine slot (idempotent); OpenClawConfigError if this Scrapy has no such hook."""
        if self.installed:
            return
        engine = engine_of(self.crawler)
        needs_queue = bool(self._enqueued or self._admit)
        scheduler = scheduler_of(engine)
        if (needs_queue and not hasattr(scheduler, "enqueue_request")) or not track_engine_requests(
            engine,
            lambda request: self._notify(self._started, request),
            lambda request: self._notify(self._finished, request),
        ):
            users = ", ".join(dict.fromkeys(self._users)) or "scrapy_openclaw"
            raise OpenClawConfigError(
                f"{users}: this Scrapy version's engine has no slot add_request/remove_request"
                f"{' or scheduler' if needs_queue else ''}; cannot track queued, in-flight and "
                "finished requests"
            )
        if needs_queue:
            self._hook_scheduler(scheduler)
        self.installed = True

    def _hook_scheduler(self, scheduler: Any) -> None:
        enqueue = scheduler.enqueue_request
        admit, enqueued = self._admit, self._enqueued

        def enqueue_request(request: Request) -> bool:
            for check in admit:
                if not check(request):
                    return False
            accepted = bool(enqueue(request))
            self._notify(enqueued, request, accepted)
            return accepted

        scheduler.enqueue_request = enqueue_request

    def _on_signal(self, **kwargs: Any) -> None:
        if self._users:
            self.install()

    def _notify(self, listeners: list[Any], request: Request, *args: Any) -> None:
        for listener in listeners:
            try:
                listener(request, *args)
            except Exception:
                logger.exception(
                    "Request lifecycle listener %(listener)r failed for %(request)s",
                    {"listener": listener, "request": request},
                    extra={"spider": self.crawler.spider},
                )
