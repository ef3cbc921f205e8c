"""Request deadlines: the default from the domain's policy, and the deadlines that have passed, in order.

Past its deadline a request is boosted to the front or dropped as a dead letter
(reason ``deadline_expired``), by the policy's ``expired``; see
:mod:`scrapy_openclaw.pqueues.heaps` for how aging towards the deadline stays O(log n).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import sys
from typing import TYPE_CHECKING, Any, cast

from scrapy_openclaw import meta as M
from scrapy_openclaw import signals as openclaw_signals
from scrapy_openclaw.deadletter import for_request
from scrapy_openclaw.delay import request_class
from scrapy_openclaw.pqueues.heaps import Timed
from scrapy_openclaw.settings import crawl_id

if TYPE_CHECKING:
    from collections.abc import Iterator

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler

    from scrapy_openclaw.policy import PolicySet
    from scrapy_openclaw.pqueues.heaps import DomainQueue

logger = logging.getLogger(__name__)


class Deadlines:
    """The deadline of each queued request, in deadline order, and the expired ones' fate."""

    def __init__(self, crawler: Crawler, policies: PolicySet):
        self.crawler = crawler
        self.stats = crawler.stats
        self.policies = policies
        self.expired_total = 0
        self._expiry: list[tuple[float, int, Timed]] = []  # every deadline entry, by deadline
        self._seq = itertools.count()

    def apply_default(self, request: Request, domain: str, now: float) -> None:
        """Write the domain policy's deadline for the request's class into a request that has none."""
        if M.DEADLINE in request.meta:
            return
        policy = self.policies.for_domain(domain).deadline
        seconds = policy.classes.get(request_class(request, self.stats) or "", policy.default)
        if seconds is not None:
            request.meta[M.DEADLINE] = now + seconds
            self.stats.inc_value("openclaw/queue/deadline/defaulted")

    def track(self, request: Request, dq: DomainQueue) -> Timed | None:
        """The deadline entry for *request* about to join *dq* (None: it has no valid deadline)."""
        deadline = self._deadline(request)
        if deadline is None:
            return None
        seq = next(self._seq)
        entry = Timed(request, deadline, seq, dq)
        heapq.heappush(self._expiry, (deadline, seq, entry))
        return entry

    def any_passed(self, now: float) -> bool:
        """Whether a deadline has passed by *now* (cheap: checked on every pop)."""
        return bool(self._expiry) and self._expiry[0][0] <= now

    def passed(self, now: float) -> Iterator[Timed]:
        """The queued requests whose deadline has passed by *now*, in deadline order (each once)."""
        while self._expiry and self._expiry[0][0] <= now:
            _, _, entry = heapq.heappop(self._expiry)
            if entry.live:
                self.expired_total += 1
                yield entry

    def dead_letter(self, request: Request) -> None:
        """Send *request*, dropped past its deadline, out as a dead letter."""
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

    def overhead_bytes(self) -> float:
        """An estimate of the deadline entries: each one's Timed, its expiry and aging tuples, their floats."""
        if not self._expiry:
            return 0.0
        deadline, _, entry = self._expiry[0]
        tuple_bytes = sys.getsizeof(self._expiry[0]) + 8
        return len(self._expiry) * (sys.getsizeof(entry) + 2 * tuple_bytes + 2 * sys.getsizeof(deadline))

    def _deadline(self, request: Request) -> float | None:
        value: Any = request.meta.get(M.DEADLINE)
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
