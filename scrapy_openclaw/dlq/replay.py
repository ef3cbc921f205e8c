"""Replaying dead letters: a crawl of the spider that starts from them.

``scrapy openclaw-dlq replay SPIDER`` registers a :class:`ReplayPlan` for the
crawler (through :mod:`scrapy_openclaw.runtime`) and enables
:class:`ReplayStartMiddleware`, which replaces the spider's start requests with
the dead letters' requests (:func:`select`). docs/dead-letters.md, "Replay".
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from scrapy.exceptions import NotConfigured

from scrapy_openclaw import meta as M
from scrapy_openclaw.deadletter import ENGINE_META
from scrapy_openclaw.redact import mask_uri
from scrapy_openclaw.runtime import peek
from scrapy_openclaw.serialization import RefusedRequest, SerializationError, request_from_data

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
    """The request to send again for *record*; ``SerializationError`` if it has none or may not be sent.

    It bypasses the duplicate filter (``dont_filter``: a persistent one saw it
    already) and nothing else: Scrapy's offsite filter lets ``dont_filter``
    requests pass, so the spider's ``allowed_domains`` are checked here, as
    the crawl that stored it would have (its own ``allow_offsite`` or
    ``dont_filter`` still count).
    """
    if not record.request:
        raise SerializationError(f"dead letter {record.id} ({record.error_class}) holds no request")
    request = request_from_data(record.request, spider=spider)
    if not (request.dont_filter or request.meta.get("allow_offsite")) and not is_allowed(request.url, spider):
        raise RefusedRequest(
            f"request {mask_uri(request.url)}: offsite (not in the spider's allowed_domains)",
            kind="offsite",
            url=request.url,
        )
    meta = {k: v for k, v in request.meta.items() if k not in _RESET_META}
    meta[M.REPLAY_OF] = record.id
    return request.replace(meta=meta, dont_filter=True)


def is_allowed(url: str, spider: Spider | None) -> bool:
    """Whether Scrapy's offsite filter lets *url* through for *spider* (its host in ``allowed_domains``)."""
    allowed = getattr(spider, "allowed_domains", None)
    if not allowed:
        return True
    domains = [allowed] if isinstance(allowed, str) else list(allowed)
    host = (urlsplit(url).hostname or "").lower()
    for domain in domains:
        domain = str(domain).lower().rpartition("://")[2].partition("/")[0].partition(":")[0]
        if host == domain or host.endswith("." + domain):
            return True
    return False


def plan_requests(records: list[DeadLetter], spider: Spider | None) -> tuple[list[tuple[str, Request]], dict[str, str]]:
    """``([(record id, request to send)], {record id: why it is skipped})``: the replay and its dry run."""
    requests: list[tuple[str, Request]] = []
    skipped: dict[str, str] = {}
    for record in records:
        try:
            requests.append((record.id, replay_request(record, spider)))
        except SerializationError as exc:
            skipped[record.id] = str(exc)
    return requests, skipped


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
        planned, skipped = plan_requests(self.plan.records, spider)
        for id_, why in skipped.items():
            self.plan.skipped[id_] = why
            self.crawler.stats.inc_value("openclaw/dlq/replay_skipped")
            logger.warning(
                "Not replaying dead letter %(id)s: %(error)s", {"id": id_, "error": why}, extra={"spider": spider}
            )
        self.plan.injected.extend(id_ for id_, _ in planned)
        refused = getattr(self.plan.store, "refused", 0)
        if refused:
            self.crawler.stats.set_value("openclaw/dlq/refused", refused)
        requests = [request for _, request in planned]
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
