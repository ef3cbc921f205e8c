"""The DeadlinePriorityQueue's JOBDIR file: pending requests as JSON, written atomically.

Scrapy's scheduler keeps whatever ``close()`` returns in ``active.json`` and
hands it back as ``startprios`` on resume; ours is a small pointer to this
file plus its checksum, so a torn or edited file is detected, reported, and
never half-loaded.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from scrapy_openclaw._files import atomic_write
from scrapy_openclaw.serialization import dumps

STATE_FILE = "openclaw-queue.json"
STATE_FORMAT = "scrapy-openclaw/deadline-queue"
STATE_VERSION = 1


#: The first key of our state, and a directory by that name. Scrapy's own priority queues,
#: given our state (the add-on removed, or SCHEDULER_PRIORITY_QUEUE changed), open that
#: directory as one of their disk queues and stop at start with this text in the error
#: (IsADirectoryError), instead of resuming nothing silently or failing with a TypeError.
FOREIGN_READER_STOP = (
    "JOBDIR queue of scrapy_openclaw.pqueues.DeadlinePriorityQueue, which "
    "scrapy.pqueues.DownloaderAwarePriorityQueue and ScrapyPriorityQueue cannot resume; "
    "set SCHEDULER_PRIORITY_QUEUE to the former or use a new JOBDIR"
)


def _scrapy_path_safe(text: str) -> str:
    """``scrapy.pqueues._path_safe``: the directory DownloaderAwarePriorityQueue gives a slot."""
    safe = "".join(c if c.isalnum() or c in "-._" else "_" for c in text)
    return f"{safe}-{hashlib.md5(text.encode('utf8')).hexdigest()}"


def _stop_foreign_readers(directory: str) -> None:
    # (info.json as a directory stops FIFO disk queues too, which would read an empty one)
    for path in (
        Path(directory, FOREIGN_READER_STOP),  # ScrapyPriorityQueue: a queue per key
        Path(directory, _scrapy_path_safe(FOREIGN_READER_STOP), FOREIGN_READER_STOP),
    ):  # per slot
        Path(path, "info.json").mkdir(parents=True, exist_ok=True)


def write(directory: str, records: list[dict[str, Any]]) -> dict[str, Any]:
    """Write *records* (``request_to_data`` dicts) under *directory*; return the resume state."""
    payload = dumps({"format": STATE_FORMAT, "version": STATE_VERSION, "requests": records}).encode()
    atomic_write(Path(directory, STATE_FILE), payload)
    _stop_foreign_readers(directory)
    return {
        FOREIGN_READER_STOP: [FOREIGN_READER_STOP],  # first: what a Scrapy queue reads first
        "openclaw_queue": STATE_VERSION,
        "file": STATE_FILE,
        "count": len(records),
        "sha256": hashlib.sha256(payload).hexdigest(),
    }


def is_state(state: Any) -> bool:
    return isinstance(state, dict) and state.get("openclaw_queue") == STATE_VERSION


def read(directory: str, state: dict[str, Any]) -> list[dict[str, Any]]:
    """The records *state* points to; ``ValueError``/``OSError`` saying what is wrong."""
    path = Path(directory, str(state.get("file") or STATE_FILE))
    payload = path.read_bytes()
    if hashlib.sha256(payload).hexdigest() != state.get("sha256"):
        raise ValueError(f"{path}: checksum mismatch (torn or modified file)")
    data = json.loads(payload)
    if not isinstance(data, dict) or data.get("format") != STATE_FORMAT or data.get("version") != STATE_VERSION:
        raise ValueError(f"{path}: not a v{STATE_VERSION} {STATE_FORMAT} file")
    records = data.get("requests")
    if not isinstance(records, list):
        raise ValueError(f"{path}: no request list")
    return records
