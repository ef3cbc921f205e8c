"""The dead-letter record: one stable, versioned, JSON-safe format.

The retry middleware, the deadline queue and the dead-letter pipeline build
records with :func:`for_request` / :func:`for_item`; stores write
:meth:`DeadLetter.to_dict` and read :meth:`DeadLetter.from_dict`.
"""

from __future__ import annotations

import time
import traceback as tb
import uuid
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from scrapy import Request as ScrapyRequest
from twisted.python.failure import Failure

from scrapy_openclaw import meta as M
from scrapy_openclaw.scrapy_internals import is_robots_request, slot_key
from scrapy_openclaw.serialization import SerializationError, encode_value, request_to_data

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response

    from scrapy_openclaw.errors import Classification

FORMAT_VERSION = 1


def domain_of(crawler: Crawler | None, url: str, request: Request | None = None) -> str:
    """A dead letter's ``domain``: its request's download-slot key, what "domain" means across
    this package (health rows, queue, metrics labels, the report). A record without a request
    (an item, a refused or unrestorable entry) gets the key a request for its URL would get."""
    if request is None:
        try:
            request = ScrapyRequest(url)
        except ValueError:  # (not a URL a request can carry: no slot, its host name if any)
            return urlparse(url).hostname or ""
    return slot_key(crawler, request)


@dataclass
class DeadLetter:
    url: str
    domain: str  # see domain_of
    error_class: str  # an ErrorClass value, or "deadline" / "retry_budget"
    reason: str
    spider: str
    crawl_id: str
    method: str = "GET"
    status: int | None = None
    attempts: int = 1
    exception_type: str | None = None
    exception_message: str | None = None
    traceback: str | None = None
    first_attempt_at: float | None = None
    last_attempt_at: float | None = None
    request: dict[str, Any] | None = None  # serialisation.request_to_data, for replay
    item: Any = None
    validation_error: str | None = None
    replayed_at: float | None = None  # when a replay last sent it (or skipped it as a duplicate)
    replay_outcome: str | None = None  # sent / recovered / failed / duplicate
    replays: int = 0  # how many replays sent it
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created_at: float = field(default_factory=time.time)
    version: int = FORMAT_VERSION

    #: Not stored: the id of the dead letter this request replays (``meta[openclaw_replay_of]``),
    #: and whether the request is Scrapy's own work (robots.txt, ``NO_CALLBACK``), never stored.
    replay_of = None  # type: str | None  # (a type comment, no annotation: not a dataclass field)
    internal = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeadLetter:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


#: Meta keys the engine and our own components set on every request: bookkeeping of
#: one attempt, never stored in a dead letter and never carried by a replay.
ENGINE_META = frozenset(
    {
        "download_slot",
        "download_latency",
        "download_timeout",
        "depth",
        "retry_times",
        "redirect_times",
        "redirect_ttl",
        "redirect_urls",
        "redirect_reasons",
        "_slot",
        M.RETRY_STATE,
        M.NOT_BEFORE,
        M.FAILURE_SCOPE,
        M.LEASE,
        M.REPLAY_OF,
    }
)


def is_internal(request: Request) -> bool:
    """Scrapy's own request (robots.txt, an ``engine.download`` with ``NO_CALLBACK``), not the spider's work."""
    from scrapy.http.request import NO_CALLBACK

    return request.callback is NO_CALLBACK or is_robots_request(request)


def _exception_fields(exc: BaseException | Failure | None) -> dict[str, Any]:
    if exc is None:
        return {}
    if isinstance(exc, Failure):
        return {
            "exception_type": exc.type.__name__ if exc.type else None,
            "exception_message": str(exc.value)[:2000],
            "traceback": exc.getTraceback()[-8000:],
        }
    return {
        "exception_type": type(exc).__name__,
        "exception_message": str(exc)[:2000],
        "traceback": "".join(tb.format_exception(type(exc), exc, exc.__traceback__))[-8000:],
    }


def for_request(
    request: Request,
    *,
    spider: Spider,
    crawl_id: str,
    error_class: str,
    reason: str,
    status: int | None = None,
    exception: BaseException | Failure | None = None,
    attempts: int | None = None,
) -> DeadLetter:
    """A dead letter for a request that was given up on."""
    state = request.meta.get(M.RETRY_STATE) or {}
    if attempts is None:
        attempts = 1 + sum((state.get("attempts") or {}).values())
    internal = is_internal(request)
    try:
        data = None if internal else request_to_data(request, spider=spider)
    except SerializationError:
        data = None  # still recorded, but not replayable
    if data is not None and isinstance(data.get("meta"), dict):
        data["meta"] = {k: v for k, v in data["meta"].items() if k not in ENGINE_META}
    letter = DeadLetter(
        url=request.url,
        domain=domain_of(getattr(spider, "crawler", None), request.url, request),
        error_class=str(error_class),
        reason=reason,
        spider=spider.name,
        crawl_id=crawl_id,
        method=request.method,
        status=status,
        attempts=attempts,
        first_attempt_at=state.get("first"),
        last_attempt_at=state.get("last", time.time()),
        request=data,
        **_exception_fields(exception),
    )
    letter.internal = internal
    replay_of = request.meta.get(M.REPLAY_OF)
    letter.replay_of = replay_of if isinstance(replay_of, str) else None
    return letter


def for_classified(
    request: Request,
    classification: Classification,
    *,
    spider: Spider,
    crawl_id: str,
    exception: BaseException | Failure | None = None,
) -> DeadLetter:
    return for_request(
        request,
        spider=spider,
        crawl_id=crawl_id,
        error_class=classification.error_class.value,
        reason=classification.reason,
        status=classification.status,
        exception=exception,
    )


def for_item(
    item: Any,
    *,
    spider: Spider,
    crawl_id: str,
    exception: BaseException | Failure,
    response: Response | None = None,
) -> DeadLetter:
    """A dead letter for an item that failed validation in a pipeline (under the response's URL
    and its request's domain, when Scrapy passes the response)."""
    from itemadapter import ItemAdapter

    try:
        item_data = encode_value(ItemAdapter(item).asdict(), "item")
    except (SerializationError, TypeError):
        item_data = repr(item)[:4000]
    url = response.url if response is not None else ""
    request = getattr(response, "request", None)
    fields_ = _exception_fields(exception)
    return DeadLetter(
        url=url,
        domain=domain_of(getattr(spider, "crawler", None), url, request) if url else "",
        error_class="business",
        reason=fields_.get("exception_type") or "validation",
        spider=spider.name,
        crawl_id=crawl_id,
        item=item_data,
        validation_error=fields_.get("exception_message"),
        **fields_,
    )
