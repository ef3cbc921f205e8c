"""Error snapshots: the first few responses of each kind of failure, kept beside the dead letters.

A dead letter says what failed; a snapshot shows what the server actually sent.
Bodies are content-addressed, so the same data is never stored twice, and files
are written from a thread, so the reactor never waits on the disk
(docs/dead-letters.md, "Error snapshots").
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import NotConfigured
from twisted.python.failure import Failure

from scrapy_openclaw._files import atomic_write, is_temp, private_dir
from scrapy_openclaw.deadletter import is_internal
from scrapy_openclaw.dlq.stores import default_uri, expand_uri
from scrapy_openclaw.dlq.stores.factory import store_path
from scrapy_openclaw.errors import ErrorTaxonomy
from scrapy_openclaw.paths import resolve_path
from scrapy_openclaw.redact import MASK, mask_uri
from scrapy_openclaw.retry.middleware import spider_handles_status
from scrapy_openclaw.runtime import peek, shared
from scrapy_openclaw.scrapy_internals import slot_key
from scrapy_openclaw.settings import OpenClawSettings, crawl_id

if TYPE_CHECKING:
    from collections.abc import Iterator

    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response

    from scrapy_openclaw.deadletter import DeadLetter
    from scrapy_openclaw.errors import Classification

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
SHARED_KEY = "error_snapshots"
STATS_PREFIX = "openclaw/snapshots"
#: Header values never stored (their names are kept, the values masked).
SECRET_HEADERS = frozenset(
    {
        "set-cookie",
        "cookie",
        "authorization",
        "proxy-authorization",
        "www-authenticate",
        "x-api-key",
        "x-auth-token",
        "x-csrf-token",
    }
)
_TRIES_PER_SLOT = 4  # a signature whose answers are all alike stops being hashed after this x count


def signature(error_class: str, status: int | None, exception_type: str | None, domain: str) -> tuple[str, ...]:
    return (str(error_class), "" if status is None else str(int(status)), exception_type or "", domain)


def signature_of(record: DeadLetter) -> tuple[str, ...]:
    """A dead letter's signature, as its snapshots were filed."""
    return signature(record.error_class, record.status, record.exception_type, record.domain)


def _sig_id(sig: tuple[str, ...]) -> str:
    return hashlib.sha256("\0".join(sig).encode("utf-8")).hexdigest()[:16]


def snapshot_dir(config: OpenClawSettings, spider: str, dlq_uri: str | None = None) -> Path:
    """``OPENCLAW_SNAPSHOT_DIR``, else ``snapshots/`` beside the spider's dead-letter file
    (*dlq_uri*, else ``OPENCLAW_DLQ_URI``; for a Redis store: beside where its file would be,
    ``<project>/openclaw-data/<spider>/``). Relative paths resolve as every path setting
    (:mod:`scrapy_openclaw.paths`)."""
    own = config.snapshot_dir
    if own:
        return resolve_path(expand_uri(str(own), spider), setting="OPENCLAW_SNAPSHOT_DIR")
    path = store_path(expand_uri(default_uri(dlq_uri or config.dlq_uri), spider))
    if path is None:  # a Redis store
        path = store_path(expand_uri(default_uri(), spider))
        assert path is not None
    return path.parent / "snapshots"


def _redact_headers(headers: Any) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name, values in (headers or {}).items():
        key = name.decode("latin-1") if isinstance(name, bytes) else str(name)
        if not isinstance(values, (list, tuple)):
            values = [values]
        texts = [v.decode("latin-1") if isinstance(v, bytes) else str(v) for v in values]
        out[key] = [MASK] * len(texts) if key.lower() in SECRET_HEADERS else [mask_uri(t) for t in texts]
    return out


def _redact_body(body: bytes) -> bytes:
    # latin-1 maps bytes to text one to one; masking only rewrites ASCII, so binary survives
    return mask_uri(body.decode("latin-1")).encode("latin-1")


