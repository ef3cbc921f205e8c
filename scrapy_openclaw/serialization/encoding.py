"""Values as JSON data: the fast walk every stored request takes, and the slow one that names a bad key.

Anything that is not plain data, a known tag (:mod:`.tags`) or an Item or
dataclass findable by its import path is refused with a
:class:`SerializationError` that says where in the request it sits.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import datetime
import decimal
import pathlib
import uuid
from typing import Any

from scrapy import Item

from scrapy_openclaw.exceptions import SerializationError
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


def encode_value(value: Any, where: str) -> Any:
    """Turn *value* into JSON-safe data; raise naming *where* (and the key inside) it failed."""
    try:
        return _encode(value)
    except (_Unencodable, RecursionError):
        _locate(value, where, set())  # the slow walk that names the bad key; raises
        raise SerializationError(f"{where} cannot be stored as data") from None


class _Unencodable(Exception):
    pass


def _is_tag_like(key: Any) -> bool:
    return type(key) is str and key.startswith("__") and key.endswith("__")


def _encode(value: Any) -> Any:
    """The fast walk (every request we store goes through it): no key paths, no messages."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, dict):
        if type(value) is not dict and isinstance(value, collections.OrderedDict):
            return {_ODICT: [[_encode(k), _encode(v)] for k, v in value.items()]}
        if len(value) == 1 and _is_tag_like(next(iter(value))):
            return {_DICT: [[_encode(k), _encode(v)] for k, v in value.items()]}
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                return {_DICT: [[_encode(k), _encode(v)] for k, v in value.items()]}
            out[key] = _encode(item)
        return out
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return {_BYTES: base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, tuple):
        return {_TUPLE: [_encode(v) for v in value]}
    return _encode_other(value)


def _encode_other(value: Any) -> Any:
    """Values JSON has no type for; :class:`_Unencodable` for anything we would not rebuild."""
    if isinstance(value, frozenset):
        return {_FROZENSET: [_encode(v) for v in value]}
    if isinstance(value, set):
        return {_SET: [_encode(v) for v in value]}
    if isinstance(value, datetime.datetime):  # before date: a datetime is a date
        zone = getattr(value.tzinfo, "key", None)
        return {_DATETIME: [value.isoformat(), zone if isinstance(zone, str) else None, value.fold]}
    if isinstance(value, datetime.date):
        return {_DATE: value.isoformat()}
    if isinstance(value, datetime.time):
        return {_TIME: [value.isoformat(), value.fold]}
    if isinstance(value, datetime.timedelta):
        return {_TIMEDELTA: [value.days, value.seconds, value.microseconds]}
    if isinstance(value, decimal.Decimal):
        return {_DECIMAL: str(value)}
    if isinstance(value, uuid.UUID):
        return {_UUID: str(value)}
    if isinstance(value, pathlib.PurePath) and _PATHS.get(type(value).__name__) is type(value):
        return {_PATH: [type(value).__name__, str(value)]}
    if isinstance(value, Item):
        return {_ITEM: [_class_path(type(value)), _encode(dict(value))]}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if hasattr(value, f.name)}
        return {_DATACLASS: [_class_path(type(value)), _encode(fields)]}
    raise _Unencodable


def _class_path(cls: type) -> str:
    """``module.QualName`` of a class that :func:`_find_class` finds again (else not storable)."""
    path = f"{cls.__module__}.{cls.__qualname__}"
    if _find_class(path) is not cls:
        raise _Unencodable  # defined inside a function, or shadowed: cannot be found on load
    return path


def _children(value: Any) -> list[tuple[str, Any]] | None:
    """``(path suffix, child)`` of a container :func:`_encode` walks into; None for a leaf."""
    if isinstance(value, dict):
        return [(f"[{k!r}]", v) for k, v in value.items()]
    if isinstance(value, (list, tuple)):
        return [(f"[{i}]", v) for i, v in enumerate(value)]
    if isinstance(value, (set, frozenset)):
        return [(f"{{{v!r}}}", v) for v in value]
    if isinstance(value, Item):
        return [(f"[{k!r}]", v) for k, v in value.items()]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [(f".{f.name}", getattr(value, f.name)) for f in dataclasses.fields(value) if hasattr(value, f.name)]
    return None


def _locate(value: Any, where: str, active: set[int]) -> None:
    """Raise :class:`SerializationError` naming the first part of *value* that is not data."""
    children = _children(value)
    if children is None:
        try:
            _encode(value)
        except _Unencodable:
            raise SerializationError(
                f"{where} holds a {type(value).__name__}, which cannot be stored as data"
            ) from None
        return
    if id(value) in active:
        raise SerializationError(f"{where} holds itself (a reference cycle cannot be stored as data)")
    active.add(id(value))
    if isinstance(value, Item) or dataclasses.is_dataclass(value):
        try:
            _class_path(type(value))
        except _Unencodable:
            raise SerializationError(
                f"{where} holds a {type(value).__qualname__} whose class cannot be found by "
                "import path (defined inside a function?), so it cannot be stored as data"
            ) from None
    if isinstance(value, dict):
        for key in value:
            try:
                _encode(key)
            except _Unencodable:
                raise SerializationError(f"{where}: key {key!r} cannot be stored as data") from None
    for suffix, child in children:
        _locate(child, where + suffix, active)
    active.discard(id(value))
