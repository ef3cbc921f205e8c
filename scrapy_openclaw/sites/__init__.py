"""Site memory: what the controller learned about each domain outlives the crawl.

At close (and every ``OPENCLAW_SITES_SAVE_INTERVAL`` seconds) the
:class:`SiteMemoryExtension` keeps, per domain, the measured limit and burst,
the latency baseline, the robots.txt Crawl-delay, whether it banned and how it
signals its limit; the next crawl that meets the domain starts at that pace
instead of slow start. Kept in ``<project>/openclaw-data/sites.json`` (signed,
bounded, aging out), in Redis in distributed mode; ``scrapy openclaw-sites``
lists, shows and forgets entries. ``docs/site-memory.md`` is the manual.
"""

from scrapy_openclaw.sites.entry import SiteEntry
from scrapy_openclaw.sites.extension import SiteMemoryExtension
from scrapy_openclaw.sites.store import FileSiteStore, RedisSiteStore, SiteStoreError, open_store

__all__ = ["FileSiteStore", "RedisSiteStore", "SiteEntry", "SiteMemoryExtension", "SiteStoreError", "open_store"]
