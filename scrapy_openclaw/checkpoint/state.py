"""The checkpoint directory: file layout and recovery.

One pair of functions makes and parses the file names (:func:`file_name`,
:func:`parse_name`), so a name the writer makes is always one the reader accepts,
and look-alikes are reported as strays, never read or deleted. Recovery is the
newest snapshot that verifies plus the journals of its generation or later.
"""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scrapy_openclaw._files import is_temp
from scrapy_openclaw.checkpoint.feeds import parse_outputs
from scrapy_openclaw.checkpoint.journal import read_journal
from scrapy_openclaw.checkpoint.records import CheckpointVersionError, apply_payloads
from scrapy_openclaw.checkpoint.snapshot import CorruptSnapshot, Snapshot, read_snapshot

logger = logging.getLogger(__name__)

_EXTENSIONS = {"snapshot": "ckpt", "journal": "log"}
_NAME_RE = re.compile(r"^(snapshot|journal)-([0-9]{8,18})\.(ckpt|log)$")
LOCK_FILE = "lock"


def file_name(kind: str, gen: int) -> str:
    """The name of generation *gen* of *kind* ("snapshot" or "journal")."""
    return f"{kind}-{gen:08d}.{_EXTENSIONS[kind]}"


def parse_name(name: str) -> tuple[str, int] | None:
    """``(kind, generation)`` of a name :func:`file_name` makes, else None (strictly its inverse)."""
    m = _NAME_RE.match(name)
    if m is None or _EXTENSIONS[m.group(1)] != m.group(3):
        return None
    kind, gen = m.group(1), int(m.group(2))
    return (kind, gen) if file_name(kind, gen) == name else None


def snapshot_path(directory: Path, gen: int) -> Path:
    return directory / file_name("snapshot", gen)


def journal_path(directory: Path, gen: int) -> Path:
    return directory / file_name("journal", gen)


def generations(directory: Path) -> tuple[list[int], list[int]]:
    """Snapshot and journal generations present, each sorted ascending."""
    snaps: list[int] = []
    journals: list[int] = []
    if directory.is_dir():
        for name in os.listdir(directory):
            parsed = parse_name(name)
            if parsed is not None:
                (snaps if parsed[0] == "snapshot" else journals).append(parsed[1])
    return sorted(snaps), sorted(journals)


def _is_own_temp(name: str) -> bool:
    # ours: .openclaw-<name>.<random>.tmp; older versions wrote <name>.tmp next to a snapshot
    return is_temp(name) or (name.endswith(".tmp") and parse_name(name[:-4]) is not None)


def checkpoint_files(directory: Path) -> list[Path]:
    """Every file this package writes in *directory* (for wiping and sizing); nobody else's."""
    if not directory.is_dir():
        return []
    return [
        directory / name for name in sorted(os.listdir(directory)) if parse_name(name) is not None or _is_own_temp(name)
    ]


def temp_files(directory: Path) -> list[Path]:
    """Our temp files left in *directory* by a crash (safe to delete)."""
    return [p for p in checkpoint_files(directory) if _is_own_temp(p.name)]


def stray_files(directory: Path) -> list[str]:
    """Names that look like checkpoint files but are not ours (never read or deleted)."""
    if not directory.is_dir():
        return []
    return sorted(
        name
        for name in os.listdir(directory)
        if name.startswith(("snapshot-", "journal-")) and parse_name(name) is None and not _is_own_temp(name)
    )


