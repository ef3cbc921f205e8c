"""Crash-safe checkpoint and resume: journal + atomic snapshots of the crawl state.

Enable with ``OPENCLAW_CHECKPOINT_DIR`` (the add-on wires
:class:`CheckpointExtension`); inspect with ``scrapy openclaw-checkpoint``.
"""

from scrapy_openclaw.checkpoint.extension import CheckpointExtension
from scrapy_openclaw.checkpoint.journal import (
    FORMAT_VERSION,
    CheckpointError,
    CheckpointVersionError,
    JournalWriter,
    read_journal,
)
from scrapy_openclaw.checkpoint.snapshot import CorruptSnapshot, read_snapshot, write_snapshot
from scrapy_openclaw.checkpoint.state import RecoveredState, load

__all__ = [
    "FORMAT_VERSION",
    "CheckpointError",
    "CheckpointExtension",
    "CheckpointVersionError",
    "CorruptSnapshot",
    "JournalWriter",
    "RecoveredState",
    "load",
    "read_journal",
    "read_snapshot",
    "write_snapshot",
]
