"""Differential: every request shape scrapy-redis's own (pickle) queue carries, ours carries too.

Both queues run against the same real redis-server. A shape scrapy-redis
carries must come out of ours equal (type, attributes, ``meta`` and
``cb_kwargs`` all the way down), or be refused with a ``SerializationError``
when pushed, and then only for the documented unsafe cases (values whose
rebuild would construct an arbitrary class or resolve arbitrary code: docs/stored-requests.md,
"What a stored request may hold").
"""

from __future__ import annotations

import collections
import datetime
import enum
import json
import pathlib
import uuid
from decimal import Decimal
from typing import Any

import pytest
import redis
from scrapy import Request, Spider
from scrapy.http import FormRequest, JsonRequest
from scrapy.utils.test import get_crawler
from scrapy_redis.queue import PriorityQueue as ScrapyRedisPriorityQueue

from scrapy_openclaw import meta as M
from scrapy_openclaw.distributed import serializer
from scrapy_openclaw.distributed.queue import LEASE, LeasedDeadlineQueue
from scrapy_openclaw.serialization import SerializationError
from tests.request_types_spiders import cases, same


class _Spider(Spider):
    name = "diff"

    def parse(self, response: Any) -> None:
        pass

    def parse_page(self, response: Any, **kwargs: Any) -> None:
        pass

    def on_error(self, failure: Any) -> None:
        pass


class Colour(enum.Enum):
    RED = 1


class Opaque:
    """An arbitrary class: pickle rebuilds it, we never construct one from stored data."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Opaque) and other.n == self.n

    def __hash__(self) -> int:
        return self.n


def module_function() -> None:
    pass


#: What pickle rebuilds and we refuse: each would need an arbitrary class built or code resolved.
UNSAFE = {"opaque_object", "enum_member", "function", "class_object", "opaque_key"}


def shapes(spider: _Spider) -> dict[str, Request]:
    url = "http://127.0.0.2:8000/p?q=1#frag"
    out: dict[str, Request] = {
        "plain": Request(url),
        "everything": Request(
            url,
            method="PUT",
            body=b"\x00\xff",
            headers={"A": ["1", "2"], "B": "x"},
            cookies={"c": "d"},
            priority=-7,
            dont_filter=True,
            flags=["f"],
            encoding="latin-1",
            callback=spider.parse_page,
            errback=spider.on_error,
            cb_kwargs={"page": 3},
            meta={"depth": 2, "download_timeout": 5.5},
        ),
        "form": FormRequest(url, formdata={"a": "1", "b": ["2", "3"]}),
        "json": JsonRequest(url, data={"k": [1, {"n": None}]}),
        "unicode_url": Request("http://127.0.0.2/ünï/€?x=ü"),
        "cookie_list": Request(url, cookies=[{"name": "a", "value": "b", "domain": "127.0.0.2"}]),
        "nan_inf": Request(url, meta={"v": [float("inf"), float("-inf")]}),
        "ordered_dict": Request(url, meta={"v": collections.OrderedDict(a=1, b=2)}),
        "big_int": Request(url, meta={"v": 2**100, "neg": -(2**70)}),
        "deep": Request(url, meta={"v": [[[[{"a": ({1: (b"x",)},)}]]]]}),
        "empty_containers": Request(url, meta={"v": [(), {}, [], set(), frozenset(), b"", ""]}),
        "opaque_object": Request(url, meta={"v": Opaque(1)}),
        "opaque_key": Request(url, meta={"v": {Opaque(2): 1}}),
        "enum_member": Request(url, meta={"v": Colour.RED}),
        "function": Request(url, meta={"v": module_function}),
        "class_object": Request(url, meta={"v": Opaque}),
        "uuid": Request(url, meta={"v": uuid.UUID(int=5)}),
        "path": Request(
            url, meta={"v": [pathlib.PurePosixPath("/tmp/x"), pathlib.PureWindowsPath("C:/x"), pathlib.Path("rel/y")]}
        ),
        "lambda_callback": Request(url, callback=lambda r: None),  # neither carries it
    }
    for name, value in cases().items():
        out[f"meta_{name}"] = Request(url, meta={"v": value}, cb_kwargs={"v": value}, callback=spider.parse_page)
    out["all_types_at_once"] = Request(url, meta={"all": cases(), "d": Decimal("-0"), "t": datetime.time()})
    return out


def _comparable(request: Request) -> dict[str, Any]:
    meta = {k: v for k, v in request.meta.items() if k not in (LEASE, M.DEADLINE)}
    return {
        "type": type(request),
        "url": request.url,
        "method": request.method,
        "body": request.body,
        "headers": {k: request.headers.getlist(k) for k in request.headers},
        "cookies": request.cookies,
        "priority": request.priority,
        "dont_filter": request.dont_filter,
        "flags": request.flags,
        "encoding": request.encoding,
        "callback": request.callback,
        "errback": request.errback,
        "meta": meta,
        "cb_kwargs": request.cb_kwargs,
    }


def _carry_scrapy_redis(queue: ScrapyRedisPriorityQueue, request: Request) -> Request | None:
    try:
        queue.push(request)
    except Exception:  # whatever scrapy-redis raises: it does not carry this shape
        return None
    return queue.pop()


@pytest.fixture
def spider_and_queues(redis_server: Any) -> Any:
    crawler = get_crawler(_Spider, {"REDIS_URL": redis_server.url, "OPENCLAW_HEALTH_ENABLED": False})
    spider = _Spider.from_crawler(crawler)
    crawler.spider = spider
    client = redis.Redis.from_url(redis_server.url)
    theirs = ScrapyRedisPriorityQueue(client, spider, "%(spider)s:theirs")  # pickle, their default
    ours = LeasedDeadlineQueue(client, spider, "%(spider)s:ours", serializer)
    yield spider, theirs, ours
    if ours._loop.running:
        ours._loop.stop()


def test_every_shape_scrapy_redis_carries_we_carry(spider_and_queues: Any) -> None:
    spider, theirs, ours = spider_and_queues
    carried, refused, theirs_only_refused = [], [], []
    for name, request in shapes(spider).items():
        expected = _comparable(request)
        via_pickle = _carry_scrapy_redis(theirs, request)
        if via_pickle is None:
            theirs_only_refused.append(name)
            with pytest.raises(SerializationError):
                ours.push(request)
            continue
        assert same(_comparable(via_pickle), expected), name  # the baseline really carries it
        try:
            ours.push(request)
        except SerializationError as exc:
            assert name in UNSAFE, f"{name}: scrapy-redis carries it, we refused: {exc}"
            assert "['meta']['v']" in str(exc) and request.url in str(exc)
            refused.append(name)
            continue
        again = ours.pop()
        assert again is not None, name
        ours.ack(again.meta.get(LEASE))
        assert same(_comparable(again), expected), (name, _comparable(again), expected)
        carried.append(name)
    assert sorted(refused) == sorted(UNSAFE)  # each documented case really is refused, nothing else
    assert theirs_only_refused == ["lambda_callback"]
    assert len(carried) == len(shapes(spider)) - len(UNSAFE) - 1
    json.dumps(carried)  # (names only: readable in a failure report)
