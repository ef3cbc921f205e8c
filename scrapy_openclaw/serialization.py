"""Requests as plain JSON data, never pickle.

Everything we store or send between processes (checkpoint journal, dead
letters, the Redis queue) goes through :func:`request_to_data` and
:func:`request_from_data`. Bytes become ``{"__bytes__": "<base64>"}``;
callbacks are stored by name and resolve only to methods of the spider;
loading never imports a module or runs code.
"""

from __future__ import annotations

import base64
import json
import sys
from typing import TYPE_CHECKING, Any

from scrapy import Request
from scrapy.utils.request import request_from_dict

if TYPE_CHECKING:
    from scrapy import Spider

FORMAT_VERSION = 1
_BYTES = "__bytes__"
_TUPLE = "__tuple__"


class SerializationError(ValueError):
    """A request holds something that cannot be stored as data."""


def encode_value(value: Any, where: str) -> Any:
    """Turn *value* into JSON-safe data; raise naming *where* (and the key inside) it failed."""
    try:
        return _encode(value)
    except _Unencodable:
        _locate(value, where)  # the slow walk that names the bad key; raises
        raise SerializationError(f"{where} cannot be stored as data") from None


class _Unencodable(Exception):
    pass


def _encode(value: Any) -> Any:
    """The fast walk (every request we store goes through it): no key paths, no messages."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                if not isinstance(key, bytes):
                    raise _Unencodable
                key = key.decode("latin-1")
            out[key] = _encode(item)
        return out
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return {_BYTES: base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, tuple):
        return {_TUPLE: [_encode(v) for v in value]}
    raise _Unencodable


def _locate(value: Any, where: str) -> None:
    """Raise :class:`SerializationError` naming the first part of *value* that is not data."""
    if value is None or isinstance(value, (str, bool, int, float, bytes, bytearray)):
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _locate(item, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, bytes):
                key = key.decode("latin-1")
            if not isinstance(key, str):
                raise SerializationError(f"{where}: key {key!r} is not a string")
            _locate(item, f"{where}[{key!r}]")
        return
    raise SerializationError(
        f"{where} holds a {type(value).__name__}, which cannot be stored as data"
    )


def decode_value(value: Any) -> Any:
    if isinstance(value, list):
        return [decode_value(v) for v in value]
    if isinstance(value, dict):
        if len(value) == 1 and _BYTES in value:
            return base64.b64decode(value[_BYTES])
        if len(value) == 1 and _TUPLE in value:
            return tuple(decode_value(v) for v in value[_TUPLE])
        return {k: decode_value(v) for k, v in value.items()}
    return value


def _method_name(request: Request, spider: Spider | None, name: str) -> str | None:
    """The spider method name of the request's callback or errback.

    Scrapy's ``Request.to_dict`` finds it by listing every method of the
    spider (``inspect.getmembers``), most of the cost of serialising a
    request; a bound method of the spider names itself, so we ask it first.
    """
    func = getattr(request, name)
    if func is None or isinstance(func, str):
        return func
    method = getattr(func, "__name__", None)
    if (
        spider is not None
        and getattr(func, "__self__", None) is spider
        and method is not None
        and getattr(getattr(spider, method, None), "__func__", None) is getattr(func, "__func__", None)
    ):
        return method
    raise SerializationError(f"request {request.url}: {name} is not a method of the spider")


#: What a plain ``Request`` holds when an attribute was not given (read off Scrapy itself).
_PLAIN = Request("data:,")
_DEFAULTS = {attr: getattr(_PLAIN, attr) for attr in Request.attributes if attr != "url"}
_DEFAULTS["headers"] = {}


def _is_default(attr: str, value: Any) -> bool:
    default = _DEFAULTS.get(attr, _PLAIN)  # _PLAIN: no attribute has it as a value
    return type(value) is type(default) and value == default


def request_to_data(request: Request, spider: Spider | None = None, *, compact: bool = False) -> dict[str, Any]:
    """A JSON-safe dict for *request*; :class:`SerializationError` names the bad key.

    The same dict as ``Request.to_dict`` (``request_from_dict`` reads it back).
    *compact* leaves out the attributes a plain ``Request`` has by default
    (``request_from_dict`` fills them in again): half the bytes and time, for
    storage nobody reads by eye (the checkpoint, the Redis queue). Subclasses
    are always stored in full: their defaults may differ.
    """
    raw: dict[str, Any] = {
        "url": request.url,
        "callback": _method_name(request, spider, "callback"),
        "errback": _method_name(request, spider, "errback"),
        "headers": dict(request.headers),
    }
    for attr in request.attributes:
        raw.setdefault(attr, getattr(request, attr))
    if type(request) is not Request:
        raw["_class"] = f"{type(request).__module__}.{type(request).__name__}"
    elif compact:
        raw = {attr: value for attr, value in raw.items() if not _is_default(attr, value)}
    data = encode_value(raw, f"request {request.url}")
    data["_v"] = FORMAT_VERSION
    return data


def request_from_data(data: dict[str, Any], spider: Spider | None = None) -> Request:
    """Rebuild a request; only Request subclasses already imported are accepted."""
    raw = decode_value({k: v for k, v in data.items() if k != "_v"})
    cls_path = raw.get("_class")
    if cls_path is not None:
        module, _, name = str(cls_path).rpartition(".")
        cls = getattr(sys.modules.get(module), name, None)
        if not (isinstance(cls, type) and issubclass(cls, Request)):
            raise SerializationError(
                f"request class {cls_path!r} is not a loaded scrapy.Request subclass"
            )
    try:
        return request_from_dict(raw, spider=spider)
    except (TypeError, ValueError, KeyError) as exc:
        raise SerializationError(f"cannot rebuild request: {exc}") from None


def dumps(data: Any) -> str:
    """Compact, deterministic JSON for storage."""
    return json.dumps(data, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
