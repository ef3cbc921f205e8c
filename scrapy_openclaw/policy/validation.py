"""Policy data checked against the dataclasses' types and ranges, and dataclasses built from it.

Checking comes first (a bad value names its file, line and key through
:class:`~scrapy_openclaw.yamlconfig.Where`); building then trusts the data.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Iterable
from typing import Any, Literal, get_args, get_origin, get_type_hints

from scrapy_openclaw.yamlconfig import Where


def _validate(cls: type, data: Any, path: tuple, where: Where) -> None:
    if not isinstance(data, dict):
        where.fail(path, f"must be a mapping, got {type(data).__name__}")
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key, value in data.items():
        kpath = (*path, key)
        if key not in fields:
            where.fail(kpath, f"unknown key ({_suggest(key, fields)})")
        _validate_value(hints[key], fields[key], value, kpath, where)


def _suggest(key: Any, known: Iterable[str]) -> str:
    """ "did you mean ..." for a near miss, else the list of known keys."""
    close = difflib.get_close_matches(str(key), list(known), n=1)
    return f"did you mean {close[0]}?" if close else f"known: {', '.join(sorted(known))}"


def _validate_value(hint: Any, f: dataclasses.Field, value: Any, path: tuple, where: Where) -> None:
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        _validate(hint, value, path, where)
        return
    origin, args = get_origin(hint), get_args(hint)
    if hint is bool:
        if not isinstance(value, bool):
            where.fail(path, f"must be true or false, got {value!r}")
        return
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v.strip() for v in value):
            where.fail(path, f"must be a list of non-empty strings, got {value!r}")
        if len(value) > 100 or any(len(v) > 1000 for v in value):
            where.fail(path, "at most 100 strings of at most 1000 characters")
        return
    if origin is Literal:
        if value not in args:
            where.fail(path, f"must be one of {', '.join(map(repr, args))}, got {value!r}")
        return
    if origin is dict:
        if not isinstance(value, dict):
            where.fail(path, "must be a mapping")
        for k, v in value.items():
            _check_number(float, v, (*path, k), where, (0, None))
        return
    optional = type(None) in args
    if optional and value is None:
        return
    base = next((a for a in args if a is not type(None)), hint) if args else hint
    _check_number(base, value, path, where, f.metadata.get("range", (None, None)))


def _check_number(base: type, value: Any, path: tuple, where: Where, bounds: tuple) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        where.fail(path, f"must be a number, got {value!r}")
    if isinstance(value, int) and abs(value) >= 2**63:
        where.fail(path, "number too large")
    if base is int and not float(value).is_integer():
        where.fail(path, f"must be a whole number, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        where.fail(path, f"must be finite, got {value!r}")
    lo, hi = bounds
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        lo_s = "-inf" if lo is None else lo
        hi_s = "inf" if hi is None else hi
        where.fail(path, f"out of range: {value!r} is not within [{lo_s}, {hi_s}]")


def _build(cls: type, data: dict[str, Any], base: Any = None) -> Any:
    """Apply validated data onto *base* (the class defaults), field by field."""
    base = cls() if base is None else base
    hints = get_type_hints(cls)
    changes = {}
    for key, value in data.items():
        hint = hints[key]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            changes[key] = _build(hint, value, getattr(base, key))
        elif get_origin(hint) is tuple:
            changes[key] = tuple(value)
        elif hint is bool:
            changes[key] = bool(value)
        elif value is not None and (hint is int or int in get_args(hint)):
            changes[key] = int(value)
        elif value is not None and (hint is float or (get_origin(hint) is not dict and float in get_args(hint))):
            changes[key] = float(value)
        else:
            changes[key] = value
    return dataclasses.replace(base, **changes)


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out
