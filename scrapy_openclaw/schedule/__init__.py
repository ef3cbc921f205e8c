"""Scheduled crawls: ``scrapy openclaw-schedule TASKS.yaml`` and its pieces.

* :mod:`~scrapy_openclaw.schedule.tasks` -- the tasks file (schema there);
* :mod:`~scrapy_openclaw.schedule.scheduler` -- the foreground loop;
* :mod:`~scrapy_openclaw.schedule.locks` -- one run per window (Redis or lock files);
* :mod:`~scrapy_openclaw.schedule.history` -- run history and missed windows;
* :mod:`~scrapy_openclaw.schedule.cursor` -- the incremental cursor (contract there);
* :class:`RunStatsExtension` -- enabled by the scheduler on each crawl it starts.
"""

from scrapy_openclaw.schedule.cursor import FileCursors, RedisCursors
from scrapy_openclaw.schedule.extension import RunStatsExtension
from scrapy_openclaw.schedule.history import History, JsonlHistory, RedisHistory, RunRecord, missed_windows
from scrapy_openclaw.schedule.locks import FileLocks, RedisLocks
from scrapy_openclaw.schedule.tasks import CURSOR_ARG, Task, load_tasks, window_id

__all__ = [
    "CURSOR_ARG",
    "FileCursors",
    "FileLocks",
    "History",
    "JsonlHistory",
    "RedisCursors",
    "RedisHistory",
    "RedisLocks",
    "RunRecord",
    "RunStatsExtension",
    "Task",
    "load_tasks",
    "missed_windows",
    "window_id",
]
