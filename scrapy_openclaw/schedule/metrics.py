"""Prometheus metrics of the scheduler itself (its own registry and optional endpoint).

``openclaw_schedule_runs_total{task,outcome}`` counts windows by how they
ended (success, failed, interrupted, missed, skipped) since this scheduler
started; ``openclaw_schedule_last_success_timestamp_seconds{task}`` is the end
of the task's latest successful run (seeded from the history at start), the
value to alert on ("no success for 2 days"); ``openclaw_schedule_running{task}``
is 1 while a window of the task runs.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from scrapy_openclaw._metrics_http import serve_metrics

if TYPE_CHECKING:
    from scrapy_openclaw.schedule.history import RunRecord

logger = logging.getLogger(__name__)


class ScheduleMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        self.runs = Counter(
            "openclaw_schedule_runs",
            "Scheduled windows by task and outcome.",
            ["task", "outcome"],
            registry=self.registry,
        )
        self.last_success = Gauge(
            "openclaw_schedule_last_success_timestamp_seconds",
            "End time (UNIX s) of the task's latest successful run.",
            ["task"],
            registry=self.registry,
        )
        self.running = Gauge(
            "openclaw_schedule_running", "1 while a window of the task is running.", ["task"], registry=self.registry
        )
        self._listening: Any = None

    def seed(self, runs: list[RunRecord]) -> None:
        for r in runs:
            if r.outcome == "success" and r.end:
                self.last_success.labels(r.task).set(max(r.end, self._value(r.task)))

    def _value(self, task: str) -> float:
        return self.registry.get_sample_value("openclaw_schedule_last_success_timestamp_seconds", {"task": task}) or 0.0

    def started(self, task: str) -> None:
        self.running.labels(task).set(1)

    def outcome(self, task: str, outcome: str, end: float | None = None) -> None:
        self.runs.labels(task, outcome).inc()
        if outcome not in ("missed", "skipped"):
            self.running.labels(task).set(0)
        if outcome == "success" and end:
            self.last_success.labels(task).set(end)

    def listen(self, reactor: Any, port: int, host: str, allowed_hosts: tuple[str, ...] = ()) -> None:
        """Serve ``/metrics`` from the reactor; a port in use is logged, the scheduler goes on."""
        from twisted.internet.error import CannotListenError

        try:
            self._listening = serve_metrics(reactor, port, host, self.registry, allowed_hosts=allowed_hosts)
        except CannotListenError as exc:
            logger.error(
                "Cannot serve the scheduler's metrics on %(host)s:%(port)s (OPENCLAW_SCHEDULE_METRICS_PORT): %(error)s",
                {"host": host, "port": port, "error": exc},
            )
            return
        logger.info(
            "Scheduler metrics on http://%(host)s:%(port)d/metrics",
            {"host": host, "port": self._listening.getHost().port},
        )

    def stop_listening(self) -> Any:
        listening, self._listening = self._listening, None
        return listening.stopListening() if listening is not None else None
