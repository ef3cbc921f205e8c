"""DeadLetterPipeline: every request or item given up on lands in a store.

Dead letters arrive two ways: whatever gives up on a request (retry, ban
detection, a given-up domain, the local or Redis queue, a checkpoint restore)
sends :data:`scrapy_openclaw.signals.dead_letter` with a ready record, and items
dropped with a validation error (Scrapy's ``item_dropped``) become records here.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import NotConfigured
from scrapy.utils.asyncio import call_later, create_looping_call
from scrapy.utils.defer import deferred_from_coro, maybe_deferred_to_future

from scrapy_openclaw import deadletter
from scrapy_openclaw import signals as openclaw_signals
from scrapy_openclaw._files import private_dir
from scrapy_openclaw.dlq.stores import JsonlStore, RedisStore, default_uri, expand_uri, open_store
from scrapy_openclaw.errors import ErrorTaxonomy
from scrapy_openclaw.exceptions import OpenClawConfigError, UnsafeDirectory
from scrapy_openclaw.paths import crawl_path
from scrapy_openclaw.redact import mask_uri
from scrapy_openclaw.runtime import peek
from scrapy_openclaw.settings import OpenClawSettings, crawl_id

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from twisted.python.failure import Failure

    from scrapy_openclaw.deadletter import DeadLetter
    from scrapy_openclaw.dlq.stores import DeadLetterStore

logger = logging.getLogger(__name__)

ALERT_REASON = "openclaw_dlq_threshold"
#: How long close waits for an unreachable Redis before saving the buffer to a file.
CLOSE_RETRY_SECONDS = 10.0


class DeadLetterPipeline:
    """Item pipeline (``ITEM_PIPELINES``, order 1000 in the add-on) writing dead letters.

    Stats: ``openclaw/dlq/count``, ``openclaw/dlq/<error class>``,
    ``openclaw/dlq/alert`` (1 once a threshold is exceeded),
    ``openclaw/dlq/buffered`` / ``openclaw/dlq/fallback`` (Redis outages).
    """

    def __init__(self, crawler: Crawler):
        self.crawler = crawler
        config = OpenClawSettings.for_crawler(crawler)
        self.uri_template = default_uri(config.dlq_uri)
        self.fsync_interval = config.checkpoint_flush
        self.alert_count = config.dlq_alert_count
        self.alert_ratio = config.dlq_alert_ratio
        self.alert_min_requests = config.dlq_alert_min_requests
        self.alert_close = config.dlq_alert_close
        self.taxonomy = ErrorTaxonomy.for_crawler(crawler)
        self.store: DeadLetterStore | None = None
        self._early: list[DeadLetter] = []  # arrived before the spider opened
        self._unwritten: list[DeadLetter] = []  # the store failed (e.g. disk full); retried
        self.written = 0
        self._proxies_reported: set[str] = set()
        self.alerted = False
        self._closing: Any = None
        self._sync_loop: Any = None
        crawler.signals.connect(self.on_dead_letter, signal=openclaw_signals.dead_letter)
        crawler.signals.connect(self.on_item_dropped, signal=signals.item_dropped)
        crawler.signals.connect(self.spider_closed, signal=signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> DeadLetterPipeline:
        if not OpenClawSettings.for_crawler(crawler).dlq_enabled:
            raise NotConfigured
        return cls(crawler)

    @property
    def _spider(self) -> Spider:
        spider = self.crawler.spider
        assert spider is not None  # (the engine opens the spider before any pipeline call or signal)
        return spider

    # item pipeline ----------------------------------------------------------

    def open_spider(self, spider: Spider | None = None) -> None:
        name = self._spider.name
        try:
            self.store = open_store(
                self.uri_template, spider=name, fsync_interval=self.fsync_interval, schedule=call_later
            )
            if isinstance(self.store, JsonlStore):  # refused at start: a symlink, or a directory open to others
                private_dir(self.store.path.parent)
        except ValueError as exc:
            raise OpenClawConfigError(f"setting OPENCLAW_DLQ_URI: {exc}") from None
        self._sync_loop = create_looping_call(self._sync)
        self._sync_loop.start(max(self.fsync_interval, 0.1), now=False)
        early, self._early = self._early, []
        for record in early:
            self._write(record)

    # (no process_item: items pass by untouched, and Scrapy skips a pipeline without one)

    # signals ----------------------------------------------------------------

    def on_dead_letter(self, dead_letter: DeadLetter, **kwargs: Any) -> None:
        if dead_letter.internal:  # robots.txt and other Scrapy-internal downloads
            self.crawler.stats.inc_value("openclaw/dlq/internal_ignored")
            return
        if dead_letter.replay_of is not None:
            from scrapy_openclaw.dlq.replay import PLAN_KEY

            plan = peek(self.crawler, PLAN_KEY)
            if plan is not None and plan.failed_again(dead_letter):
                self.crawler.stats.inc_value("openclaw/dlq/replay_failed")
                return
        if dead_letter.status == 407:
            self._name_the_proxy(dead_letter)
        if self.store is None:
            self._early.append(dead_letter)
            return
        self._write(dead_letter)

    def _name_the_proxy(self, record: DeadLetter) -> None:
        """A 407 is the proxy's answer, not the site's: say which proxy (once per proxy in the log)."""
        proxy = proxy_of(record)
        if proxy is None:
            return
        message = f"proxy {proxy} refused authentication (HTTP 407 Proxy Authentication Required)"
        record.exception_message = message
        self.crawler.stats.inc_value("openclaw/dlq/proxy_auth_refused")
        if proxy not in self._proxies_reported:
            self._proxies_reported.add(proxy)
            logger.error(
                "%(message)s for %(url)s; its requests become dead letters (check the proxy credentials)",
                {"message": message, "url": mask_uri(record.url)},
                extra={"spider": self.crawler.spider},
            )

    def on_item_dropped(
        self,
        item: Any,
        exception: BaseException | Failure,
        response: Response | None = None,
        **kwargs: Any,
    ) -> None:
        if self.taxonomy.classify_item_error(exception) is None:
            return  # a plain DropItem (duplicates, filters) is not a failure
        record = deadletter.for_item(
            item,
            spider=self._spider,
            crawl_id=crawl_id(self.crawler),
            exception=exception,
            response=response,
        )
        self.on_dead_letter(record)

    def _write(self, record: DeadLetter) -> None:
        assert self.store is not None
        if self._unwritten or not self._append(record):
            self._unwritten.append(record)  # kept, in order, until the store takes it
        self.written += 1
        stats = self.crawler.stats
        stats.inc_value("openclaw/dlq/count")
        stats.inc_value(f"openclaw/dlq/{record.error_class}")
        logger.debug(
            "Dead letter %(id)s (%(cls)s, %(reason)s): %(url)s",
            {"id": record.id, "cls": record.error_class, "reason": record.reason, "url": mask_uri(record.url)},
            extra={"spider": self.crawler.spider},
        )
        self._check_alert()

    def _append(self, record: DeadLetter) -> bool:
        """Append, or log and return False if the store fails (disk full, permissions).

        An unreachable Redis never fails here: the Redis store buffers itself.
        """
        assert self.store is not None
        try:
            self.store.append(record)
        except (OSError, UnsafeDirectory) as exc:
            logger.error(
                "Cannot write dead letter %(id)s to %(uri)s: %(error)s; kept in memory, will retry",
                {"id": record.id, "uri": self.store.uri, "error": exc},
                extra={"spider": self.crawler.spider},
            )
            return False
        return True

    def _retry_unwritten(self) -> None:
        while self._unwritten and self._append(self._unwritten[0]):
            self._unwritten.pop(0)

    def _sync(self) -> None:
        if self.store is not None:
            self._retry_unwritten()
            try:
                self.store.sync()
            except OSError as exc:
                logger.error("Cannot sync dead letters to %(uri)s: %(error)s", {"uri": self.store.uri, "error": exc})
            if isinstance(self.store, RedisStore):
                self.crawler.stats.set_value("openclaw/dlq/buffered", self.store.pending())

    # alerting ---------------------------------------------------------------

    def _check_alert(self) -> None:
        if self.alerted:
            return
        why = None
        if self.alert_count and self.written >= self.alert_count:
            why = f"{self.written} dead letters >= OPENCLAW_DLQ_ALERT_COUNT={self.alert_count}"
        elif self.alert_ratio:
            requests = self.crawler.stats.get_value("downloader/request_count", 0) or 0
            if requests >= max(1, self.alert_min_requests) and self.written / requests > self.alert_ratio:
                why = (
                    f"{self.written} dead letters for {requests} requests > OPENCLAW_DLQ_ALERT_RATIO={self.alert_ratio}"
                )
        if why is None:
            return
        self.alerted = True
        self.crawler.stats.set_value("openclaw/dlq/alert", 1)
        logger.error(
            "Dead-letter threshold exceeded: %(why)s (store: %(uri)s)%(action)s",
            {
                "why": why,
                "uri": self.store.uri if self.store else self.uri_template,
                "action": "; closing the spider" if self.alert_close else "",
            },
            extra={"spider": self.crawler.spider},
        )
        if self.alert_close:
            self._closing = deferred_from_coro(self.crawler.engine.close_spider_async(reason=ALERT_REASON))

    # close ------------------------------------------------------------------

    async def spider_closed(self, spider: Spider, reason: str) -> None:
        """Flush (Redis: retry a while, then save leftovers to a file) and report.

        Done at ``spider_closed`` rather than in ``close_spider`` so that dead
        letters sent while the scheduler closes are still written.
        """
        if self._sync_loop is not None and self._sync_loop.running:
            self._sync_loop.stop()
        store = self.store
        if store is None:
            return
        self._retry_unwritten()
        for record in self._unwritten:  # last resort: what identifies it goes to the log (never its headers)
            logger.error(
                "Dead letter %(id)s could not be stored in %(uri)s: %(method)s %(url)s (%(cls)s, %(reason)s)",
                {
                    "id": record.id,
                    "uri": mask_uri(store.uri),
                    "method": record.method,
                    "url": mask_uri(record.url),
                    "cls": record.error_class,
                    "reason": record.reason,
                },
                extra={"spider": spider},
            )
        if isinstance(store, RedisStore):
            await self._flush_redis(store)
        try:
            store.close()
        except OSError as exc:
            logger.error("Cannot close dead-letter store %(uri)s: %(error)s", {"uri": store.uri, "error": exc})
        logger.info(
            "%(n)d dead letter(s) written to %(uri)s",
            {"n": self.written, "uri": store.uri},
            extra={"spider": spider},
        )

    async def _flush_redis(self, store: RedisStore) -> None:
        from twisted.internet.defer import Deferred

        waited, delay = 0.0, 0.25
        store.close()
        while store.pending() and waited < CLOSE_RETRY_SECONDS:  # bounded
            d: Deferred[None] = Deferred()
            call_later(delay, d.callback, None)
            await maybe_deferred_to_future(d)
            waited += delay
            delay = min(delay * 2, 2.0)
            store.close()
        if store.pending():
            checkpoint_dir = OpenClawSettings.for_crawler(self.crawler).checkpoint_dir
            fallback = JsonlStore(
                crawl_path(self.crawler, checkpoint_dir, setting="OPENCLAW_CHECKPOINT_DIR") / "deadletters.jsonl"
                if checkpoint_dir
                else expand_uri(default_uri(), self._spider.name)
            )
            n = store.drain_to(fallback)
            fallback.close()
            logger.error(
                "Dead-letter store %(uri)s still unreachable at close: saved %(n)d buffered "
                "record(s) to %(path)s instead",
                {"uri": store.uri, "n": n, "path": fallback.uri},
                extra={"spider": self.crawler.spider},
            )
            self.crawler.stats.set_value("openclaw/dlq/fallback", n)


def proxy_of(record: DeadLetter) -> str | None:
    """``host:port`` of the proxy a dead letter's request went through, if any."""
    from urllib.parse import urlsplit

    meta = (record.request or {}).get("meta")
    proxy = meta.get("proxy") if isinstance(meta, dict) else None
    if not isinstance(proxy, str) or not proxy:
        return None
    try:
        parts = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        return f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"
    except ValueError:
        return "(unparsable proxy URL)"
