"""Every Scrapy internal we rely on (engine, scheduler, download slots, commands, exporters), in one module.

Scrapy has no public API for these; each helper was checked on Scrapy 2.14 .. 2.19
by ``tests/test_scrapy_internals.py``. "Domain" means :func:`slot_key`, the
download-slot key, so every component agrees when ``meta["download_slot"]`` or
``CONCURRENT_REQUESTS_PER_IP`` is set. (``pqueues/queuefile.py`` mirrors ``scrapy.pqueues._path_safe``.)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from functools import lru_cache
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse
from weakref import WeakKeyDictionary

import scrapy
import scrapy.exceptions
from scrapy import signals
from scrapy.core.downloader import Downloader
from scrapy.settings import SETTINGS_PRIORITIES

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.core.downloader import Slot
    from scrapy.core.engine import ExecutionEngine
    from scrapy.crawler import Crawler
    from scrapy.exporters import JsonItemExporter
    from scrapy.settings import BaseSettings
    from twisted.internet.defer import Deferred

#: The clock of ``downloader.Slot.lastseen``: ``time.time()`` in 2.14 and 2.15,
#: ``time.monotonic()`` since 2.16.
slot_clock: Callable[[], float] = time.monotonic if scrapy.version_info >= (2, 16) else time.time

_PAUSE_DELAY = 0.001  # a slot delay of 0 skips Scrapy's delay check, which a pause relies on


# --- the engine -------------------------------------------------------------


def engine_of(crawler: Crawler) -> ExecutionEngine | None:
    """``crawler.engine``, None before the crawl starts.

    2.14 .. 2.17 return None then; since 2.18 reading it raises RuntimeError.
    """
    try:
        return crawler.engine
    except RuntimeError:
        return None


def fail_bootstrap(crawler: Crawler) -> None:
    """Make the runner count *crawler* as failed to start (``scrapy crawl`` exits with status 1).

    Before the engine exists only. Scrapy 2.14 counts a start-up failure only
    by a missing ``crawler.spider`` (the spider is built before add-ons and
    components, so their errors exited 0); 2.19 also counts any exception.
    """
    if engine_of(crawler) is None:
        crawler.spider = None


def engine_slot(engine: ExecutionEngine | None) -> Any | None:
    """The engine's slot (``engine._slot``, 2.14 .. 2.19), None outside a crawl.

    It holds ``scheduler``, ``nextcall`` and ``add_request``/``remove_request``.
    """
    return getattr(engine, "_slot", None)


def scheduler_of(engine: ExecutionEngine | None) -> Any | None:
    """The engine's scheduler, None before the spider opened / after it closed.

    ``engine.scheduler`` is public since 2.19; ``engine._slot.scheduler`` in 2.14 .. 2.18.
    """
    scheduler = getattr(engine, "scheduler", None)
    if scheduler is None:
        scheduler = getattr(engine_slot(engine), "scheduler", None)
    return scheduler


def wake_engine(crawler: Crawler) -> None:
    """Ask the engine to pull from the scheduler now, not at its 5 s heartbeat.

    ``engine.crawl`` does this through ``engine._slot.nextcall.schedule()``
    (a ``CallLaterOnce``, 2.14 .. 2.19); we schedule the same call.
    """
    nextcall = getattr(engine_slot(engine_of(crawler)), "nextcall", None)
    if nextcall is not None:
        nextcall.schedule()


def start_requests_pending(engine: ExecutionEngine | None) -> bool:
    """Whether the engine still reads the spider's start requests (``engine._start``, the
    iterator of ``start()``, set to None once exhausted; 2.14 .. 2.19)."""
    return getattr(engine, "_start", None) is not None


def track_engine_requests(
    engine: ExecutionEngine | None,
    on_added: Callable[[Request], None],
    on_removed: Callable[[Request], None],
) -> bool:
    """Call *on_added* after the engine slot takes a request from the scheduler, and
    *on_removed* right before it forgets it; False when this engine has no such slot.

    ``_Slot.add_request`` / ``remove_request`` (2.14 .. 2.19): ``remove_request``
    runs only after the download, the callback or errback, the scheduling of
    every request the callback yielded and the pipelines of every item.
    """
    slot = engine_slot(engine)
    if slot is None or not hasattr(slot, "add_request") or not hasattr(slot, "remove_request"):
        return False
    add, remove = slot.add_request, slot.remove_request

    def add_request(request: Request) -> None:
        add(request)
        on_added(request)

    def remove_request(request: Request) -> None:
        try:
            on_removed(request)
        finally:  # the slot must forget it whatever a listener did, or the spider never closes
            remove(request)

    slot.add_request = add_request
    slot.remove_request = remove_request
    return True


# --- the downloader ---------------------------------------------------------


def slot_key(crawler: Crawler | None, request: Request) -> str:
    """The request's download-slot key: what this package calls its "domain".

    ``Downloader.get_slot_key`` (public; the same code in 2.14.2 and 2.19.0):
    ``meta["download_slot"]`` if set, else the URL's host name, resolved to
    its IP through ``scrapy.resolver.dnscache`` when ``ip_concurrency``
    (``CONCURRENT_REQUESTS_PER_IP``) is set. A subclassed downloader's own
    method is asked; for the stock one without ``ip_concurrency`` the same key
    is computed here, with the host names of recent URLs cached (components
    ask for a request's key ~9 times in its life, and ``urlparse_cached``
    would keep a parsed URL per pending request, ~400 bytes). Without a
    running engine (unit tests, before the crawl) it is the meta slot or the
    host name.
    """
    if crawler is not None:
        ask = _asks_downloader.get(crawler)
        if ask is None:
            ask = _decide_asking(crawler)
        engine = engine_of(crawler) if ask else None
        if engine is not None:
            return engine.downloader.get_slot_key(request)
    slot = request.meta.get(Downloader.DOWNLOAD_SLOT)
    return slot if slot is not None else _hostname(request.url)


#: Per crawler, once its engine runs: whether the downloader's own ``get_slot_key``
#: must be asked (a subclass, or ``ip_concurrency``) or the key is computed here.
_asks_downloader: WeakKeyDictionary[Crawler, bool] = WeakKeyDictionary()


def _decide_asking(crawler: Crawler) -> bool:
    downloader = getattr(engine_of(crawler), "downloader", None)
    if downloader is None:
        return False  # not decided before the engine runs
    ask = type(downloader).get_slot_key is not Downloader.get_slot_key or bool(downloader.ip_concurrency)
    _asks_downloader[crawler] = ask
    return ask


@lru_cache(maxsize=4096)
def _hostname(url: str) -> str:
    return urlparse(url).hostname or ""


def download_slot(crawler: Crawler, key: str) -> Slot | None:
    """The downloader's slot for *key* (``downloader.slots``, a dict, 2.14 .. 2.19), None if none yet."""
    return download_slots(crawler).get(key) if key else None


