"""Replaying dead letters: a crawl of the spider that starts from them.

``scrapy openclaw-dlq replay SPIDER`` registers a :class:`ReplayPlan` for the
crawler (through :mod:`scrapy_openclaw.runtime`) and enables
:class:`ReplayStartMiddleware`, which replaces the spider's own start
requests with the dead letters' requests: one per URL fingerprint (the newest
record; see :func:`select`), ``protocol_permanent`` and ``domain_down`` letters
only when asked. Records are marked in place: ``replayed_at``,
``replay_outcome`` (``sent``, then ``recovered`` or ``failed``; older copies of
the same URL ``duplicate``); a page that fails again updates its own record
(:meth:`ReplayPlan.failed_again`, called by the dead-letter pipeline) instead of
adding a new one. Links the callbacks follow are
crawled as usual, so a recovered page's subtree is scraped too. A record
whose request cannot be rebuilt, or is refused as stored data (scheme,
callback, meta: see :func:`~scrapy_openclaw.serialization.request_from_data`),
is skipped, logged and counted (``openclaw/dlq/replay_skipped``); the others
are still replayed.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from scrapy.exceptions import NotConfigured

from scrapy_openclaw import meta as M
from scrapy_openclaw.deadletter import ENGINE_META
from scrapy_openclaw.runtime import peek
from scrapy_openclaw.serialization import SerializationError, request_from_data

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler

    from scrapy_openclaw.deadletter import DeadLetter
    from scrapy_openclaw.dlq.stores import DeadLetterStore

logger = logging.getLogger(__name__)

PLAN_KEY = "openclaw_dlq_replay"

#: Meta keys of the failed attempt that must not carry over: a replay starts
#: with a fresh retry budget and no expired deadline or backoff time.
_RESET_META = ENGINE_META | {M.DEADLINE}

#: Error classes a replay leaves out unless asked (``--class``, ``--all``): the
#: server said the page is gone, or the whole domain was given up.
HELD_BACK = frozenset({"protocol_permanent", "domain_down"})


def fingerprint(record: DeadLetter) -> tuple[str, str, str]:
    """What makes two dead letters the same request: method, canonical URL, body."""
    from w3lib.url import canonicalize_url

    body = (record.request or {}).get("body")
    return record.method.upper(), canonicalize_url(record.url), json.dumps(body, sort_keys=True, default=str)


def select(
    records: list[DeadLetter], *, everything: bool = False
) -> tuple[list[DeadLetter], list[DeadLetter], list[DeadLetter]]:
    """(to send, older duplicates, held back) among replayable *records*.

    One record per :func:`fingerprint`, the newest; classes in :data:`HELD_BACK`
    are held back unless *everything*.
    """
    held = [] if everything else [r for r in records if r.error_class in HELD_BACK]
    newest: dict[tuple[str, str, str], DeadLetter] = {}
    for record in sorted(
        (r for r in records if everything or r.error_class not in HELD_BACK), key=lambda r: r.created_at
    ):
        newest[fingerprint(record)] = record
    chosen = {r.id for r in newest.values()}
    send = [r for r in records if r.id in chosen]
    duplicates = [r for r in records if r.id not in chosen and (everything or r.error_class not in HELD_BACK)]
    return send, duplicates, held


def replay_request(record: DeadLetter, spider: Spider | None = None) -> Request:
    """The request to send again for *record*; ``SerializationError`` if it has none."""
    if not record.request:
        raise SerializationError(f"dead letter {record.id} ({record.error_class}) holds no request")
    request = request_from_data(record.request, spider=spider)
    meta = {k: v for k, v in request.meta.items() if k not in _RESET_META}
    meta[M.REPLAY_OF] = record.id
    return request.replace(meta=meta, dont_filter=True)


@dataclass
class ReplayPlan:
    """What to replay and where to mark it; ``injected`` is filled by the middleware."""

    store: DeadLetterStore
    records: list[DeadLetter]
    duplicates: list[DeadLetter] = field(default_factory=list)
    injected: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # id -> why
    failed: dict[str, DeadLetter] = field(default_factory=dict)  # id -> the updated record
    sent: dict[str, DeadLetter] = field(default_factory=dict)  # id -> as marked in the store

    def mark_sent(self) -> None:
        """Mark the injected records ``sent`` and their older copies ``duplicate``, in place."""
        now = time.time()
        sent = {r.id: r for r in self.records if r.id in set(self.injected)}
        by_key = {fingerprint(r): r.id[:12] for r in sent.values()}
        changed = [replace(r, replayed_at=now, replay_outcome="sent", replays=r.replays + 1) for r in sent.values()]
        changed += [
            replace(r, replayed_at=now, replay_outcome=f"duplicate of {by_key[fingerprint(r)]}")
            for r in self.duplicates
            if fingerprint(r) in by_key
        ]
        self.store.update(changed)
        self.sent = {r.id: r for r in changed if r.id in sent}

    def failed_again(self, letter: DeadLetter) -> bool:
        """Update the replayed record with its new failure; False if *letter* replays none of ours."""
        original = self.sent.get(letter.replay_of or "")
        if original is None:
            return False
        updated = replace(
            original,
            error_class=letter.error_class,
            reason=letter.reason,
            status=letter.status,
            attempts=original.attempts + letter.attempts,
            exception_type=letter.exception_type,
            exception_message=letter.exception_message,
            traceback=letter.traceback,
            last_attempt_at=letter.last_attempt_at,
            replay_outcome="failed",
        )
        self.store.update([updated])
        self.failed[original.id] = updated
        self.sent[original.id] = updated
        return True

    def finish(self) -> int:
        """Mark the sent records that did not fail again ``recovered``; returns how many."""
        done = [replace(r, replay_outcome="recovered") for r in self.sent.values() if r.replay_outcome == "sent"]
        self.store.update(done)
        return len(done)


class ReplayStartMiddleware:
    """Spider middleware: the crawl starts from the plan's dead letters only."""

    def __init__(self, crawler: Crawler, plan: ReplayPlan):
        self.crawler = crawler
        self.plan = plan

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> ReplayStartMiddleware:
        plan = peek(crawler, PLAN_KEY)
        if plan is None:
            raise NotConfigured
        return cls(crawler, plan)

    async def process_start(self, start: AsyncIterator[Any]) -> AsyncIterator[Any]:
        # The spider's own start is deliberately not iterated.
        spider = self.crawler.spider
        requests = []
        for record in self.plan.records:
            try:
                requests.append(replay_request(record, spider))
            except SerializationError as exc:
                self.plan.skipped[record.id] = str(exc)
                self.crawler.stats.inc_value("openclaw/dlq/replay_skipped")
                logger.warning(
                    "Not replaying dead letter %(id)s: %(error)s",
                    {"id": record.id, "error": exc},
                    extra={"spider": spider},
                )
                continue
            self.plan.injected.append(record.id)
        # Marked once the crawl is under way, before anything is sent, so that
        # two replays never send the same dead letter twice.
        self.plan.mark_sent()
        self.crawler.stats.set_value("openclaw/dlq/replayed", len(self.plan.injected))
        logger.info(
            "Replaying %(n)d dead letter(s) from %(uri)s (%(skipped)d skipped)",
            {"n": len(requests), "uri": self.plan.store.uri, "skipped": len(self.plan.skipped)},
            extra={"spider": spider},
        )
        for request in requests:
            yield request
