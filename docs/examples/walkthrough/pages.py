import scrapy


class PagesSpider(scrapy.Spider):
    """Follows every link from the URLs given with -a start_urls=URL1,URL2,..."""

    name = "pages"

    def __init__(self, start_urls="", **kwargs):
        super().__init__(**kwargs)
        self.start_urls = [url for url in start_urls.split(",") if url]

    def parse(self, response):
        yield {"url": response.url, "title": response.css("title::text").get()}
        yield from response.follow_all(css="a")