@dataclass
class RecoveredState:
    """What a checkpoint directory holds, rebuilt in memory."""

    #: request id -> [state "p"|"f", request JSON text, fingerprint hex or None]
    requests: dict[int, list[Any]] = field(default_factory=dict)
    fingerprints: set[bytes] = field(default_factory=set)
    start_fingerprints: set[bytes] = field(default_factory=set)
    #: durable outputs (feeds, opted-in pipelines) at the last durable record: key -> state
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    header: dict[str, Any] = field(default_factory=dict)  #: of the snapshot used
    snapshot_gen: int | None = None
    journal_gens: list[int] = field(default_factory=list)
    next_id: int = 1
    dropped: int = 0  #: journal records skipped (torn tail or corrupt)
    corrupt_records: int = 0
    torn_records: int = 0
    refused: int = 0  #: complete lines that failed the store key check (counted in ``dropped`` too)
    bad_snapshots: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    crawl_id: str | None = None
    last_write: float | None = None  #: newest file mtime (UNIX s)
    max_gen: int = -1  #: newest generation of any file, damaged ones included

    @property
    def empty(self) -> bool:
        return self.snapshot_gen is None and not self.journal_gens

    @property
    def finished(self) -> bool:
        """The last snapshot says the crawl finished and no journal came after it."""
        if self.snapshot_gen is None or not self.header.get("finished"):
            return False
        return not any(g >= self.snapshot_gen for g in self.journal_gens)

    @property
    def next_generation(self) -> int:
        return self.max_gen + 1


def load(directory: Path) -> RecoveredState:
    """Rebuild the state from the newest good snapshot and the journals after it.

    Never raises for damage (it is reported in ``warnings``, ``dropped`` and
    ``bad_snapshots``); raises :class:`CheckpointVersionError` for files of
    another format version.
    """
    state = RecoveredState()
    snaps, journals = generations(directory)
    strays = stray_files(directory)
    if strays:
        state.warnings.append(
            f"ignoring {len(strays)} file(s) that are not checkpoint files of this format: "
            f"{', '.join(strays[:5])}{' ...' if len(strays) > 5 else ''}"
        )
    mtimes = [p.stat().st_mtime for p in checkpoint_files(directory) if p.exists()]
    state.last_write = max(mtimes, default=None)
    state.max_gen = max(snaps + journals, default=-1)
    for gen in reversed(snaps):
        path = snapshot_path(directory, gen)
        try:
            snapshot = read_snapshot(path)
        except CheckpointVersionError:
            raise
        except (CorruptSnapshot, OSError, ValueError) as exc:
            state.bad_snapshots.append(str(exc))
            state.warnings.append(f"skipped damaged snapshot {path.name}: {exc}")
            continue
        _take_snapshot(state, gen, snapshot, path)
        break
    base = state.snapshot_gen if state.snapshot_gen is not None else -1
    if state.snapshot_gen is None and snaps:
        state.warnings.append(
            "no snapshot verified; replaying the journals that are left (requests recorded "
            "only in deleted journals cannot be recovered)"
        )
    for gen in journals:
        if gen < base:
            continue
        contents = read_journal(journal_path(directory, gen))
        state.journal_gens.append(gen)
        if contents.header and state.crawl_id is None:
            state.crawl_id = contents.header.get("crawl_id")
        if contents.dropped:
            state.corrupt_records += contents.corrupt
            state.torn_records += contents.torn_tail
            state.refused += contents.refused
            state.dropped += contents.dropped
            state.warnings.append(
                f"{contents.path.name}: dropped {contents.dropped} damaged journal records "
                f"({contents.torn_tail} in a torn tail, {contents.corrupt} corrupt mid-file; "
                f"{contents.refused} complete lines failed the store key check)"
            )
        apply_payloads(state, contents.payloads)
    return state


def _take_snapshot(state: RecoveredState, gen: int, snapshot: Snapshot, path: Path) -> None:
    """Start the recovered state from this verified snapshot."""
    state.snapshot_gen = gen
    state.header = snapshot.header
    state.fingerprints = snapshot.fingerprints
    state.start_fingerprints = {bytes.fromhex(h) for h in snapshot.header.get("start_fingerprints", ())}
    state.requests = {rid: [st, data, None] for rid, st, data in snapshot.requests}
    outputs, bad = parse_outputs(snapshot.header.get("outputs") or {})
    state.outputs = outputs
    if bad:
        state.warnings.append(f"{path.name}: ignored invalid output state(s) {', '.join(bad[:5])}")
    state.next_id = int(snapshot.header.get("next_id", 1))
    state.crawl_id = snapshot.header.get("crawl_id")


def age(state: RecoveredState, now: float | None = None) -> float | None:
    """Seconds since the checkpoint was last written."""
    if state.last_write is None:
        return None
    return max(0.0, (now if now is not None else time.time()) - state.last_write)