class ErrorSnapshots:
    """The crawl's snapshot store: decides on the reactor thread, writes from a thread."""

    def __init__(self, crawler: Crawler):
        config = OpenClawSettings.for_crawler(crawler)
        self.crawler = crawler
        self.count = config.snapshot_count
        self.max_bytes = config.snapshot_max_bytes
        self.directory: Path | None = None
        self._seen: dict[tuple[str, ...], set[str]] = defaultdict(set)  # signature -> content hashes
        self._tries: dict[tuple[str, ...], int] = defaultdict(int)
        self._writing: list[Any] = []
        crawler.signals.connect(self.spider_closed, signal=signals.spider_closed)

    @classmethod
    def for_crawler(cls, crawler: Crawler) -> ErrorSnapshots:
        return shared(crawler, SHARED_KEY, lambda: cls(crawler))

    def _open(self) -> Path:
        if self.directory is None:
            spider = self.crawler.spider
            self.directory = snapshot_dir(
                OpenClawSettings.for_crawler(self.crawler), spider.name if spider else "default"
            )
            for meta in iter_snapshots(self.directory):  # earlier crawls' snapshots count too
                self._seen[tuple(meta["signature"])].add(meta["content_hash"])
        return self.directory

    def capture(
        self,
        classification: Classification,
        request: Request,
        *,
        response: Response | None = None,
        exception: BaseException | Failure | None = None,
    ) -> None:
        """Keep this failure's answer if its signature has fewer than ``count`` distinct ones."""
        if self.count <= 0:
            return
        if isinstance(exception, Failure):
            exception = exception.value
        domain = slot_key(self.crawler, request)
        exc_type = type(exception).__name__ if exception is not None else None
        sig = signature(classification.error_class.value, classification.status, exc_type, domain)
        seen = self._room_for(sig)
        if seen is None:
            return
        directory = self._open()
        body = b"" if response is None else response.body
        stored = _redact_body(body[: self.max_bytes])
        headers = _redact_headers(response.headers if response is not None else {})
        status = response.status if response is not None else None
        message = mask_uri(str(exception))[:2000] if exception is not None else None
        # what makes two answers the same: status, body and error message (headers such as
        # Date differ on every answer; the first answer's are kept)
        content = hashlib.sha256(json.dumps([status, message]).encode() + b"\0" + stored)
        content_hash = content.hexdigest()
        if content_hash in seen:
            self.crawler.stats.inc_value(f"{STATS_PREFIX}/duplicates")
            return
        seen.add(content_hash)
        body_hash = hashlib.sha256(stored).hexdigest()
        meta = {
            "version": FORMAT_VERSION,
            "signature": list(sig),
            "content_hash": content_hash,
            "error_class": classification.error_class.value,
            "reason": classification.reason,
            "status": status,
            "exception_type": exc_type,
            "exception_message": message,
            "domain": domain,
            "url": mask_uri(request.url),
            "method": request.method,
            "headers": headers,
            "body_file": f"bodies/{body_hash}" if response is not None else None,
            "body_bytes": len(stored),
            "body_total": len(body),
            "truncated": len(body) > len(stored),
            "captured_at": time.time(),
            "spider": self.crawler.spider.name if self.crawler.spider else None,
            "crawl_id": crawl_id(self.crawler),
        }
        self.crawler.stats.inc_value(f"{STATS_PREFIX}/written")
        self._write_later(directory, meta, stored if response is not None else None, body_hash)

    def _room_for(self, sig: tuple[str, ...]) -> set[str] | None:
        """The signature's kept content hashes if it may keep one more (and this try counts), else None."""
        seen = self._seen[sig] if self.directory is not None else None
        if seen is not None and len(seen) >= self.count:
            return None  # the common case once a signature is full: one dict lookup
        if self._tries[sig] >= self.count * _TRIES_PER_SLOT:
            return None
        self._tries[sig] += 1
        self._open()
        seen = self._seen[sig]
        return seen if len(seen) < self.count else None

    def _write_later(self, directory: Path, meta: dict[str, Any], body: bytes | None, body_hash: str) -> None:
        d = _in_thread(_write, directory, meta, body, body_hash)
        self._writing.append(d)

        def done(result: Any) -> None:
            self._writing.remove(d)
            if isinstance(result, Failure):
                self.crawler.stats.inc_value(f"{STATS_PREFIX}/errors")
                logger.error(
                    "Cannot write an error snapshot to %(dir)s: %(error)s", {"dir": directory, "error": result.value}
                )

        d.addBoth(done)

    async def spider_closed(self, spider: Any = None, reason: str = "") -> None:
        """Wait for the snapshots still being written."""
        from scrapy.utils.defer import maybe_deferred_to_future
        from twisted.internet.defer import DeferredList

        if self._writing:
            await maybe_deferred_to_future(DeferredList(list(self._writing), consumeErrors=True))
        if self.directory is not None and self.crawler.stats.get_value(f"{STATS_PREFIX}/written"):
            logger.info("Error snapshots in %(dir)s", {"dir": self.directory}, extra={"spider": spider})


