"""Where the files the add-on reads and writes are: one rule for every path setting.

A path setting means the same file whatever the working directory (a cron job,
scrapyd, a test): absolute as it is, relative to the project root, or
``pkg://package/file`` for package data. The rule and the ``%(name)s`` /
``%(job)s`` names: docs/operating.md, "Where the files go".
"""

from __future__ import annotations

import os
import re
import sys
from importlib import resources
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy_openclaw.exceptions import OpenClawConfigError

if TYPE_CHECKING:
    from os import PathLike

    from scrapy.crawler import Crawler

PACKAGE_SCHEME = "pkg://"
_PACKAGE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
#: A job id that may name a directory (scrapyd's own are hex; a ``jobid`` given to schedule.json is the caller's).
_JOB = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def project_root() -> Path | None:
    """The directory of the project's ``scrapy.cfg``, or None outside a project.

    Found as Scrapy finds it (from the working directory up), else from the module
    ``SCRAPY_SETTINGS_MODULE`` names up, when that is a real file (not in an egg).
    """
    from scrapy.utils.conf import closest_scrapy_cfg

    cfg = closest_scrapy_cfg()
    if not cfg:
        settings_file = _settings_module_file()
        cfg = closest_scrapy_cfg(settings_file.parent) if settings_file else ""
    return Path(cfg).parent if cfg else None


def _settings_module_file() -> Path | None:
    """The file of ``SCRAPY_SETTINGS_MODULE`` when it is a real file (not inside an egg or a zip)."""
    name = os.environ.get("SCRAPY_SETTINGS_MODULE")
    if not name:
        return None
    module = sys.modules.get(name)
    origin = getattr(module, "__file__", None)
    if origin is None:
        try:
            spec = find_spec(name)
        except (ImportError, ValueError):
            return None
        origin = spec.origin if spec else None
    return Path(origin) if origin and os.path.isfile(origin) else None


def base_dir() -> Path:
    """What relative paths are relative to: the project root, else the working directory."""
    return project_root() or Path.cwd()


def job_id(spider: Any) -> str | None:
    """The id of the scheduler job running *spider*, None for a plain ``scrapy crawl``.

    scrapyd passes it as the ``_job`` spider argument (``-a _job=ID``); older
    scrapyd versions, and other runners, set ``SCRAPY_JOB`` in the environment.
    """
    job = getattr(spider, "_job", None) or os.environ.get("SCRAPY_JOB")
    return str(job) if job else None


def fill(value: str | PathLike[str], *, setting: str, name: str, job: str | None) -> str:
    """*value* with ``%(name)s`` (the spider's *name*) and ``%(job)s`` (the *job* id, :func:`job_id`) filled in."""
    text = str(value)
    if "%(" not in text:
        return text
    if "%(job)s" in text:
        if job is None:
            raise OpenClawConfigError(
                f"setting {setting}={text!r}: %(job)s needs a job id; scrapyd gives every job one, "
                "a plain crawl takes it as a spider argument: scrapy crawl SPIDER -a _job=ID"
            )
        if not _JOB.match(job):
            raise OpenClawConfigError(
                f"setting {setting}={text!r}: job id {job!r} cannot name a file "
                "(letters, digits, '.', '_' and '-' only, not first)"
            )
    try:
        return text % {"name": name, "job": job or ""}
    except (KeyError, ValueError, TypeError) as exc:
        raise OpenClawConfigError(
            f"setting {setting}={text!r}: only %(name)s and %(job)s may be substituted ({exc})"
        ) from None


def crawl_path(crawler: Crawler, value: str | PathLike[str], *, setting: str) -> Path:
    """The path setting *value* of *crawler*'s crawl: :func:`fill`, then :func:`resolve_path`."""
    spider = getattr(crawler, "spider", None) or crawler.spidercls
    filled = fill(value, setting=setting, name=spider.name, job=job_id(spider))
    return resolve_path(filled, setting=setting)


def is_package_path(value: str | PathLike[str]) -> bool:
    return str(value).startswith(PACKAGE_SCHEME)


def resolve_path(value: str | PathLike[str], *, setting: str) -> Path:
    """*value* of the path setting *setting* as an absolute path (``~`` expanded, relative to :func:`base_dir`)."""
    if is_package_path(value):
        raise OpenClawConfigError(
            f"setting {setting}={str(value)!r}: package data (pkg://) is read-only; give a directory or file path"
        )
    path = Path(value).expanduser()
    return path if path.is_absolute() else base_dir() / path


def describe(value: str | PathLike[str], *, setting: str) -> str:
    """How *value* resolved, for messages: the absolute path, and why when it was relative."""
    if is_package_path(value):
        return str(value)
    path = resolve_path(value, setting=setting)
    if Path(value).expanduser().is_absolute():
        return str(path)
    root = project_root()
    where = f"the project root {root}" if root else f"the working directory {Path.cwd()} (no scrapy.cfg found)"
    return f"{path} (relative to {where})"


def read_bytes(value: str | PathLike[str], *, setting: str, kind: str, limit: int) -> tuple[bytes, str]:
    """The contents of the file *value* names (a path or ``pkg://``), at most *limit* + 1 bytes, and its name.

    The name is the absolute path (or the ``pkg://`` form) for error messages;
    a file that cannot be read is a config error naming *setting* and where it looked.
    """
    if is_package_path(value):
        return _read_package_file(str(value), setting=setting, kind=kind, limit=limit), str(value)
    path = resolve_path(value, setting=setting)
    try:
        with open(path, "rb") as f:
            return f.read(limit + 1), str(path)
    except OSError as exc:
        raise OpenClawConfigError(
            f"setting {setting}: cannot read {kind} {describe(value, setting=setting)}: {exc.strerror}"
        ) from None


def _read_package_file(value: str, *, setting: str, kind: str, limit: int) -> bytes:
    package, _, name = value[len(PACKAGE_SCHEME) :].partition("/")
    parts = name.split("/")
    if not _PACKAGE.match(package) or not name or any(p in ("", ".", "..") for p in parts):
        raise OpenClawConfigError(
            f"setting {setting}={value!r}: expected pkg://PACKAGE/FILE (a file inside an importable package)"
        )
    try:
        resource = resources.files(package).joinpath(*parts)
        with resource.open("rb") as f:
            return f.read(limit + 1)
    except ModuleNotFoundError:
        reason = f"no package {package!r} can be imported"
    except (OSError, KeyError) as exc:  # (a zip's missing member is a KeyError on some Pythons)
        reason = getattr(exc, "strerror", None) or f"no file {name!r} in package {package!r}"
    except TypeError:  # a plain module, not a package
        reason = f"{package!r} is a module, not a package"
    raise OpenClawConfigError(
        f"setting {setting}: cannot read {kind} {value}: {reason} (is it listed as package data, "
        "so that it travels in the egg or wheel?)"
    )
