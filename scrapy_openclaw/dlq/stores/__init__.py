"""Where dead letters live: an append-only JSON-lines file or a Redis stream.

Both stores share one small interface (:class:`DeadLetterStore`) so that the
pipeline and the ``scrapy openclaw-dlq`` command work on either. Records are
:meth:`DeadLetter.to_dict` data, never pickle. A replay marks its
records in place (``replayed_at``, ``replay_outcome``: :meth:`~DeadLetterStore.update`,
for a file an atomic rewrite: temp file, fsync, rename); older stores' separate
"replayed" mark lines are still read. Only ``purge`` removes records.

The interface and filters are in :mod:`.base`, the backends in :mod:`.jsonl`
and :mod:`.redis_stream`, and :func:`open_store` (URI -> store) in
:mod:`.factory`; every name stays importable from here.
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
