"""Where dead letters live: an append-only JSON-lines file or a Redis stream.

Both share one small interface (:class:`DeadLetterStore`, in :mod:`.base`), so the
pipeline and ``scrapy openclaw-dlq`` work on either; records are data, never
pickle, and only ``purge`` removes them. The backends are :mod:`.jsonl` and
:mod:`.redis_stream`, :func:`open_store` (URI -> store) is in :mod:`.factory`.
"""

from scrapy_openclaw.dlq.stores.base import ANY, DeadLetterStore, Filters
from scrapy_openclaw.dlq.stores.factory import default_uri, expand_uri, open_store
from scrapy_openclaw.dlq.stores.jsonl import MARK, JsonlStore
from scrapy_openclaw.dlq.stores.redis_stream import RedisStore

__all__ = [
    "ANY",
    "MARK",
    "DeadLetterStore",
    "Filters",
    "JsonlStore",
    "RedisStore",
    "default_uri",
    "expand_uri",
    "open_store",
]
