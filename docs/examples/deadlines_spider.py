"""Requests with deadlines: ``scrapy crawl prices -a start_url=https://shop.example.com/``."""

import time

import scrapy


class PricesSpider(scrapy.Spider):
    name = "prices"

    def __init__(self, start_url: str = "https://shop.example.com/", **kwargs):
        super().__init__(**kwargs)
        self.start_url = start_url

    async def start(self):
        # an absolute deadline (UNIX time): fetch the first page within ten minutes
        yield scrapy.Request(self.start_url, meta={"openclaw_deadline": time.time() + 600})

    def parse(self, response):
        yield {"url": response.url}
        for href in response.css("a::attr(href)").getall():
            # a request class: the deadline the policy gives it (deadline.classes.price)
            yield response.follow(href, meta={"openclaw_request_class": "price"})
