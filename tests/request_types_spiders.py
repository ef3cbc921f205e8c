"""Requests carrying every value type the serializer stores, and a spider that checks them on arrival.

Imported by crawl subprocesses as ``tests.request_types_spiders``: the classes
below must be importable there, as a project's own items and dataclasses are.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import signal
import time
import zoneinfo
from decimal import Decimal
from pathlib import Path
from typing import Any

import scrapy
from scrapy import signals
from scrapy.exceptions import DontCloseSpider

from scrapy_openclaw import signals as openclaw_signals


class Product(scrapy.Item):
    name = scrapy.Field()
    price = scrapy.Field()
    seen = scrapy.Field()


@dataclasses.dataclass(frozen=True)
class Point:
    x: int
    y: float
    tags: frozenset = frozenset()


@dataclasses.dataclass
class Offer:
    product: Product
    when: datetime.datetime
    extras: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.extras = {**self.extras, "builds": self.extras.get("builds", 0) + 1}  # a rebuild must not run it


def cases() -> dict[str, Any]:
    """One value per type the issue lists (and a few combinations), built the same in every process."""
    paris = zoneinfo.ZoneInfo("Europe/Paris")
    return {
        "datetime_zone": datetime.datetime(2024, 10, 27, 2, 30, fold=1, tzinfo=paris),  # the second 02:30
        "datetime_naive": datetime.datetime(2020, 2, 29, 23, 59, 59, 999999),
        "datetime_utc": datetime.datetime(2021, 1, 1, 12, tzinfo=datetime.timezone.utc),
        "datetime_offset": datetime.datetime(2021, 1, 1, tzinfo=datetime.timezone(datetime.timedelta(hours=-3))),
        "date": datetime.date(1999, 12, 31),
        "time": datetime.time(13, 5, 7, 11),
        "timedelta": datetime.timedelta(days=-2, seconds=3, microseconds=4),
        "decimal": Decimal("12.3400"),
        "set": {1, "a", (2, 3)},
        "frozenset": frozenset({b"x", 1.5}),
        "tuple": (1, (2, [3]), None),
        "bytes": b"\x00\xff\x80",
        "int_keys": {1: "a", 2: {3: "b"}},
        "mixed_keys": {None: 1, True: 2, 2.5: 3, b"raw": 4, (1, "t"): 5, frozenset({1}): 6},
        "tag_like_dicts": [
            {"__tuple__": [1, 2]},
            {"__bytes__": "AA=="},
            {"__dict__": []},
            {"__item__": ["x", {}]},
            {"__x__": 1, "y": 2},
            {"__set__": {"__set__": []}},
        ],
        "item": Product(name="n", price=Decimal("1.5"), seen=datetime.date(2020, 1, 1)),
        "dataclass": Point(1, 2.5, frozenset({"a"})),
        "nested": Offer(Product(name="m"), datetime.datetime(2022, 5, 1, 8), {1: {2, 3}}),
    }


def same(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down (``1 == True == 1.0`` is not enough)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        keys = {(type(k), k) for k in a}
        return keys == {(type(k), k) for k in b} and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (set, frozenset)):
        return a == b and {(type(x), x) for x in a} == {(type(x), x) for x in b}
    if isinstance(a, scrapy.Item):
        return same(dict(a), dict(b))
    if dataclasses.is_dataclass(a):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, datetime.datetime):
        return a == b and (a.isoformat(), a.fold, str(a.tzinfo)) == (b.isoformat(), b.fold, str(b.tzinfo))
    # repr too: Decimal('1.10') == Decimal('1.1'); an object's default repr names its address
    return a == b and (repr(a) == repr(b) or type(a).__repr__ is object.__repr__)


class TypedSpider(scrapy.Spider):
    """Mode (setting ``TYPED_MODE``): ``all`` schedules every case, an unstorable request and then
    the same URL again; ``die`` schedules every case and kills itself (-9) at the first response;
    ``pause`` schedules them from a callback, held 2 s (not-before), and closes after two pages;
    ``none`` schedules nothing (a resumed worker). ``TYPED_URLS``: one page per request;
    ``TYPED_REPORT``: a JSON file written when the spider closes."""

    name = "typed"
    grace = 6.0

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> TypedSpider:
        spider = super().from_crawler(crawler, *args, **kwargs)
        spider.mode = crawler.settings.get("TYPED_MODE", "all")
        spider.urls = crawler.settings.getlist("TYPED_URLS")
        spider.results: dict[str, dict[str, bool]] = {}
        spider.dropped: list[str] = []
        spider.dead_letters: list[dict[str, Any]] = []
        spider.opened_at = time.time()
        crawler.signals.connect(spider._dropped, signal=signals.request_dropped)
        crawler.signals.connect(spider._dead_letter, signal=openclaw_signals.dead_letter)
        crawler.signals.connect(spider._idle, signal=signals.spider_idle)
        crawler.signals.connect(spider._closed, signal=signals.spider_closed)
        return spider

    def typed_requests(self, **meta: Any) -> list[scrapy.Request]:
        return [
            scrapy.Request(
                url,
                callback=self.parse_typed,
                meta={"case": name, "value": value, **meta},
                cb_kwargs={"value": value, "case": name},
            )
            for (name, value), url in zip(cases().items(), self.urls)
        ]

    async def start(self) -> Any:
        if self.mode in ("all", "die"):
            for request in self.typed_requests():
                yield request
        if self.mode == "all":
            extra = self.urls[len(cases())]
            bad = {"case": "refused", "bad": {"k": [1, object()]}}
            yield scrapy.Request(extra, callback=self.parse_again, meta=bad)
            yield scrapy.Request(extra, callback=self.parse_again, meta={"case": "after_refused"})
        if self.mode == "pause":
            yield scrapy.Request(self.urls[-2], callback=self.parse_seed, dont_filter=True)
            yield scrapy.Request(self.urls[-1], callback=self.parse_again, dont_filter=True, meta={"case": "slow"})

    def parse_seed(self, response: Any) -> Any:
        yield from self.typed_requests(openclaw_not_before=time.time() + 2)

    def parse_typed(self, response: Any, value: Any, case: str) -> Any:
        if self.mode == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        expected = cases()[case]
        self.results[case] = {"meta": same(response.meta["value"], expected), "cb_kwargs": same(value, expected)}
        yield {"case": case, **self.results[case]}

    def parse_again(self, response: Any) -> Any:
        self.results[response.meta["case"]] = {"meta": True, "cb_kwargs": True}
        yield {"case": response.meta["case"]}

    def _dropped(self, request: Any, spider: Any = None) -> None:
        self.dropped.append(request.url)

    def _dead_letter(self, dead_letter: Any, spider: Any = None) -> None:
        self.dead_letters.append(
            {
                "url": dead_letter.url,
                "reason": dead_letter.reason,
                "message": dead_letter.exception_message,
                "request": dead_letter.request,
            }
        )

    def _idle(self) -> None:
        if self.mode == "none" and time.time() - self.opened_at < self.grace:
            raise DontCloseSpider

    def _closed(self, spider: Any, reason: str) -> None:
        path = self.settings.get("TYPED_REPORT")
        if path:
            report = {
                "results": self.results,
                "dropped": self.dropped,
                "dead_letters": self.dead_letters,
                "reason": reason,
            }
            Path(path).write_text(json.dumps(report), encoding="utf-8")
