"""Site memory: what the controller learned about each domain outlives the crawl.

The next crawl that meets a domain starts at the pace an earlier one measured
instead of slow start, so it does not cross the site's limit again to find it.
``docs/site-memory.md`` is the manual.
"""

from scrapy_openclaw.sites.entry import SiteEntry
from scrapy_openclaw.sites.extension import SiteMemoryExtension
from scrapy_openclaw.sites.store import FileSiteStore, RedisSiteStore, SiteStoreError, open_store

__all__ = ["FileSiteStore", "RedisSiteStore", "SiteEntry", "SiteMemoryExtension", "SiteStoreError", "open_store"]
