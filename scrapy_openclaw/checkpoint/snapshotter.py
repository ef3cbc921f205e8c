"""Writing snapshot files, in the foreground or in a thread, and dropping what they replace.

A snapshot of millions of requests takes seconds to write; in the background
the crawl goes on (the journal has already moved to the next generation) and
the outcome is handled on the reactor thread when the thread ends. One write
at a time, in generation order. Until one succeeds, recovery uses the
previous snapshot and every journal since.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scrapy_openclaw.checkpoint.refusal import refuses
from scrapy_openclaw.checkpoint.state import generations, journal_path, snapshot_path

logger = logging.getLogger(__name__)

Outcome = tuple[int, float] | Exception  # (bytes, seconds) or the error
WriteFile = Callable[[Path, dict[str, Any], list[tuple[int, str, str]], list[bytes]], int]


class Snapshotter:
    """Writes generation *gen* with *write_file* (``snapshot.write_snapshot``'s signature)."""

    def __init__(self, directory: Path, stats: Any, write_file: WriteFile, previous_gen: int | None):
        self.dir = directory
        self.stats = stats
        self.write_file = write_file
        self.previous_gen = previous_gen  #: the last good snapshot (kept as the fallback)
        #: told of a write the disk refuses (full, read-only, see :mod:`.refusal`) instead of an error line
        self.on_refused: Callable[[Path, OSError], None] | None = None
        self._thread: threading.Thread | None = None
        self._outcome: tuple[int, Outcome] | None = None  # a thread's outcome, for the reactor thread

    @property
    def writing(self) -> bool:
        return self._thread is not None

    def write(
        self,
        gen: int,
        header: dict[str, Any],
        requests: list[tuple[int, str, str]],
        fingerprints: list[bytes],
        *,
        background: bool,
    ) -> bool:
        """Write the file now (its success), or start a thread (True)."""
        if not background:
            return self._written(gen, self._write(gen, header, requests, fingerprints))
        self._thread = threading.Thread(
            target=self._write_in_thread,
            args=(gen, header, requests, fingerprints),
            name="openclaw-checkpoint-snapshot",
            daemon=True,
        )
        self._thread.start()
        return True

    def join(self) -> None:
        """Wait for a background write and handle its outcome."""
        if self._thread is not None:
            self._thread.join()
            self._collect()

    def _write(
        self, gen: int, header: dict[str, Any], requests: list[tuple[int, str, str]], fingerprints: list[bytes]
    ) -> Outcome:
        """Write the file (any thread): ``(size, seconds)``, or the error."""
        started = time.monotonic()
        try:
            size = self.write_file(snapshot_path(self.dir, gen), header, requests, fingerprints)
        except OSError as exc:
            return exc
        return size, time.monotonic() - started

    def _write_in_thread(self, gen: int, *args: Any) -> None:
        from twisted.internet import reactor  # (the installed one)

        try:
            outcome = self._write(gen, *args)
        except Exception as exc:  # reported like a failed write; never leaves a writer hanging
            outcome = exc
        self._outcome = (gen, outcome)
        reactor.callFromThread(self._collect)

    def _collect(self) -> None:
        """On the reactor thread: handle a background write's outcome (once)."""
        outcome, self._outcome = self._outcome, None
        if outcome is not None:
            self._thread = None
            self._written(*outcome)

    def _written(self, gen: int, outcome: Outcome) -> bool:
        if isinstance(outcome, Exception):
            self.stats.inc_value("openclaw/checkpoint/snapshot_errors")
            if self.on_refused is not None and isinstance(outcome, OSError) and refuses(outcome):
                self.on_refused(snapshot_path(self.dir, gen), outcome)
                return False
            logger.error(
                "Checkpoint snapshot %(path)s failed (%(error)s); the previous snapshot and the "
                "journals still hold the state, the crawl continues",
                {"path": snapshot_path(self.dir, gen), "error": outcome},
            )
            return False
        size, seconds = outcome
        self.stats.inc_value("openclaw/checkpoint/snapshots")
        self.stats.set_value("openclaw/checkpoint/snapshot_bytes", size)
        self.stats.set_value("openclaw/checkpoint/snapshot_seconds", round(seconds, 3))
        if self.previous_gen is not None:
            self._delete_old(keep_from=self.previous_gen)
        self.previous_gen = gen
        return True

    def _delete_old(self, keep_from: int) -> None:
        """Keep the previous snapshot and its journals (the fallback), drop anything older.

        A file the disk will not let go (the directory turned read-only after the snapshot
        was written) stops the crawl like any refused write; it is only left behind, so
        nothing is lost, and the next crawl's snapshot deletes it."""
        snaps, journals = generations(self.dir)
        old = [snapshot_path(self.dir, g) for g in snaps if g < keep_from]
        old += [journal_path(self.dir, g) for g in journals if g < keep_from]
        for path in old:
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:
                if self.on_refused is not None and refuses(exc):
                    self.on_refused(path, exc)
                    return
                logger.warning("Checkpoint: cannot delete the old %(path)s (%(error)s)", {"path": path, "error": exc})


def json_copy(value: Any) -> Any:
    """A deep, JSON-safe copy (TypeError/ValueError if *value* is not JSON-safe)."""
    return json.loads(json.dumps(value))


def json_safe_stats(stats: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in stats.items():
        if value is None or isinstance(value, (str, bool, int, float)):
            out[key] = value
        else:
            out[key] = str(value)
    return out
