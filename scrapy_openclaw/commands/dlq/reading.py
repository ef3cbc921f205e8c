"""Opening the dead-letter store(s) a command reads, and the filters it reads them with.

A URI with ``%(name)s`` and no ``--spider`` means every spider's store of the
project, read as one (:class:`_Stores`); an unreachable store becomes a
message, not a traceback.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from scrapy.exceptions import UsageError

from scrapy_openclaw.commands.dlq.text import parse_time
from scrapy_openclaw.dlq.stores import (
    DeadLetterStore,
    Filters,
    JsonlStore,
    default_uri,
    open_store,
)
from scrapy_openclaw.redact import mask_uri

if TYPE_CHECKING:
    import argparse

    from scrapy.crawler import CrawlerProcessBase
    from scrapy.settings import Settings

    from scrapy_openclaw.deadletter import DeadLetter
    from scrapy_openclaw.settings import OpenClawSettings


def _store_errors() -> tuple[type[BaseException], ...]:
    """What an unreachable or unreadable store raises: a message, not a traceback."""
    try:
        from redis.exceptions import RedisError
    except ImportError:
        return (OSError,)
    return (OSError, RedisError)


def _where(stores: list[DeadLetterStore], uri: str) -> str:
    """The real places several stores read as one are, for messages (never a ``%(name)s`` template)."""
    if not stores:
        return mask_uri(uri.replace("%(name)s", "*"))
    return ", ".join(store.uri for store in stores)


class _Stores(DeadLetterStore):
    """Several stores read as one (one file per spider under a ``%(name)s`` URI)."""

    def __init__(self, stores: list[DeadLetterStore], uri: str):
        self.stores, self.uri = stores, uri

    @property
    def skipped(self) -> dict[str, str]:
        return {where: why for store in self.stores for where, why in store.skipped.items()}

    def append(self, record: DeadLetter) -> None:  # pragma: no cover - read-only view
        raise NotImplementedError

    def iter(self, filters: Filters = Filters()) -> Any:
        for store in self.stores:
            yield from store.iter(filters)

    def replayed(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for store in self.stores:
            out.update(store.replayed())
        return out

    def mark_replayed(self, ids: Any) -> int:
        ids = list(ids)
        return sum(store.mark_replayed(ids) for store in self.stores)

    def update(self, records: Any) -> int:
        records = list(records)
        return sum(store.update(records) for store in self.stores)

    def purge(self, filters: Filters = Filters()) -> int:
        return sum(store.purge(filters) for store in self.stores)

    def close(self) -> None:
        for store in self.stores:
            store.close()


class StoreAccess:
    """Part of the openclaw-dlq command: the store(s) it reads, the filters, the skipped-record warning.

    A plain mixin (not a ``ScrapyCommand``, so that Scrapy's command discovery
    never lists it); ``Command`` supplies ``settings`` (and ``config``, them validated) and ``exitcode``.
    """

    settings: Settings | None
    config: OpenClawSettings
    exitcode: int
    crawler_process: CrawlerProcessBase | None
    _uri: str

    def _filters(
        self, opts: argparse.Namespace, *, spider: str | None = None, include_replayed: bool = True
    ) -> Filters:
        return Filters(
            domain=opts.domain,
            error_class=opts.error_class,
            spider=spider or opts.spider,
            since=parse_time(opts.since, "--since") if opts.since else None,
            until=parse_time(opts.until, "--until") if opts.until else None,
            include_replayed=include_replayed,
        )

    def _open(self, opts: argparse.Namespace, spider: str | None = None) -> DeadLetterStore:
        assert self.settings is not None
        uri = opts.uri or default_uri(self.config.dlq_uri)
        self._uri = uri  # error snapshots live beside it
        spider = spider or opts.spider
        try:
            if spider is not None or "%(" not in uri:
                return open_store(uri, spider=spider)
            from scrapy.spiderloader import get_spider_loader

            stores: list[DeadLetterStore] = []
            for name in sorted(get_spider_loader(self.settings).list()):
                store = open_store(uri, spider=name)
                if isinstance(store, JsonlStore) and not store.path.exists():
                    continue
                stores.append(store)
            return _Stores(stores, _where(stores, uri))
        except ValueError as exc:
            raise UsageError(str(exc), print_help=False) from None

    def _report_skipped(self, store: DeadLetterStore) -> int:
        """Say how many unreadable records were skipped (each was logged); returns the count."""
        n = len(store.skipped)
        if n:
            print(
                f"warning: skipped {n} unreadable dead-letter record(s) in {store.uri} "
                "(each is named in a warning above)",
                file=sys.stderr,
            )
        return n
