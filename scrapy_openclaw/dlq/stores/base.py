"""The interface every dead-letter store implements, and the filters that select records.

:class:`DeadLetterStore` is what the pipeline and the ``scrapy openclaw-dlq``
command program against; :class:`Filters` says which records a command or
query is about. The backends live in :mod:`.jsonl` and :mod:`.redis_stream`.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from scrapy_openclaw.deadletter import DeadLetter

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Filters:
    """Which dead letters a command or query is about; ``None`` means any."""

    domain: str | None = None
    error_class: str | None = None
    spider: str | None = None
    since: float | None = None  # UNIX time, compared with ``created_at``
    until: float | None = None
    ids: frozenset[str] | None = None
    include_replayed: bool = True

    def matches(self, record: DeadLetter, replayed: bool = False) -> bool:
        if replayed and not self.include_replayed:
            return False
        if self.ids is not None and record.id not in self.ids:
            return False
        if self.domain is not None and record.domain != self.domain:
            return False
        if self.error_class is not None and record.error_class != self.error_class:
            return False
        if self.spider is not None and record.spider != self.spider:
            return False
        if self.since is not None and record.created_at < self.since:
            return False
        return not (self.until is not None and record.created_at > self.until)


ANY = Filters()
#: How the reason of a record that failed the store key check starts.
REFUSED = "refused: "


class DeadLetterStore(ABC):
    """The interface every store implements; ``uri`` says where it writes."""

    uri: str

    @property
    def skipped(self) -> dict[str, str]:
        """Unreadable records met so far: where (file and line, or stream entry) -> why."""
        return self.__dict__.setdefault("_skipped", {})

    @property
    def refused(self) -> int:
        """How many of the :attr:`skipped` records failed the store key check (never used)."""
        return sum(why.startswith(REFUSED) for why in self.skipped.values())

    def _skip(self, where: str, why: Any) -> None:
        """Count an unreadable record and warn about it once per store."""
        from scrapy_openclaw.dlq.records import UnsealedRecord

        if where in self.skipped:
            return
        self.skipped[where] = f"{REFUSED}{why}" if isinstance(why, UnsealedRecord) else str(why)
        logger.warning("Skipping dead letter %(where)s: %(why)s", {"where": where, "why": self.skipped[where]})

    @abstractmethod
    def append(self, record: DeadLetter) -> None:
        """Store one record; must not lose it even if the backend is down."""

    @abstractmethod
    def iter(self, filters: Filters = ANY) -> Iterator[DeadLetter]:
        """Stored records matching *filters*, oldest first."""

    @abstractmethod
    def replayed(self) -> dict[str, float]:
        """Ids of replayed records -> when they were replayed."""

    @abstractmethod
    def mark_replayed(self, ids: Iterable[str]) -> int:
        """Remember that these records were replayed; returns how many were new marks."""

    def update(self, records: Iterable[DeadLetter]) -> int:
        """Replace stored records by id, in place (replay marks); returns how many were found."""
        raise NotImplementedError

    @abstractmethod
    def purge(self, filters: Filters = ANY) -> int:
        """Delete the matching records (and their marks); returns how many."""

    def get(self, id: str) -> DeadLetter | None:
        for record in self.iter(Filters(ids=frozenset([id]))):
            return record
        return None

    def stats(self, filters: Filters = ANY) -> dict[str, Any]:
        """Counts: total, replayed, by domain and by error class."""
        replayed = self.replayed()
        by_domain: Counter[str] = Counter()
        by_class: Counter[str] = Counter()
        total = done = 0
        for record in self.iter(filters):
            total += 1
            done += record.id in replayed
            by_domain[record.domain or "-"] += 1
            by_class[record.error_class] += 1
        return {
            "total": total,
            "replayed": done,
            "by_domain": dict(by_domain.most_common()),
            "by_class": dict(by_class.most_common()),
        }

    def sync(self) -> None:
        """Make what was appended durable (fsync / retry a buffer); cheap when idle."""

    def pending(self) -> int:
        """Records accepted but not yet in the backend (buffered)."""
        return 0

    def close(self) -> None:
        """Flush and release resources; the store may be reopened by using it."""
