"""A worker's sign of life in Redis, sent by a thread of its own.

A lease lasts long enough that a busy worker never loses it, and waiting that
long to notice a killed worker would stall the crawl. So each worker keeps its
entry in the crawl's ``live`` set pushed ahead from a thread that a busy reactor
cannot stop (docs/distributed-workers.md, "Liveness and lease hand-back").
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from redis.exceptions import RedisError

logger = logging.getLogger(__name__)


class Liveness:
    """Pushes *worker*'s entry in the ``live`` sorted set (*key*) *ttl* seconds ahead, every *ttl* / 5."""

    def __init__(self, server: Any, key: str, worker: str, ttl: float, *, clock: Callable[[], float] = time.time):
        self.server, self.key, self.worker, self.ttl, self.clock = server, key, worker, ttl, clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="openclaw-liveness", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.ttl / 5):
            try:
                self.server.zadd(self.key, {self.worker: self.clock() + self.ttl})
            except RedisError as exc:  # the queue's own rounds report outages
                logger.debug("Liveness not sent: %(error)s", {"error": exc})

    def stop(self) -> None:
        """Stop the thread, without waiting for it (it ends after its current Redis call); the
        worker's last round leaves the crawl."""
        self._stop.set()
        self._thread = None
