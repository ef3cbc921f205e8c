"""Request deadlines: the default from the domain's policy, and what happens once one has passed.

Past its deadline a request is boosted to the front or dropped as a dead letter
(reason ``deadline_expired``), by the policy's ``expired``; see
:mod:`scrapy_openclaw._heaps` for how aging towards the deadline stays O(log n).
"""

from __future__ import annotations

import heapq
import logging
import math
from typing import TYPE_CHECKING, cast

from scrapy_openclaw import meta as M
from scrapy_openclaw import signals as openclaw_signals
from scrapy_openclaw.deadletter import for_request
from scrapy_openclaw.delay import request_class
from scrapy_openclaw.pqueues.domains import DomainQueues
from scrapy_openclaw.settings import crawl_id

if TYPE_CHECKING:
    from scrapy import Request, Spider

logger = logging.getLogger(__name__)


class Deadlines(DomainQueues):
    """Part of DeadlinePriorityQueue: default deadlines, and the expired policy applied in deadline order."""

    def _apply_default_deadline(self, request: Request, domain: str, now: float) -> None:
        if M.DEADLINE in request.meta:
            return
        policy = self.policies.for_domain(domain).deadline
        seconds = policy.classes.get(request_class(request, self.stats) or "", policy.default)
        if seconds is not None:
            request.meta[M.DEADLINE] = now + seconds
            self.stats.inc_value("openclaw/queue/deadline/defaulted")

    def _deadline(self, request: Request) -> float | None:
        value = request.meta.get(M.DEADLINE)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            logger.warning(
                "Ignoring meta[%(key)r]=%(value)r of %(request)s: expected a UNIX time (float)",
                {"key": M.DEADLINE, "value": value, "request": request},
                extra={"spider": self.crawler.spider},
            )
            self.stats.inc_value("openclaw/queue/deadline/invalid")
            return None
        return float(value) if math.isfinite(value) else None

    def _sweep_expired(self, now: float) -> None:
        """Apply the expired policy to every deadline that has passed, in deadline order."""
        while self._expiry and self._expiry[0][0] <= now:
            _, _, entry = heapq.heappop(self._expiry)
            if not entry.live:
                continue
            self._expired_total += 1
            dq = entry.owner
            if dq.expired_mode == "drop":
                dq.discard(entry)
                self._after_take(dq)
                self._dead_letter(entry.request)
            else:
                dq.boost_expired(entry)
                self._rekey(dq)
                self.stats.inc_value("openclaw/queue/expired/boosted")

    def _dead_letter(self, request: Request) -> None:
        spider = self.crawler.spider
        self.stats.inc_value("openclaw/queue/expired/dropped")
        logger.info(
            "Dropping %(request)s: its deadline passed before it could be sent",
            {"request": request},
            extra={"spider": spider},
        )
        letter = for_request(
            request,
            spider=cast("Spider", spider),  # set while the crawl runs, when deadlines pass
            crawl_id=crawl_id(self.crawler),
            error_class="deadline",
            reason="deadline_expired",
        )
        self.crawler.signals.send_catch_log(signal=openclaw_signals.dead_letter, dead_letter=letter, spider=spider)
