"""Distributed crawls on scrapy-redis: leased queue, shared politeness, safe serialisation.

``OPENCLAW_DISTRIBUTED = True`` plus scrapy-redis's ``REDIS_URL``: the add-on calls
:func:`configure`, which selects scrapy-redis's scheduler (our subclass) and
dupefilter with our leased deadline queue, JSON serializer and Redis health registry,
at ``"addon"`` priority so a project's own settings win (docs/distributed.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

    from scrapy_openclaw.settings import OpenClawSettings

__all__ = [
    "DOWNLOADER_ACK_MIDDLEWARE",
    "HEALTH_REGISTRY",
    "ITEM_PIPELINE",
    "QUEUE",
    "SCHEDULER",
    "SERIALIZER",
    "configure",
]

SCHEDULER = "scrapy_openclaw.distributed.scheduler.OpenClawRedisScheduler"
QUEUE = "scrapy_openclaw.distributed.queue.LeasedDeadlineQueue"
SERIALIZER = "scrapy_openclaw.distributed.serializer"
DUPEFILTER = "scrapy_redis.dupefilter.RFPDupeFilter"
HEALTH_REGISTRY = "scrapy_openclaw.distributed.health.RedisHealthRegistry"
DOWNLOADER_ACK_MIDDLEWARE = "scrapy_openclaw.distributed.middleware.LeaseAckDownloaderMiddleware"
#: scrapy-redis's item pipeline, and ours in its place (items written once, with their page's ack)
THEIR_ITEM_PIPELINE = "scrapy_redis.pipelines.RedisPipeline"
ITEM_PIPELINE = "scrapy_openclaw.distributed.pipelines.RedisItemPipeline"


def redis_params() -> dict:
    """Client parameters: short timeouts and a few quick retries (redis-py ``Retry``).

    Calls run on the Redis thread during a crawl (``link.py``); longer outages
    are handled by the queue (buffered writes, backoff).
    """
    from redis.backoff import ExponentialBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError
    from redis.retry import Retry

    return {
        "socket_timeout": 10,
        "socket_connect_timeout": 2,
        "retry": Retry(ExponentialBackoff(cap=0.2, base=0.02), 2),
        "retry_on_error": [RedisConnectionError, RedisTimeoutError],
        "health_check_interval": 10,
    }


def configure(settings: BaseSettings, config: OpenClawSettings) -> None:
    """Switch a crawl's settings (*config*, validated) to distributed mode (called by the add-on)."""
    from scrapy.utils.misc import load_object

    settings.set("SCHEDULER", SCHEDULER, "addon")
    settings.set("SCHEDULER_QUEUE_CLASS", QUEUE, "addon")
    settings.set("SCHEDULER_SERIALIZER", SERIALIZER, "addon")
    settings.set("DUPEFILTER_CLASS", DUPEFILTER, "addon")
    # the queue is the checkpoint: never wipe it when one worker closes
    settings.set("SCHEDULER_PERSIST", True, "addon")
    settings.set("OPENCLAW_HEALTH_REGISTRY_CLASS", HEALTH_REGISTRY, "addon")
    if not settings.getdict("REDIS_PARAMS"):
        settings.set("REDIS_PARAMS", redis_params(), "addon")
    if not config.dlq_uri:
        url = settings.get("REDIS_URL")
        if url:
            settings.set("OPENCLAW_DLQ_URI", url, "addon")
    # (the class, not its path: Scrapy compares it with the entries already there, so a project's own
    # entry for it, by path or class, wins)
    ack_middleware = load_object(DOWNLOADER_ACK_MIDDLEWARE)
    settings.setdefault_in_component_priority_dict("DOWNLOADER_MIDDLEWARES", ack_middleware, 1)
    _replace_item_pipeline(settings)


def _replace_item_pipeline(settings: BaseSettings) -> None:
    """scrapy-redis's ``RedisPipeline`` (that class, not a subclass) gives way to ours at its
    order, unless the project lists ours itself (``None``: keep theirs)."""
    from scrapy.utils.misc import load_object

    pipelines = settings.getdict("ITEM_PIPELINES")
    theirs, ours = load_object(THEIR_ITEM_PIPELINE), load_object(ITEM_PIPELINE)
    loaded = {(_loaded(k) if isinstance(k, str) else k): (k, v) for k, v in pipelines.items()}
    if theirs not in loaded or ours in loaded or loaded[theirs][1] is None:
        return
    key, order = loaded[theirs]
    del pipelines[key]
    pipelines[ours] = order
    settings.set("ITEM_PIPELINES", pipelines, settings.getpriority("ITEM_PIPELINES") or 0)


def _loaded(path: str) -> object:
    """The class at *path*; the path itself when it does not load (Scrapy says so at start)."""
    from scrapy.utils.misc import load_object

    try:
        return load_object(path)
    except (ImportError, NameError, ValueError):
        return path
