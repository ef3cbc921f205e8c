"""Where the politeness report is kept (a JSON file beside the dead letters) and reading it back."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # (not on Windows: no lock, each write is still atomic)
    fcntl = None  # type: ignore[assignment]

from scrapy_openclaw._files import atomic_write
from scrapy_openclaw.exceptions import OpenClawConfigError
from scrapy_openclaw.paths import base_dir, fill, resolve_path
from scrapy_openclaw.report.model import ReportError, validate
from scrapy_openclaw.settings import OpenClawSettings

FILE_NAME = "report.json"


def report_path(config: OpenClawSettings, spider: str, job: str | None = None) -> Path:
    """``OPENCLAW_REPORT_PATH`` (``%(name)s``: the spider, ``%(job)s``: the scrapyd job), else
    ``<project>/openclaw-data/<spider>/report.json``, where the dead letters live by default."""
    path = config.report_path
    if path:
        try:
            text = fill(os.fspath(path), setting="OPENCLAW_REPORT_PATH", name=spider, job=job)
        except OpenClawConfigError as exc:
            raise ReportError(str(exc)) from None
        return resolve_path(text, setting="OPENCLAW_REPORT_PATH")
    return Path(base_dir(), "openclaw-data", spider, FILE_NAME)


@contextmanager
def report_lock(path: Path | None) -> Iterator[None]:
    """The processes of one machine writing *path* one at a time (``<path>.lock``, ``flock``)."""
    try:
        if path is None or fcntl is None:
            raise OSError
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path.with_name(path.name + ".lock"), "a")  # (closed below)
    except OSError:  # (no lock to take: the write says what is wrong with the place)
        yield
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def write_report(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(report, indent=1).encode())


def read_report(path: Path) -> dict[str, Any]:
    """The report stored at *path*; a one-line :class:`ReportError` naming the file otherwise."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ReportError(f"{path}: no politeness report here (a crawl writes one when it closes)") from None
    except OSError as exc:
        raise ReportError(f"{path}: cannot read the report: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ReportError(f"{path}: not a politeness report (not UTF-8 text: {exc.reason})") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ReportError(f"{path}: not JSON ({exc})") from None
    return validate(data, str(path))
