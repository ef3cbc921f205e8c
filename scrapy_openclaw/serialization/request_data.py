"""A request as JSON data and back: what Scrapy's ``to_dict`` stores, faster and checked on the way in.

Callbacks are stored by name (bound methods of the spider name themselves);
a request read back passes :mod:`.rules` before it is rebuilt.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from scrapy import Request
from scrapy.utils.request import request_from_dict

from scrapy_openclaw.exceptions import RefusedRequest, SerializationError
from scrapy_openclaw.serialization.decoding import decode_value
from scrapy_openclaw.serialization.encoding import encode_value
from scrapy_openclaw.serialization.rules import StoredRequestRules, _check_callback

if TYPE_CHECKING:
    from scrapy import Spider

FORMAT_VERSION = 1


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
