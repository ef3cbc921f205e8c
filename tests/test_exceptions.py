"""One root for every exception the package raises; the old names and bases still hold."""

from __future__ import annotations

import inspect

import pytest
from scrapy.exceptions import DropItem

from scrapy_openclaw import exceptions
from scrapy_openclaw.exceptions import OpenClawError

CLASSES = [obj for _, obj in inspect.getmembers(exceptions, inspect.isclass) if obj.__module__ == exceptions.__name__]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_exception_has_the_one_root(cls):
    assert issubclass(cls, OpenClawError)


@pytest.mark.parametrize(
    ("old_home", "name", "base"),
    [
        ("scrapy_openclaw", "ParseError", Exception),
        ("scrapy_openclaw.errors", "ItemValidationError", DropItem),
        ("scrapy_openclaw.errors", "OpenClawConfigError", ValueError),
        ("scrapy_openclaw.serialization", "SerializationError", ValueError),
        ("scrapy_openclaw.serialization", "RefusedRequest", ValueError),
        ("scrapy_openclaw.checkpoint.records", "CheckpointError", Exception),
        ("scrapy_openclaw.checkpoint.snapshot", "CorruptSnapshot", Exception),
        ("scrapy_openclaw.dlq.records", "InvalidRecord", ValueError),
        ("scrapy_openclaw.control.controller", "ControlError", ValueError),
        ("scrapy_openclaw.distributed.serializer", "RefusedPayload", ValueError),
        ("scrapy_openclaw.distributed.scheduler", "RedisUnavailableError", ConnectionError),
        ("scrapy_openclaw.distributed.scheduler", "LegacyQueueError", RuntimeError),
        ("scrapy_openclaw.distributed.shards", "ShardLayoutError", ValueError),
    ],
)
def test_old_import_paths_and_standard_bases_still_hold(old_home, name, base):
    module = __import__(old_home, fromlist=[name])
    cls = getattr(module, name)
    assert cls is getattr(exceptions, name)
    assert issubclass(cls, base)


def test_a_bad_setting_is_caught_by_the_root_and_as_a_value_error():
    from scrapy.settings import Settings

    from scrapy_openclaw.settings import validate_settings

    with pytest.raises(OpenClawError, match="OPENCLAW_NO_SUCH"):
        validate_settings(Settings({"OPENCLAW_NO_SUCH": 1}))
    with pytest.raises(ValueError):
        validate_settings(Settings({"OPENCLAW_NO_SUCH": 1}))
