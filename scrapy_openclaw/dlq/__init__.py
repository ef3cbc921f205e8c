"""Dead-letter queue: the pipeline that stores dead letters, and the stores."""

from scrapy_openclaw.dlq.pipeline import DeadLetterPipeline
from scrapy_openclaw.dlq.stores import (
    DeadLetterStore,
    Filters,
    JsonlStore,
    RedisStore,
    default_uri,
    open_store,
)

__all__ = [
    "DeadLetterPipeline",
    "DeadLetterStore",
    "Filters",
    "JsonlStore",
    "RedisStore",
    "default_uri",
    "open_store",
]
