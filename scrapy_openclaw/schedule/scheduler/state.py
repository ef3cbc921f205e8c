"""The state the scheduler's parts share, and recording runs in the history.

:class:`SchedulerState` declares what ``Scheduler.__init__`` builds, so that
each part (:mod:`.crawls`, :mod:`.window`, the lifecycle in the package) reads
the same tasks, stores and running windows; recording is best effort and never
stops a run.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from twisted.internet.threads import deferToThread

from scrapy_openclaw.schedule.history import RunRecord

if TYPE_CHECKING:
    from pathlib import Path

    from scrapy.settings import BaseSettings

    from scrapy_openclaw.schedule.metrics import ScheduleMetrics
    from scrapy_openclaw.schedule.scheduler.crawls import WindowRun
    from scrapy_openclaw.schedule.tasks import Task
    from scrapy_openclaw.settings import OpenClawSettings

logger = logging.getLogger(__name__)


class SchedulerState:
    """What the scheduler's parts share (built in ``Scheduler.__init__``), and run recording."""

    reactor: Any
    tasks: list[Task]
    settings: BaseSettings
    config: OpenClawSettings
    cwd: str
    state_dir: Path
    lock_ttl: float
    stop_timeout: float
    node: str
    locks: Any
    history: Any
    cursors: Any
    metrics: ScheduleMetrics
    running: dict[str, WindowRun]
    stopping: bool

    async def _record_async(self, record: RunRecord) -> None:
        data = RunRecord.from_dict(record.to_dict())  # a copy: the thread must not see later changes
        try:
            await deferToThread(self.history.append, data)
        except Exception as exc:  # history is best effort: the run itself goes on
            logger.error(
                "Cannot record %(run)s in %(where)s: %(error)s",
                {"run": record.run_id, "where": self.history.describe(), "error": exc},
            )

    @staticmethod
    def _log_failure(failure: Any, what: str) -> None:
        logger.error(
            "Scheduler error while %(what)s: %(error)s",
            {"what": what, "error": failure.getErrorMessage()},
            exc_info=(failure.type, failure.value, failure.getTracebackObject()),
        )
