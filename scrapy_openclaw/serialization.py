"""Requests as plain JSON data, never pickle.

Everything we store or send between processes (checkpoint journal, dead
letters, the Redis queue) goes through :func:`request_to_data` and
:func:`request_from_data`. Values JSON lacks (bytes, tuples, sets, dates,
Decimals, Items, dataclasses, non-str keys) become tagged objects (see
:func:`encode_value`); callbacks are stored by name and resolve only to methods of the spider.
Loading never imports a module, and builds no class but Item subclasses and dataclasses
already imported. What is read back is untrusted
(Redis, DLQ and checkpoint files): :func:`request_from_data` refuses schemes,
callbacks and meta keys a stored request must not have (see :func:`check_stored`).
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import datetime
import decimal
import functools
import inspect
import json
import pathlib
import sys
import uuid
import zoneinfo
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy import Item, Request
from scrapy.utils.request import request_from_dict

from scrapy_openclaw.exceptions import RefusedRequest as RefusedRequest  # (re-exported)
from scrapy_openclaw.exceptions import SerializationError as SerializationError

if TYPE_CHECKING:
    from scrapy import Spider

FORMAT_VERSION = 1


# --------------------------------------------------------------------------- values as JSON data
#
# A value JSON has no type for is a one-key object ``{"__<tag>__": data}``. A
# user dict that could be read as one (a single ``__dunder__`` key), or whose
# keys are not all strings, is stored as ``{"__dict__": [[key, value], ...]}``,
# so every dict comes back as it was. Classes are looked up, never imported,
# and only Item subclasses and dataclasses are ever built.

_BYTES, _TUPLE, _DICT, _SET, _FROZENSET = "__bytes__", "__tuple__", "__dict__", "__set__", "__frozenset__"
_DATETIME, _DATE, _TIME, _TIMEDELTA, _DECIMAL = "__datetime__", "__date__", "__time__", "__timedelta__", "__decimal__"
_ITEM, _DATACLASS = "__item__", "__dataclass__"
_ODICT, _UUID, _PATH = "__odict__", "__uuid__", "__path__"
#: pathlib classes by name (a fixed table: no class is looked up from stored data)
_PATHS = {
    cls.__name__: cls
    for cls in (pathlib.PurePosixPath, pathlib.PureWindowsPath, pathlib.PosixPath, pathlib.WindowsPath)
}


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


def _find_class(path: Any) -> Any:
    """The object at *path* in an already imported module (never imports: that would run code)."""
    if not isinstance(path, str):
        return None
    module, obj = None, None
    parts = path.split(".")
    for i in range(len(parts) - 1, 0, -1):  # the longest loaded module prefix
        module = sys.modules.get(".".join(parts[:i]))
        if module is not None:
            obj = module
            for name in parts[i:]:
                obj = inspect.getattr_static(obj, name, None)  # no properties or __getattr__ run
            return obj
    return None


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
        # str names (Headers takes them back as they were); bytes keys would need the pair form
        "headers": {name.decode("latin-1"): values for name, values in request.headers.items()},
    }
    for attr in request.attributes:
        raw.setdefault(attr, getattr(request, attr))
    if request.meta.get("_scheme_proxy"):
        _drop_environment_proxy(raw)
    if type(request) is not Request:
        raw["_class"] = f"{type(request).__module__}.{type(request).__name__}"
    elif compact:
        raw = {attr: value for attr, value in raw.items() if not _is_default(attr, value)}
    data = encode_value(raw, f"request {request.url}")
    data["_v"] = FORMAT_VERSION
    return data


def _drop_environment_proxy(raw: dict[str, Any]) -> None:
    """Leave out what HttpProxyMiddleware derived from ``http_proxy``-style variables.

    It sets them again on the restored request, and a stored ``proxy`` is refused.
    """
    raw["meta"] = {k: v for k, v in raw["meta"].items() if k not in ("proxy", "_auth_proxy", "_scheme_proxy")}
    raw["headers"] = {k: v for k, v in raw["headers"].items() if k.lower() != "proxy-authorization"}


def request_from_data(data: Any, spider: Spider | None = None) -> Request:
    """Rebuild a stored request; :class:`SerializationError` (or :class:`RefusedRequest`) if not.

    Only Request subclasses already imported are accepted, and the request must
    pass :func:`check_stored` (a refusal is counted in ``openclaw/stored/refused/<kind>``).
    Any malformed input gives a SerializationError, never another exception.
    """
    if not isinstance(data, dict):
        raise SerializationError(f"a stored request must be an object, not {type(data).__name__}")
    try:
        raw = decode_value({k: v for k, v in data.items() if k != "_v"})
        cls_path = raw.get("_class")
        if cls_path is not None:
            module, _, name = str(cls_path).rpartition(".")
            cls = getattr(sys.modules.get(module), name, None)
            if not (isinstance(cls, type) and issubclass(cls, Request)):
                raise SerializationError(f"request class {cls_path!r} is not a loaded scrapy.Request subclass")
        rules = StoredRequestRules.for_spider(spider)
        url = raw.get("url")
        if not isinstance(url, str):
            raise SerializationError("a stored request needs a 'url' string")
        for which in ("callback", "errback"):
            if raw.get(which) is not None:
                _check_callback(raw[which], spider, which, url)
        request = request_from_dict(raw, spider=spider)
        rules.check(request)
        return request
    except RefusedRequest as exc:
        stats = getattr(getattr(spider, "crawler", None), "stats", None)
        if stats is not None:
            stats.inc_value(f"openclaw/stored/refused/{exc.kind}")
        raise
    except SerializationError:
        raise
    except (TypeError, ValueError, LookupError, AttributeError, ArithmeticError, RecursionError) as exc:
        raise SerializationError(f"cannot rebuild request: {type(exc).__name__}: {exc}") from None


# --------------------------------------------------------------------------- stored-request rules

#: Callbacks Scrapy's own spider classes give their requests (CrawlSpider rules,
#: SitemapSpider); every other name a Scrapy or scrapy-redis base class defines
#: is Spider API (``start``, ``close``, ``from_crawler``, ...), never a callback.
FRAMEWORK_CALLBACKS = frozenset({"parse", "parse_start_url", "_callback", "_errback", "_parse_sitemap"})
#: Hooks Scrapy calls by name that a spider may define itself.
SPIDER_HOOKS = frozenset(
    {
        "start",
        "start_requests",
        "closed",
        "close",
        "from_crawler",
        "update_settings",
        "handles_request",
        "set_crawler",
        "make_requests_from_url",
        "log",
        "logger",
    }
)
_FRAMEWORK_PACKAGES = ("scrapy", "scrapy_redis")


@functools.lru_cache(maxsize=256)
def _framework_names(cls: type) -> frozenset[str]:
    names: set[str] = set()
    for base in cls.__mro__:
        if base.__module__.partition(".")[0] in _FRAMEWORK_PACKAGES:
            names.update(vars(base))
    return frozenset(names)


def _check_callback(name: Any, spider: Spider | None, which: str, url: str) -> None:
    """A stored callback must name one of the spider's own public methods (or a Scrapy rule callback)."""

    def refuse(why: str) -> RefusedRequest:
        return RefusedRequest(f"request {url}: {which} {name!r} refused: {why}", kind="callback", url=url)

    if not isinstance(name, str) or not name.isidentifier():
        raise refuse("not a method name")
    if name not in FRAMEWORK_CALLBACKS:
        if name.startswith("_"):
            raise refuse("private and special methods are never callbacks")
        # (as a plain ``type``: mypy finds ``type[Spider]`` unhashable for lru_cache, python/mypy#11470)
        spider_cls: type = type(spider)
        if name in SPIDER_HOOKS or (spider is not None and name in _framework_names(spider_cls)):
            raise refuse("a Spider API method, not a callback")
    if spider is None:
        return
    # looked up without running any code (a property, a descriptor)
    static = inspect.getattr_static(spider, name, None)
    if not inspect.isfunction(static) or name in vars(spider):
        raise refuse("not a method of the spider")


