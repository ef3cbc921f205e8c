"""Run real Scrapy crawls in a child process (``runcrawl``) and read back what they left."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy_openclaw.testing.runcrawl import ITEMS_FILE, LOG_FILE, STATS_FILE
from scrapy_openclaw.testing.servers import started, stop_process, subprocess_env

if TYPE_CHECKING:
    from collections.abc import Mapping

DEFAULT_SPIDER = "scrapy_openclaw.testing.spiders.ChaosSpider"
STDERR_FILE = "stderr.log"


@dataclass
class CrawlResult:
    returncode: int | None
    items: list[dict[str, Any]]
    stats: dict[str, Any]
    log: str
    out_dir: Path

    def assert_ok(self) -> CrawlResult:
        """Assert the crawl exited 0 and logged no traceback (the log's end as the message); the
        result, so a test can write ``result = run_crawl(...).assert_ok()``."""
        assert self.returncode == 0 and "Traceback" not in self.log, self.log[-3000:]
        return self


class CrawlTimeout(TimeoutError):
    """The crawl did not finish in time (the process was killed)."""


def start_crawl(
    spider: str = DEFAULT_SPIDER,
    settings: Mapping[str, Any] | None = None,
    spider_args: Mapping[str, Any] | None = None,
    out_dir: str | Path | None = None,
    profile: str | Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``runcrawl`` and return the process at once; ``proc.out_dir`` is where results land
    (stdout/stderr in ``out_dir/stderr.log``). Read them with ``read_result(proc.out_dir)``.

    List values in ``spider_args`` are joined with commas (``start_urls``). With ``profile``
    the crawl runs under cProfile and its stats are dumped to that file.
    """
    out = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="openclaw-crawl-"))
    out.mkdir(parents=True, exist_ok=True)
    settings_path = out / "settings.json"
    settings_path.write_text(json.dumps(dict(settings or {})), encoding="utf-8")
    cmd = [
        sys.executable,
        "-m",
        "scrapy_openclaw.testing.runcrawl",
        "--spider",
        spider,
        "--settings-json",
        str(settings_path),
        "--out",
        str(out),
    ]
    if profile is not None:
        cmd += ["--profile", str(profile)]
    for key, value in (spider_args or {}).items():
        if isinstance(value, (list, tuple)):
            value = ",".join(map(str, value))
        cmd += ["-a", f"{key}={value}"]
    with open(out / STDERR_FILE, "wb") as stderr:
        proc = started(
            subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=stderr, stderr=subprocess.STDOUT, env=subprocess_env()
            )
        )
    proc.out_dir = out  # type: ignore[attr-defined]
    return proc


def read_result(out_dir: str | Path, returncode: int | None = None) -> CrawlResult:
    """What a crawl left in ``out_dir``; missing files read as empty (e.g. after kill -9)."""
    out = Path(out_dir)
    items = []
    items_path = out / ITEMS_FILE
    if items_path.exists():
        lines = [ln for ln in items_path.read_text(encoding="utf-8").splitlines() if ln.strip()]
        for n, line in enumerate(lines, 1):
            try:
                items.append(json.loads(line))
            except ValueError:
                if n < len(lines):
                    raise
                # a torn last line: the crawl was killed mid-write
    stats_path = out / STATS_FILE
    stats = json.loads(stats_path.read_text(encoding="utf-8")) if stats_path.exists() else {}
    log = _read_text(out / LOG_FILE)
    stderr = _read_text(out / STDERR_FILE)
    if stderr.strip():
        log += f"\n--- stdout/stderr ---\n{stderr}"
    return CrawlResult(returncode, items, stats, log, out)


def _read_text(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""


def run_crawl(
    spider: str = DEFAULT_SPIDER,
    settings: Mapping[str, Any] | None = None,
    spider_args: Mapping[str, Any] | None = None,
    timeout: float = 120,
    out_dir: str | Path | None = None,
) -> CrawlResult:
    """Run one crawl to the end; kill it and raise ``CrawlTimeout`` (with the log tail) after ``timeout``."""
    proc = start_crawl(spider, settings, spider_args, out_dir)
    out: Path = proc.out_dir  # type: ignore[attr-defined]
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)
        tail = read_result(out, proc.returncode).log[-4000:]
        raise CrawlTimeout(f"crawl did not finish within {timeout}s (killed); log tail:\n{tail}") from None
    finally:
        if proc.poll() is None:
            stop_process(proc)
    return read_result(out, proc.returncode)


#: The add-on on its defaults, and nothing else a user might not have (no dead-letter file).
ON_DEFAULTS = {"ADDONS": {"scrapy_openclaw.Addon": 100}, "OPENCLAW_DLQ_ENABLED": False}


def crawl_on_defaults(start_urls: list[str], timeout: float = 300, **settings: Any) -> CrawlResult:
    """A plain spider (``ChaosSpider``: none of our hooks) crawling *start_urls* with the add-on
    on its defaults (plus *settings*), to a clean end (:meth:`CrawlResult.assert_ok`)."""
    result = run_crawl(settings={**ON_DEFAULTS, **settings}, spider_args={"start_urls": start_urls}, timeout=timeout)
    return result.assert_ok()
