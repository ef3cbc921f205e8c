# settings.py of a distributed project that keeps scrapy-redis's own item pipeline
ITEM_PIPELINES = {
    "scrapy_redis.pipelines.RedisPipeline": 300,
    "scrapy_openclaw.distributed.pipelines.RedisItemPipeline": None,  # keep theirs
}
