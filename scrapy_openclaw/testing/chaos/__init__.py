"""A deterministic, misbehaving HTTP site for proving crawl behaviour.

Every host is its own loopback address (127.0.0.2, 127.0.0.3, ...), so Scrapy sees
distinct domains and download slots. Faults come from configuration and a seeded
RNG, and the site records what it really served (the *ground truth*), so tests
assert on facts rather than on wall-clock guesses. Every name is importable here.
"""

from scrapy_openclaw.testing.chaos.cli import _install_asyncio_reactor as _install_asyncio_reactor
from scrapy_openclaw.testing.chaos.cli import main
from scrapy_openclaw.testing.chaos.config import _PAGE_RE as _PAGE_RE
from scrapy_openclaw.testing.chaos.config import _REASONS as _REASONS
from scrapy_openclaw.testing.chaos.config import (
    BAN_MARKER,
    BAN_PAGE,
    BAN_TITLE,
    CONTROL_PATHS,
    DROP,
    HANG,
    ROBOTS_PATH,
    ChaosConfig,
    FailWindows,
    HostConfig,
    RateLimit,
)
from scrapy_openclaw.testing.chaos.graph import (
    Reachable,
    busiest_second_bounds,
    max_in_window,
    page_links,
    page_path,
    reachable_urls,
)
from scrapy_openclaw.testing.chaos.graph import _page_fails_for_good as _page_fails_for_good
from scrapy_openclaw.testing.chaos.hosts import _act as _act
from scrapy_openclaw.testing.chaos.hosts import _error_body as _error_body
from scrapy_openclaw.testing.chaos.hosts import _Host as _Host
from scrapy_openclaw.testing.chaos.hosts import _HostResource as _HostResource
from scrapy_openclaw.testing.chaos.hosts import _Outcome as _Outcome
from scrapy_openclaw.testing.chaos.site import ChaosSite
from scrapy_openclaw.testing.chaos.site import _ChaosFactory as _ChaosFactory

__all__ = [
    "BAN_MARKER",
    "BAN_PAGE",
    "BAN_TITLE",
    "CONTROL_PATHS",
    "DROP",
    "HANG",
    "ROBOTS_PATH",
    "ChaosConfig",
    "ChaosSite",
    "FailWindows",
    "HostConfig",
    "RateLimit",
    "Reachable",
    "main",
    "busiest_second_bounds",
    "max_in_window",
    "page_links",
    "page_path",
    "reachable_urls",
]