@dataclass(frozen=True)
class StoredRequestRules:
    """What a request read back from storage may be: settings ``OPENCLAW_STORED_*``."""

    schemes: frozenset[str]
    meta_deny: frozenset[str]

    @classmethod
    def from_settings(cls, settings: Any = None) -> StoredRequestRules:
        """From crawl settings; without them (a bare spider), from the defaults."""
        from scrapy.settings import BaseSettings

        from scrapy_openclaw.settings import read_setting

        values = BaseSettings() if settings is None else settings
        schemes, deny = (
            read_setting(values, name) for name in ("OPENCLAW_STORED_SCHEMES", "OPENCLAW_STORED_META_DENY")
        )
        return cls(frozenset(str(s).lower() for s in schemes), frozenset(str(k) for k in deny))

    @classmethod
    def for_spider(cls, spider: Spider | None) -> StoredRequestRules:
        crawler = getattr(spider, "crawler", None)
        if crawler is None:
            return _default_rules()
        from scrapy_openclaw.runtime import shared

        return shared(crawler, "stored_request_rules", lambda: cls.from_settings(crawler.settings))

    def check(self, request: Request) -> None:
        """Raise :class:`RefusedRequest` if *request* must not be sent."""
        scheme = request.url.partition(":")[0].lower()
        if scheme not in self.schemes:
            raise RefusedRequest(
                f"request {request.url}: scheme {scheme!r} refused (OPENCLAW_STORED_SCHEMES: "
                f"{', '.join(sorted(self.schemes))})",
                kind="scheme",
                url=request.url,
            )
        denied = sorted(k for k in request.meta if k in self.meta_deny)
        if denied:
            raise RefusedRequest(
                f"request {request.url}: meta key(s) {', '.join(denied)} refused (OPENCLAW_STORED_META_DENY)",
                kind="meta",
                url=request.url,
            )


@functools.lru_cache(maxsize=1)
def _default_rules() -> StoredRequestRules:
    return StoredRequestRules.from_settings()


def dumps(data: Any) -> str:
    """Compact, deterministic JSON for storage."""
    return json.dumps(data, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