def free_downloads(crawler: Crawler) -> int:
    """Requests the downloader would take now (``total_concurrency`` less its ``active``
    requests, 2.14 .. 2.19); 0 before the engine exists."""
    downloader = getattr(engine_of(crawler), "downloader", None)
    if downloader is None:
        return 0
    return max(0, int(downloader.total_concurrency) - len(downloader.active))


def download_slots(crawler: Crawler) -> dict[str, Slot]:
    """The downloader's slots by key (``downloader.slots``, 2.14 .. 2.19); empty before the engine exists."""
    engine = engine_of(crawler)
    return engine.downloader.slots if engine is not None else {}


def new_slot_concurrency(downloader: Downloader, key: str) -> int:
    """The concurrency the downloader gives the slot it creates for *key* (``Downloader._get_slot``:
    ``DOWNLOAD_SLOTS``, else ``CONCURRENT_REQUESTS_PER_IP`` or ``_PER_DOMAIN``); 2.14 .. 2.19."""
    default = downloader.ip_concurrency or downloader.domain_concurrency
    return int(downloader.per_slot_settings.get(key, {}).get("concurrency", default))


def new_slot_delay(downloader: Downloader, key: str) -> float:
    """The delay the downloader gives the slot it creates for *key* (``Downloader._get_slot``):
    ``DOWNLOAD_SLOTS``' own, else ``downloader._delay`` (2.15 .. 2.19) or, in 2.14, the
    spider's ``download_delay`` or ``DOWNLOAD_DELAY`` (``_get_concurrency_delay``)."""
    own = downloader.per_slot_settings.get(key, {}).get("delay")
    if own is not None:
        return float(own)
    default = getattr(downloader, "_delay", None)
    if default is None:
        delay = downloader.settings.getfloat("DOWNLOAD_DELAY")
        default = getattr(downloader.crawler.spider, "download_delay", delay)
    return float(default if default is not None else 0.0)


def downloader_activity(engine: ExecutionEngine | None) -> tuple[int, dict[str, int]] | None:
    """Requests in the downloader (``downloader.active``, middlewares included) and
    per slot key (``slots[key].active``: queued for the slot or transferring); 2.14 .. 2.19."""
    downloader = getattr(engine, "downloader", None)
    if downloader is None:
        return None
    per_slot: dict[str, int] = {}
    for key, slot in list(downloader.slots.items()):
        per_slot[key] = per_slot.get(key, 0) + len(slot.active)
    return len(downloader.active), per_slot


def pause_slot(slot: Slot, until: float) -> None:
    """Keep a download slot from starting queued requests before *until* (UNIX time).

    Scrapy starts a slot's next queued request once ``delay`` has passed since
    ``lastseen`` (``Downloader._process_queue``, 2.14 .. 2.19; the clock is
    :data:`slot_clock`), so moving ``lastseen`` to the end of the hold pauses
    the slot; afterwards it resumes at its normal pace by itself.
    """
    slot.delay = max(slot.delay, _PAUSE_DELAY)
    slot.lastseen = max(slot.lastseen, slot_clock() + (until - time.time()))