def _in_thread(func: Any, *args: Any) -> Any:
    """A Deferred for ``func(*args)`` run in a thread: asyncio's default executor when asyncio
    runs the crawl (the asyncio reactor, or no reactor at all), else the reactor's thread pool."""
    from scrapy.utils.asyncio import is_asyncio_available

    if is_asyncio_available():
        import asyncio

        from twisted.internet.defer import Deferred

        return Deferred.fromFuture(asyncio.ensure_future(asyncio.to_thread(func, *args)))
    from twisted.internet import threads

    return threads.deferToThread(func, *args)


def _write(directory: Path, meta: dict[str, Any], body: bytes | None, body_hash: str) -> None:
    """(In a thread.) The body once per content, then the snapshot's metadata."""
    private_dir(directory, setting="OPENCLAW_SNAPSHOT_DIR")
    private_dir(directory / "bodies")
    if body is not None:
        path = directory / "bodies" / body_hash
        if not path.exists():  # content-addressed: the same body is stored once
            atomic_write(path, body)
    name = f"{_sig_id(tuple(meta['signature']))}-{meta['content_hash'][:24]}.json"
    atomic_write(directory / name, json.dumps(meta, sort_keys=True, indent=1).encode("utf-8"))


def iter_snapshots(directory: Path) -> Iterator[dict[str, Any]]:
    """Every readable snapshot in *directory* (its metadata, with ``path``); unreadable ones skipped."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return
    for name in names:
        if not name.endswith(".json") or is_temp(name):
            continue
        path = directory / name
        try:
            if path.stat().st_size > 4 * 1024 * 1024:
                continue
            meta = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(meta, dict) or meta.get("version") != FORMAT_VERSION:
            continue
        sig, content = meta.get("signature"), meta.get("content_hash")
        if not (
            isinstance(sig, list)
            and len(sig) == 4
            and all(isinstance(s, str) for s in sig)
            and isinstance(content, str)
        ):
            continue
        meta["path"] = str(path)
        body = meta.get("body_file")
        meta["body_path"] = (
            str(directory / body)
            if isinstance(body, str) and body.startswith("bodies/") and "/" not in body[7:] and ".." not in body
            else None
        )
        yield meta


def snapshots_by_signature(directory: Path) -> dict[tuple[str, ...], list[dict[str, Any]]]:
    out: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
    for meta in iter_snapshots(directory):
        out[tuple(meta["signature"])].append(meta)
    for metas in out.values():
        metas.sort(key=lambda m: m.get("captured_at") or 0)
    return dict(out)


class ErrorSnapshotMiddleware:
    """Downloader middleware (order 570): snapshots of failed responses and download errors."""

    def __init__(self, crawler: Crawler):
        self.taxonomy = ErrorTaxonomy.for_crawler(crawler)
        self.snapshots = ErrorSnapshots.for_crawler(crawler)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> ErrorSnapshotMiddleware:
        if OpenClawSettings.for_crawler(crawler).snapshot_count <= 0:
            raise NotConfigured
        return cls(crawler)

    def process_response(self, request: Request, response: Response) -> Response:
        # Not Scrapy's own downloads (robots.txt) nor a status the spider asked for: not failures.
        if response.status >= 400 and not is_internal(request) and not self._handled(request, response):
            classification = self.taxonomy.classify_status(response.status)
            if classification is not None:
                self.snapshots.capture(classification, request, response=response)
        return response

    def process_exception(self, request: Request, exception: Exception) -> None:
        classification = self.taxonomy.classify_download_error(exception)
        if classification is not None and not is_internal(request):
            self.snapshots.capture(classification, request, exception=exception)

    def _handled(self, request: Request, response: Response) -> bool:
        spider = self.snapshots.crawler.spider
        return spider is not None and spider_handles_status(request, response, spider)


class ParseErrorSnapshotMiddleware:
    """Spider middleware (order 46, before the parse retry at 45): the page a callback could not parse."""

    def __init__(self, crawler: Crawler):
        self.crawler = crawler
        self.taxonomy = ErrorTaxonomy.for_crawler(crawler)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> ParseErrorSnapshotMiddleware:
        if OpenClawSettings.for_crawler(crawler).snapshot_count <= 0:
            raise NotConfigured
        return cls(crawler)

    def process_spider_exception(self, response: Response, exception: BaseException, spider: Any = None) -> None:
        classification = self.taxonomy.classify_callback_error(exception)
        if classification is not None and response.request is not None:
            snapshots = peek(self.crawler, SHARED_KEY) or ErrorSnapshots.for_crawler(self.crawler)
            snapshots.capture(classification, response.request, response=response, exception=exception)
        return None
