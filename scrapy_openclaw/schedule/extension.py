"""RunStatsExtension: what a scheduled crawl tells its scheduler, written at close.

The scheduler enables it with ``OPENCLAW_SCHEDULE_RUN_FILE``; at ``spider_closed``
it writes that file with the crawl's stats, finish reason and, for incremental
tasks, the final cursor. It also makes sure a crawl never outlives its scheduler.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import NotConfigured
from scrapy.utils.asyncio import create_looping_call

from scrapy_openclaw._files import atomic_write, private_dir
from scrapy_openclaw.paths import resolve_path
from scrapy_openclaw.schedule.tasks import CURSOR_ARG
from scrapy_openclaw.settings import OpenClawSettings

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)  # datetimes and the like


#: Environment variable with the scheduler's pid (set by the scheduler on each crawl).
PARENT_ENV = "OPENCLAW_SCHEDULER_PID"
#: Seconds between checks that the scheduler is still there.
PARENT_CHECK = 1.0
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> bool:
    """Ask Linux to SIGTERM this process when its parent dies; False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class RunStatsExtension:
    """Writes the run file at close and decodes the cursor the scheduler passed as JSON.

    A crawl must not outlive its scheduler (killed with SIGKILL, the scheduler cannot
    stop it): on Linux the kernel sends the crawl SIGTERM when the scheduler dies
    (``PR_SET_PDEATHSIG``); everywhere, a timer notices that the parent process changed,
    stops the crawl and, if it has not ended ``OPENCLAW_SCHEDULE_STOP_TIMEOUT`` seconds
    later, kills it.
    """

    def __init__(self, crawler: Crawler, path: Path):
        self.crawler, self.path = crawler, path
        crawler.signals.connect(self.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(self.spider_closed, signal=signals.spider_closed)
        self._parent: int | None = None
        self._kernel_watch = False
        self._orphaned_at: float | None = None
        self._watch: Any = None
        self._grace = OpenClawSettings.for_crawler(crawler).schedule_stop_timeout
        parent = os.environ.get(PARENT_ENV, "")
        if parent.isdigit():
            self._parent = int(parent)
            # the scheduler may already be gone (then the kernel never signals): checked by the timer
            self._kernel_watch = _die_with_parent() and os.getppid() == self._parent

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> RunStatsExtension:
        path = OpenClawSettings.for_crawler(crawler).schedule_run_file
        if not path:
            raise NotConfigured
        return cls(crawler, resolve_path(path, setting="OPENCLAW_SCHEDULE_RUN_FILE"))

    def _check_parent(self) -> None:
        if self._parent is None or os.getppid() == self._parent:
            return
        now = time.monotonic()
        if self._orphaned_at is None:
            self._orphaned_at = now
            logger.error(
                "The scheduler (pid %(pid)d) that started this crawl is gone; stopping the crawl "
                "(its checkpoint is kept for the next attempt)",
                {"pid": self._parent},
            )
            if not self._kernel_watch:  # else the kernel has sent SIGTERM already: a second one would force it
                os.kill(os.getpid(), signal.SIGTERM)
        elif now - self._orphaned_at > self._grace:
            logger.error("Still running %(t).0fs after the scheduler died: killing the crawl", {"t": self._grace})
            os.kill(os.getpid(), signal.SIGKILL)

    def spider_opened(self, spider: Spider) -> None:
        if self._parent is not None:
            self._watch = create_looping_call(self._check_parent)
            self._watch.start(PARENT_CHECK, now=True)
        raw = getattr(spider, CURSOR_ARG, None)
        if isinstance(raw, str):
            try:
                setattr(spider, CURSOR_ARG, json.loads(raw))
            except ValueError:
                logger.error(
                    "-a %(arg)s is not JSON: %(raw)r; the cursor stays a string",
                    {"arg": CURSOR_ARG, "raw": raw[:200]},
                    extra={"spider": spider},
                )

    def spider_closed(self, spider: Spider, reason: str) -> None:
        data: dict[str, Any] = {
            "finish_reason": reason,
            "stats": _json_safe(self.crawler.stats.get_stats() if self.crawler.stats else {}),
        }
        if hasattr(spider, CURSOR_ARG):
            cursor = getattr(spider, CURSOR_ARG)
            try:
                json.dumps(cursor)
                data["cursor"] = cursor
            except (TypeError, ValueError):
                logger.error(
                    "spider.%(arg)s = %(value)r cannot be stored as JSON; the cursor is not updated",
                    {"arg": CURSOR_ARG, "value": cursor},
                    extra={"spider": spider},
                )
                data["cursor_error"] = repr(cursor)[:200]
        private_dir(self.path.parent)
        atomic_write(self.path, json.dumps(data, sort_keys=True).encode("utf-8"))
