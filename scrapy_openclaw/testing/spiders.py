"""Spiders for crawling the chaos site (importable by a crawl subprocess)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import scrapy
from scrapy.utils.httpobj import urlparse_cached

if TYPE_CHECKING:
    from collections.abc import Iterator

    from scrapy.http import Response


class ChaosSpider(scrapy.Spider):
    """Scrapes every chaos page it can reach; a page without ``h1#title`` is a parse failure.

    ``-a start_urls=URL1,URL2`` (a comma-separated string or a list).
    """

    name = "chaos"

    def __init__(self, *args: Any, start_urls: str | list[str] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if isinstance(start_urls, str):
            start_urls = [u.strip() for u in start_urls.split(",")]
        self.start_urls = [u for u in (start_urls or []) if u]

    def parse(self, response: Response) -> Iterator[Any]:
        title = response.css("h1#title::text").get()
        if title is None:
            raise ValueError("no title")
        yield {"url": response.url, "title": title, "host": urlparse_cached(response).hostname}
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, callback=self.parse)


class StallingSpider(ChaosSpider):
    """A :class:`ChaosSpider` whose every ``every``-th callback holds the event loop for
    ``stall`` seconds (a garbage-collection pause, a huge page): a crawler slow on its own.

    ``-a stall=0.4 -a every=25``; ``stalls`` counts the pauses it made (in its items' ``stalled``).
    """

    name = "stalling"

    def __init__(self, *args: Any, stall: str | float = 0.4, every: str | int = 25, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.stall, self.every, self.calls = float(stall), int(every), 0

    def parse(self, response: Response) -> Iterator[Any]:
        self.calls += 1
        stalled = self.calls % self.every == 0
        if stalled:
            end = time.perf_counter() + self.stall
            while time.perf_counter() < end:  # busy, as a CPU-bound callback is (sleep would be too)
                pass
        for result in super().parse(response):
            if isinstance(result, dict):
                result["stalled"] = stalled
            yield result
