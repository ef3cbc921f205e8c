"""Requests as JSON data: round trips, clear errors, and no code run on load."""

from __future__ import annotations

import json
import sys

import pytest
from scrapy import Request, Spider
from scrapy.http import FormRequest

from scrapy_openclaw.serialization import (
    SerializationError,
    dumps,
    request_from_data,
    request_to_data,
)


class SampleSpider(Spider):
    name = "sample"

    def parse_page(self, response):
        pass


def test_round_trip_keeps_everything_a_retry_needs():
    spider = SampleSpider()
    request = Request(
        "http://127.0.0.2:8000/page/1",
        method="POST",
        body=b"\x00\xffbinary",
        headers={"X-Token": "abc"},
        callback=spider.parse_page,
        priority=7,
        dont_filter=True,
        meta={"openclaw_deadline": 1.5, "blob": b"\x01", "pair": (1, "a"), "nested": {"k": [1, 2]}},
        cb_kwargs={"page": 1},
    )
    data = json.loads(dumps(request_to_data(request, spider)))
    again = request_from_data(data, spider)
    assert again.url == request.url and again.method == "POST"
    assert again.body == b"\x00\xffbinary"
    assert again.headers[b"X-Token"] == b"abc"
    assert again.callback == spider.parse_page
    assert (again.priority, again.dont_filter) == (7, True)
    assert again.meta["blob"] == b"\x01" and again.meta["pair"] == (1, "a")
    assert again.meta["nested"] == {"k": [1, 2]} and again.cb_kwargs == {"page": 1}


def test_request_subclass_round_trips():
    request = FormRequest("http://127.0.0.2/form", formdata={"a": "1"})
    assert type(request_from_data(request_to_data(request))) is FormRequest


@pytest.mark.parametrize(
    "request_",
    [
        Request("http://127.0.0.2/plain"),
        Request(
            "http://127.0.0.2/p",
            method="POST",
            body=b"x",
            headers={"A": "b"},
            cookies={"c": "d"},
            meta={"depth": 2},
            encoding="latin-1",
            priority=-3,
            dont_filter=True,
            flags=["f"],
            cb_kwargs={"k": 1},
        ),
        Request("http://127.0.0.2/zero", priority=0, meta={}, body=b""),
        FormRequest("http://127.0.0.2/form", formdata={"a": "1"}),
    ],
    ids=["defaults", "everything-set", "explicit-defaults", "subclass"],
)
def test_compact_form_rebuilds_the_same_request(request_):
    spider = SampleSpider()
    full = request_to_data(request_, spider)
    compact = request_to_data(request_, spider, compact=True)
    again = request_from_data(json.loads(dumps(compact)), spider)
    assert again.to_dict(spider=spider) == request_.to_dict(spider=spider)
    assert type(again) is type(request_)
    if type(request_) is Request:
        assert len(dumps(compact)) < len(dumps(full))
    else:  # a subclass may default differently: stored in full
        assert compact == full


def test_compact_form_is_smaller_and_drops_only_defaults():
    data = request_to_data(Request("http://127.0.0.2/a", priority=1, dont_filter=False), compact=True)
    assert data == {"url": "http://127.0.0.2/a", "priority": 1, "_v": 1}


def test_unserialisable_meta_names_url_and_key():
    request = Request("http://127.0.0.2/x", meta={"handle": object()})
    with pytest.raises(SerializationError, match=r"request http://127.0.0.2/x\['meta'\]\['handle'\] holds a object"):
        request_to_data(request)
    deep = Request("http://127.0.0.2/y", meta={"a": [1, {"b": (2, {3: object})}]})
    with pytest.raises(SerializationError, match=r"\['meta'\]\['a'\]\[1\]\['b'\]\[1\]\[3\] holds a type"):
        request_to_data(deep, compact=True)
    with pytest.raises(SerializationError, match=r"\['meta'\]: key <object object at .*> cannot be stored"):
        request_to_data(Request("http://127.0.0.2/z", meta={object(): "x"}))


def test_lambda_callback_is_rejected():
    with pytest.raises(SerializationError, match="http://127.0.0.2/x"):
        request_to_data(Request("http://127.0.0.2/x", callback=lambda r: None), SampleSpider())


def test_loading_never_imports_a_module():
    data = request_to_data(Request("http://127.0.0.2/x"))
    data["_class"] = "antigravity.Request"  # importing it would open a browser
    with pytest.raises(SerializationError, match="not a loaded scrapy.Request subclass"):
        request_from_data(data)
    assert "antigravity" not in sys.modules
