"""Per-crawler shared objects (policy, health registry, ...), one of each.

Components built separately by Scrapy find the single owner of a piece of
state here instead of each keeping a copy.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

T = TypeVar("T")

_shared: weakref.WeakKeyDictionary[Crawler, dict[str, Any]] = weakref.WeakKeyDictionary()


def shared(crawler: Crawler, key: str, factory: Callable[[], T]) -> T:
    """Return the crawler's object for *key*, creating it with *factory* once."""
    objects = _shared.setdefault(crawler, {})
    if key not in objects:
        objects[key] = factory()
    return objects[key]


def peek(crawler: Crawler, key: str) -> Any | None:
    """The crawler's object for *key* if some component created it, else None."""
    return _shared.get(crawler, {}).get(key)
