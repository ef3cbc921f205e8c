"""JSON data back into values: the inverse of :mod:`.encoding`, one decoder per tag.

Stored data is untrusted: a decoder builds only Item subclasses and
dataclasses already imported, and raises TypeError/ValueError on anything else.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import datetime
import decimal
import uuid
import zoneinfo
from typing import Any

from scrapy import Item

from scrapy_openclaw.serialization.tags import (
    _BYTES,
    _DATACLASS,
    _DATE,
    _DATETIME,
    _DECIMAL,
    _DICT,
    _FROZENSET,
    _ITEM,
    _ODICT,
    _PATH,
    _PATHS,
    _SET,
    _TIME,
    _TIMEDELTA,
    _TUPLE,
    _UUID,
    _find_class,
)


def decode_value(value: Any) -> Any:
    """The inverse of :func:`encode_value` (may raise TypeError/ValueError on foreign data)."""
    if isinstance(value, list):
        return [decode_value(v) for v in value]
    if isinstance(value, dict):
        if len(value) == 1:
            tag, data = next(iter(value.items()))
            decode = _DECODERS.get(tag)
            if decode is not None:
                return decode(data)
        return {k: decode_value(v) for k, v in value.items()}
    return value


def _decode_item(data: Any) -> Any:
    path, fields = data
    cls = _find_class(path)
    if not (isinstance(cls, type) and issubclass(cls, Item)):
        raise ValueError(f"{path!r} is not a loaded scrapy.Item subclass")
    item = cls()
    for name, value in _decode_fields(fields).items():
        item[name] = value  # an undeclared field raises KeyError
    return item


def _decode_dataclass(data: Any) -> Any:
    """Built without calling ``__init__``/``__post_init__``: the fields come back exactly as stored."""
    path, fields = data
    cls = _find_class(path)
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise ValueError(f"{path!r} is not a loaded dataclass")
    known = {f.name for f in dataclasses.fields(cls)}
    obj = object.__new__(cls)
    for name, value in _decode_fields(fields).items():
        if name not in known:
            raise ValueError(f"{path!r} has no field {name!r}")
        object.__setattr__(obj, name, value)  # works for frozen and slotted dataclasses too
    return obj


def _decode_fields(fields: Any) -> dict[str, Any]:
    values = decode_value(fields)
    if not isinstance(values, dict) or not all(isinstance(k, str) for k in values):
        raise ValueError("stored fields must be an object")
    return values


def _decode_datetime(data: Any) -> datetime.datetime:
    iso, zone, fold = data
    value = datetime.datetime.fromisoformat(iso)
    if zone is not None:
        value = value.replace(tzinfo=zoneinfo.ZoneInfo(zone))
    return value.replace(fold=int(fold))


def _decode_time(data: Any) -> datetime.time:
    iso, fold = data
    return datetime.time.fromisoformat(iso).replace(fold=int(fold))


def _decode_decimal(data: Any) -> decimal.Decimal:
    if not isinstance(data, str):
        raise ValueError("a stored Decimal is a string")
    return decimal.Decimal(data)


_DECODERS = {
    _BYTES: lambda data: base64.b64decode(data),
    _TUPLE: lambda data: tuple(decode_value(v) for v in data),
    _DICT: lambda data: {decode_value(k): decode_value(v) for k, v in data},
    _ODICT: lambda data: collections.OrderedDict((decode_value(k), decode_value(v)) for k, v in data),
    _UUID: lambda data: uuid.UUID(str(data)),
    _PATH: lambda data: _PATHS[data[0]](str(data[1])),
    _SET: lambda data: {decode_value(v) for v in data},
    _FROZENSET: lambda data: frozenset(decode_value(v) for v in data),
    _DATETIME: _decode_datetime,
    _DATE: lambda data: datetime.date.fromisoformat(data),
    _TIME: _decode_time,
    _TIMEDELTA: lambda data: datetime.timedelta(*(int(x) for x in data)),
    _DECIMAL: _decode_decimal,
    _ITEM: _decode_item,
    _DATACLASS: _decode_dataclass,
}
