"""Optional Spidermon monitors for the dead-letter thresholds (``pip install spidermon``).

The same thresholds as the DeadLetterPipeline's own alert, checked at close by
Spidermon so that its actions (Slack, e-mail, a failed job) apply; the settings
are in docs/monitoring.md, "Spidermon".
"""

from __future__ import annotations

try:
    from spidermon import MonitorSuite, monitors
    from spidermon.contrib.scrapy.monitors.base import BaseScrapyMonitor
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("scrapy_openclaw.monitors needs Spidermon: pip install spidermon") from exc

from scrapy_openclaw.settings import OpenClawSettings, field_name


@monitors.name("scrapy-openclaw dead letters")
class DeadLetterMonitor(BaseScrapyMonitor):
    """Dead letters stay within OPENCLAW_DLQ_ALERT_COUNT and OPENCLAW_DLQ_ALERT_RATIO (0: no limit)."""

    def _setting(self, name: str) -> float:
        return getattr(OpenClawSettings.for_crawler(self.crawler), field_name(name))

    @monitors.name("Dead-letter count")
    def test_dead_letter_count(self) -> None:
        limit = self._setting("OPENCLAW_DLQ_ALERT_COUNT")
        if not limit:
            self.skipTest("OPENCLAW_DLQ_ALERT_COUNT is 0")
        count = self.data.stats.get("openclaw/dlq/count", 0)
        self.assertLess(count, limit, msg=f"{count} dead letters >= OPENCLAW_DLQ_ALERT_COUNT={limit}")

    @monitors.name("Dead-letter ratio")
    def test_dead_letter_ratio(self) -> None:
        limit = self._setting("OPENCLAW_DLQ_ALERT_RATIO")
        if not limit:
            self.skipTest("OPENCLAW_DLQ_ALERT_RATIO is 0")
        requests = self.data.stats.get("downloader/request_count", 0)
        if requests < max(1, self._setting("OPENCLAW_DLQ_ALERT_MIN_REQUESTS")):
            self.skipTest(f"only {requests} requests (OPENCLAW_DLQ_ALERT_MIN_REQUESTS)")
        count = self.data.stats.get("openclaw/dlq/count", 0)
        self.assertLessEqual(
            count / requests,
            limit,
            msg=f"{count} dead letters for {requests} requests > OPENCLAW_DLQ_ALERT_RATIO={limit}",
        )


class DeadLetterMonitorSuite(MonitorSuite):
    monitors = [DeadLetterMonitor]