def slot_paused(slot: Slot) -> bool:
    """Whether :func:`pause_slot` holds the slot now (its ``lastseen`` is in the future)."""
    return bool(slot.lastseen > slot_clock())


def resume_slot(slot: Slot, downloader: Downloader) -> None:
    """Undo :func:`pause_slot` at once (an operator released the hold early).

    The slot's queue waits on a timer Scrapy armed for the end of the pause
    (``slot.latercall``, which runs ``Downloader._latercall(slot)``, 2.14 ..
    2.19): it is cancelled and run now.
    """
    slot.lastseen = min(slot.lastseen, slot_clock())
    if slot.latercall is not None:
        slot.latercall.cancel()
        downloader._latercall(slot)


def drain_slot_queue(slot: Slot | None) -> Iterator[tuple[Request, Deferred[Any]]]:
    """Take every request waiting in a download slot's own queue, with the Deferred its
    download waits on (``slot.queue``, a ``deque[(request, deferred)]``, 2.14 .. 2.19).

    The caller must fire each Deferred (an errback drops the request).
    """
    queue = getattr(slot, "queue", None)
    while queue:
        yield queue.popleft()


# --- commands ---------------------------------------------------------------

#: The Scrapy commands that run a crawler to look at pages or test a spider, not to crawl.
INSPECTION_COMMANDS = frozenset({"fetch", "view", "shell", "parse", "check"})


def inspection_command(spidercls: type | None, settings: BaseSettings) -> str | None:
    """The Scrapy command (``fetch``, ``parse``, ``check``, ``shell``) that runs this crawler
    to look at pages, None for a crawl (``crawl``, ``runspider``, ``bench``, a script).

    ``fetch`` (and ``view``, its subclass), ``parse`` and ``check`` give the spider class a
    ``start`` of their own, defined in ``scrapy.commands.<name>``; ``shell`` is known by
    its ``default_settings`` (``LOGSTATS_INTERVAL = 0`` and a ``BaseDupeFilter`` at
    ``command`` priority). Checked on 2.14 .. 2.19; Scrapy does not name the command.
    """
    module = getattr(getattr(spidercls, "start", None), "__module__", None) or ""
    if module.startswith("scrapy.commands."):
        name = module.rpartition(".")[2]
        return name if name in INSPECTION_COMMANDS else None
    command = SETTINGS_PRIORITIES["command"]
    if (settings.getpriority("LOGSTATS_INTERVAL") == command and settings.getfloat("LOGSTATS_INTERVAL") == 0) or (
        settings.getpriority("DUPEFILTER_CLASS") == command
        and settings.get("DUPEFILTER_CLASS") == "scrapy.dupefilters.BaseDupeFilter"
    ):
        return "shell"
    return None


# --- exceptions, signals, exporters -----------------------------------------


def download_error_types(*names: str) -> tuple[type[BaseException], ...]:
    """Those of Scrapy's download exception types (``DownloadTimeoutError``,
    ``CannotResolveHostError``, ...) that this version has: added in 2.15."""
    found = (getattr(scrapy.exceptions, name, None) for name in names)
    return tuple(t for t in found if isinstance(t, type))


def tunnel_error() -> type[BaseException]:
    """The HTTP/1.1 handler's proxy ``CONNECT`` failure
    (``scrapy.core.downloader.handlers.http11.TunnelError``, 2.14 .. 2.19)."""
    from scrapy.core.downloader.handlers.http11 import TunnelError

    return TunnelError


#: The message of the ``IgnoreRequest`` by which ``RobotsTxtMiddleware`` refuses a request (2.14 .. 2.19).
def is_robots_request(request: Request) -> bool:
    """Whether *request* is ``RobotsTxtMiddleware``'s own fetch of a robots.txt."""
    return bool(request.meta.get("dont_obey_robotstxt")) and urlparse(request.url).path == "/robots.txt"


_ROBOTS_REFUSAL = "Forbidden by robots.txt"


def is_robots_refusal(exception: BaseException) -> bool:
    """Whether *exception* is ``RobotsTxtMiddleware`` refusing a request its robots.txt disallows."""
    return isinstance(exception, scrapy.exceptions.IgnoreRequest) and str(exception) == _ROBOTS_REFUSAL


def robots_parsed_signal() -> object | None:
    """``signals.robots_parsed`` (public since 2.18), None before."""
    return getattr(signals, "robots_parsed", None)


def continue_json_array(exporter: JsonItemExporter) -> None:
    """Make a JSON exporter that reopens a feed holding items write a comma before its
    next item (``JsonItemExporter.first_item``, 2.14 .. 2.19).

    The other feed export internals (``FeedExporter._start_new_batch``,
    ``FeedSlot`` attributes) are overridden and read by the subclass in
    :mod:`scrapy_openclaw.checkpoint.feeds`, notes at each use.
    """
    exporter.first_item = False
