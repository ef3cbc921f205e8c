"""Which store a dead-letter URI names: a path or ``jsonl://``, or ``redis://``.

Also where the default store lives (one file per spider under the Scrapy
project), how ``%(name)s`` in a URI becomes the spider name, and where a
relative path points (the project root, see :mod:`scrapy_openclaw.paths`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from scrapy_openclaw.dlq.stores.base import DeadLetterStore
from scrapy_openclaw.dlq.stores.jsonl import JsonlStore
from scrapy_openclaw.dlq.stores.redis_stream import RedisStore
from scrapy_openclaw.paths import base_dir, resolve_path
from scrapy_openclaw.redact import mask_uri

#: URI schemes of the Redis stream store.
REDIS_SCHEMES = ("redis", "rediss", "unix")


def expand_uri(uri: str, spider: str | None) -> str:
    """Fill ``%(name)s`` with the spider name; a clear error if it is needed but unknown."""
    if "%(" not in uri:
        return uri
    if spider is None:
        raise ValueError(f"dead-letter URI {mask_uri(uri)!r} contains %(name)s but no spider name is known")
    try:
        return uri % {"name": spider}
    except (KeyError, ValueError, TypeError) as exc:
        raise ValueError(f"dead-letter URI {mask_uri(uri)!r}: only %(name)s may be substituted ({exc})") from None


def default_uri(uri: str | os.PathLike[str] | None = None) -> str:
    """*uri* (``OPENCLAW_DLQ_URI``), else ``<project>/openclaw-data/%(name)s/deadletters.jsonl``.

    One store per spider for plain, checkpointed and scheduled crawls alike, so
    that ``scrapy openclaw-dlq list SPIDER`` finds all of them. ``<project>``
    is the project root (:mod:`scrapy_openclaw.paths`), so the path is the
    same from any directory.
    """
    if uri:
        return str(uri)
    root = str(base_dir()).replace("%", "%%")  # (a template: a literal % in the directory stays one)
    return os.path.join(root, "openclaw-data", "%(name)s", "deadletters.jsonl")


def store_path(uri: str) -> Path | None:
    """The absolute file of a file store's (expanded) *uri*, relative paths resolved as every path setting;
    None for a Redis URI. A ``ValueError`` for an unknown scheme or an empty path."""
    scheme = urlparse(uri).scheme.lower()
    if scheme in REDIS_SCHEMES:
        return None
    if scheme == "jsonl":
        path = uri[len("jsonl://") :]
    elif scheme in ("", "file") or len(scheme) == 1:  # a plain (or Windows drive) path
        path = uri[len("file://") :] if scheme == "file" else uri
    else:
        raise ValueError(
            f"dead-letter URI {mask_uri(uri)!r}: unsupported scheme {scheme!r} (use a path, jsonl:// or redis://)"
        )
    if not path:
        raise ValueError(f"dead-letter URI {uri!r} has no path")
    return resolve_path(path, setting="OPENCLAW_DLQ_URI")


def open_store(
    uri: str,
    *,
    spider: str | None = None,
    fsync_interval: float = 1.0,
    schedule: Callable[..., Any] | None = None,
) -> DeadLetterStore:
    """The store for *uri*: ``jsonl://path`` or a plain path, or ``redis://...``.

    ``%(name)s`` in the URI is the spider name. For Redis, ``?prefix=`` sets the
    key prefix (default ``openclaw:dlq``; the stream is ``<prefix>:<spider>``).
    """
    uri = expand_uri(str(uri), spider)
    path = store_path(uri)
    if path is None:
        prefix = parse_qs(urlparse(uri).query).get("prefix", ["openclaw:dlq"])[0]
        return RedisStore(uri, prefix=prefix, schedule=schedule)
    return JsonlStore(path, fsync_interval=fsync_interval)
