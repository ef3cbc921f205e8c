"""Spiders for crawling the chaos site (importable by a crawl subprocess)."""

from __future__ import annotations

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
