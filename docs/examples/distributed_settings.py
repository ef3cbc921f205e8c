# settings.py, on every worker (every worker also gets the same OPENCLAW_STORE_KEY)
ADDONS = {"scrapy_openclaw.Addon": 100}
OPENCLAW_DISTRIBUTED = True
REDIS_URL = "redis://redis.internal:6379/0"
