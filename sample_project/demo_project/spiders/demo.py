"""The demo spider: crawls an embedded flaky site, or a real one.

``scrapy crawl demo`` starts a small chaos site inside Scrapy's own reactor
(three hosts on 127.0.0.2-4, port 8642: one with 503 windows and dropped
connections, one that rate-limits with 429 + Retry-After, one slow) and crawls
it. ``scrapy crawl demo -a url=https://example.com/`` crawls a real site
instead (staying on its domain, at most ``-a max_pages=100`` pages).
At the end it prints what scrapy-openclaw did, domain by domain (the figures
the log table, the stats and ``/metrics`` show), and this crawl's dead letters.

The site's port is fixed so that dead letters stay replayable: a later
``scrapy openclaw-dlq replay demo --all`` serves the same site at the same
addresses. ``-a port=0`` (or a port already taken: another demo running)
serves on free ports instead, and that crawl's dead letters point at ports
that close with it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlparse

import scrapy
from scrapy import signals
from scrapy.exceptions import CloseSpider
from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet.error import CannotListenError
from twisted.internet.threads import deferToThread

from scrapy_openclaw.dlq import JsonlStore, default_uri
from scrapy_openclaw.dlq.stores import expand_uri
from scrapy_openclaw.dlq.stores.factory import store_path
from scrapy_openclaw.metrics.figures import CrawlFigures
from scrapy_openclaw.runtime import peek
from scrapy_openclaw.settings import OpenClawSettings, crawl_id
from scrapy_openclaw.testing.chaos import ChaosConfig, ChaosSite, HostConfig

DEMO_SITE = ChaosConfig(
    hosts=(
        HostConfig(  # flaky: 503 for 2 s of every 6 s, a few dropped connections
            address="127.0.0.2",
            pages=40,
            fail_windows={"period": 6.0, "down": 2.0, "status": 503},
            drop_rate=0.03,
            not_found=(13,),
            parse_fail={7: 1},
        ),
        HostConfig(  # throttling: 6 req/s, then 429 with Retry-After
            address="127.0.0.3",
            pages=40,
            rate_limit={"rate": 6.0, "burst": 3, "retry_after": "1"},
        ),
        HostConfig(address="127.0.0.4", pages=20, latency=0.3, latency_jitter=0.1),
    ),
    seed=7,
)
#: The embedded site's port on each of its addresses (see the module docstring).
DEMO_PORT = 8642


def demo_site(port: int) -> ChaosSite:
    return ChaosSite(replace(DEMO_SITE, hosts=tuple(replace(host, port=port) for host in DEMO_SITE.hosts)))


class DemoSpider(scrapy.Spider):
    name = "demo"

    def __init__(self, url: str | None = None, max_pages: str = "100", port: str = str(DEMO_PORT), **kwargs):
        super().__init__(**kwargs)
        self.url = url
        self.max_pages = int(max_pages)
        self.port = int(port)
        self.site: ChaosSite | None = None
        self.site_port = 0
        self.pages: Counter[str] = Counter()

    @classmethod
    def from_crawler(cls, crawler, *args, **kwargs):
        spider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider.open_site, signal=signals.spider_opened)
        crawler.signals.connect(spider.closed_summary, signal=signals.spider_closed)
        return spider

    async def open_site(self, spider):
        """Serve the embedded site (also for a replay, which does not run :meth:`start`)."""
        if self.url:
            return
        site = demo_site(self.port)
        try:
            site.start()
        except CannotListenError as exc:
            await maybe_deferred_to_future(site.stop())
            self.logger.warning(
                "Cannot serve the demo site on port %(port)d (%(error)s; another demo running?): serving it on "
                "free ports; this crawl's dead letters will point at ports that close with it",
                {"port": self.port, "error": exc.socketError},
            )
            site = demo_site(0)
            site.start()
        self.site = site
        self.site_port = int(next(iter(site.urls.values())).rsplit(":", 1)[1].strip("/"))
        for base_url in site.urls.values():
            self.logger.info("Embedded demo site serving %s", base_url)

    async def start(self):
        if self.url:
            self.allowed_domains = [urlparse(self.url).hostname]
            yield scrapy.Request(self.url)
            return
        for base_url in self.site.urls.values() if self.site else ():
            yield scrapy.Request(base_url)

    def parse(self, response):
        title = response.css("h1#title::text").get() or response.css("title::text").get()
        if self.site is not None and not response.css("h1#title"):
            raise ValueError(f"no title on {response.url}")  # a parse error: retried
        host = urlparse(response.url).hostname
        self.pages[host] += 1
        if self.url and self.pages.total() > self.max_pages:
            raise CloseSpider("max_pages")
        yield {"url": response.url, "title": title, "host": host}
        yield from response.follow_all(css="a")

    async def closed_summary(self, spider, reason):
        """What scrapy-openclaw did, domain by domain: the figures of the log table and the report."""
        figures = CrawlFigures.for_crawler(self.crawler)
        figures.settle()
        registry = peek(self.crawler, "health")
        lines = [
            "",
            f"scrapy-openclaw demo finished ({reason})",
            f"{'domain':<16}{'done':>6}{'requests':>10}{'retries':>9}{'failed':>8}{'dead':>6}{'health':>8}  circuit",
        ]
        for domain, f in sorted(figures.domains.items()):
            state = registry.state(domain) if registry else None
            health = f"{state.health:>8.0f}  {state.circuit}" if state else f"{'-':>8}  -"
            lines.append(f"{domain:<16}{f.done:>6}{f.requests:>10}{f.retries:>9}{f.failures:>8}{f.dead:>6}{health}")
        lines.append(f"items: {self.crawler.stats.get_value('item_scraped_count', 0)}")
        dead = sum(f.dead for f in figures.domains.values())
        lines += await maybe_deferred_to_future(deferToThread(self._files_summary, dead))
        print("\n".join(lines), flush=True)
        if self.site is not None:
            await maybe_deferred_to_future(self.site.stop())

    def _files_summary(self, dead: int) -> list[str]:
        """Where this crawl's items and dead letters are (a thread: it reads the dead-letter file).

        The dead-letter file keeps every run's letters (a replay takes the newest per URL);
        this crawl's are the ones with its crawl id.
        """
        feeds = [Path(uri).absolute() for uri in self.settings.getdict("FEEDS") if "://" not in uri]
        lines = [f"items of this crawl: {feed}" for feed in feeds]
        path = store_path(expand_uri(default_uri(OpenClawSettings.for_crawler(self.crawler).dlq_uri), self.name))
        this_crawl = crawl_id(self.crawler)
        if path is None:
            return [*lines, f"dead letters of this crawl: {dead} (crawl id {this_crawl})"]
        letters = list(JsonlStore(path).iter()) if path.exists() else []
        earlier = sum(1 for letter in letters if letter.crawl_id != this_crawl)
        lines.append(f"dead letters: {dead} from this crawl (crawl id {this_crawl}) in {path}")
        if earlier:
            lines.append(f"  and {earlier} from earlier runs (a replay takes the newest per URL)")
        if self.site is not None and self.site_port != self.port:
            lines.append(f"  this crawl's letters point at port {self.site_port}, closed now: they cannot be replayed")
        elif dead or earlier:
            lines.append("  list them: scrapy openclaw-dlq list demo; replay: scrapy openclaw-dlq replay demo --all")
        return lines
