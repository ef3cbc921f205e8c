"""Distributed mode: control commands reach every worker through one Redis stream.

Per-domain overrides live in the shared health state, so every worker's pop obeys
them at once; the stream ``<spider>:control`` brings what state cannot (pause,
resume, close, commands from the CLI), read on a reactor timer. Every entry is
sealed with the store key, so anyone else who can write to Redis is refused.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid
from typing import TYPE_CHECKING, Any

from scrapy_openclaw.control.controller import ControlError
from scrapy_openclaw.distributed.connection import reply_text
from scrapy_openclaw.serialization import signing
from scrapy_openclaw.settings import OpenClawSettings

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from scrapy_openclaw.control.controller import Controller

logger = logging.getLogger(__name__)

MAXLEN = 1000  # entries kept in the stream (approximately)
READ_COUNT = 100
_FIELDS = ("command", "who", "origin", "at")
_PURPOSE = "control"
#: A command is a few hundred bytes; a larger entry is refused unread.
MAX_FIELD_BYTES = 4096
#: Seconds between two warnings about refused entries (the count says how many in between).
WARN_EVERY = 60.0


def stream_key(spider_name: str) -> str:
    return f"{spider_name}:control"


def publish(server: Any, spider_name: str, command: dict[str, Any], who: str, origin: str = "cli") -> str:
    """Append a validated command to the crawl's control stream; the entry id."""
    entry = {"command": json.dumps(command, sort_keys=True), "who": who, "origin": origin, "at": repr(time.time())}
    entry["mac"] = signing.current().mac(_PURPOSE, _signed_body(entry))
    eid = server.xadd(stream_key(spider_name), entry, maxlen=MAXLEN, approximate=True)
    return eid.decode() if isinstance(eid, bytes) else str(eid)


def _signed_body(fields: dict[str, str]) -> bytes:
    return json.dumps([fields.get(name, "") for name in _FIELDS]).encode("utf-8")


def sealed(fields: dict[str, str]) -> bool:
    """Whether a stream entry carries a valid seal (and no field is oversized)."""
    if any(len(v) > MAX_FIELD_BYTES for v in fields.values()):
        return False
    return signing.current().check(_PURPOSE, _signed_body(fields), fields.get("mac", ""))


class ControlChannel:
    """This worker's end of the control stream."""

    def __init__(self, crawler: Crawler, controller: Controller, server: Any, link: Any, poll: float):
        self.crawler = crawler
        self.controller = controller
        self.server = server
        self.link = link
        self.poll_interval = poll
        name = crawler.spidercls.name if crawler.spidercls else "openclaw"
        self.spider_name = name
        self.key = stream_key(name)
        from scrapy_openclaw.distributed.shards import ShardKeys

        queue_key = (crawler.settings.get("SCHEDULER_QUEUE_KEY") or "%(spider)s:requests") % {"spider": name}
        self._layout = ShardKeys(queue_key, name, OpenClawSettings.for_crawler(crawler).distributed_shards)
        self._reading = False
        self.worker = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.last_id = "$"
        self._loop: Any = None
        self._refused_unreported = 0
        self._warned_at = float("-inf")

    def start(self) -> None:
        """Read only what is sent from now on (overrides sent earlier are in the health state)."""
        from scrapy.utils.asyncio import create_looping_call

        def started(last: Any) -> None:
            self.last_id = reply_text(last[0][0]) if last else "0-0"

        def failed(exc: Exception) -> None:
            self.last_id = "0-0"
            logger.warning("Control stream %(key)s not readable yet: %(error)s", {"key": self.key, "error": exc})

        self.last_id = "0-0"
        self._reading = True  # no poll before the stream's end is known

        def done(last: Any = None) -> None:
            self._reading = False

        def started_then_done(last: Any) -> None:
            started(last)
            done()

        def failed_then_done(exc: Exception) -> None:
            failed(exc)
            done()

        self.link.submit(
            lambda: self.server.xrevrange(self.key, count=1),
            callback=started_then_done,
            errback=failed_then_done,
        )
        self._loop = create_looping_call(self.poll)
        self._loop.start(self.poll_interval, now=False)

    def stop(self) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None

    def publish(self, command: dict[str, Any], who: str) -> None:
        def failed(exc: Exception) -> None:
            logger.error(
                "Control command %(command)s not sent to the other workers (Redis: %(error)s); "
                "it applies to this worker only",
                {"command": command["command"], "error": exc},
            )

        self.link.submit(publish, self.server, self.spider_name, command, who, self.worker, errback=failed)

    def domain_changed(self, domain: str) -> None:
        """Let the queue's next pop look at *domain* at once (a held domain is indexed at its hold's end)."""
        key = self._layout.name("domains", self._layout.of(domain))
        # (if Redis fails, the next pop after the old time still finds it)
        self.link.submit(lambda: self.server.zadd(key, {domain: time.time()}, xx=True))

    def poll(self) -> None:
        if not self.link.ok() or self._reading:
            return
        self._reading = True

        def done(reply: Any = None) -> None:
            self._reading = False
            if reply:
                self._read(reply)

        self.link.submit(
            lambda: self.server.xread({self.key: self.last_id}, count=READ_COUNT),
            callback=done,
            errback=lambda exc: done(),
        )

    def _read(self, reply: Any) -> None:
        for _key, entries in reply or ():
            for eid, fields in entries:
                self.last_id = reply_text(eid)
                self._apply({reply_text(k): reply_text(v) for k, v in fields.items()})

    def _apply(self, fields: dict[str, str]) -> None:
        if not sealed(fields):
            self._refused(fields)
            return
        if fields.get("origin") == self.worker:
            return  # applied when it was taken
        who = "".join(ch for ch in fields.get("who", "") if ch.isprintable())[:80] or "anonymous"
        try:
            self.controller.execute(json.loads(fields.get("command", "")), who=who, via="redis")
        except (ValueError, ControlError) as exc:  # (the stream is untrusted input)
            self.crawler.stats.inc_value("openclaw/control/invalid")
            logger.warning(
                "Ignoring an invalid control command from Redis (%(key)s): %(error)s", {"key": self.key, "error": exc}
            )

    def _refused(self, fields: dict[str, str]) -> None:
        """Count an entry without a valid seal; warn at most every :data:`WARN_EVERY` seconds."""
        self.crawler.stats.inc_value("openclaw/control/refused")
        self._refused_unreported += 1
        now = time.monotonic()
        if now - self._warned_at < WARN_EVERY:
            return
        self._warned_at = now
        logger.warning(
            "Refused %(n)d control command(s) from Redis (%(key)s) without a valid store key seal, not run "
            "(latest: %(command)r); anyone who can write to this Redis can add them",
            {"n": self._refused_unreported, "key": self.key, "command": fields.get("command", "")[:80]},
        )
        self._refused_unreported = 0
