"""The Lua scripts behind the Redis queue, the shared health registry, the dead-letter stream, site memory and the scheduler's locks.

Every multi-key change is one script: atomic across workers, and one round
trip. Two files are preludes, not scripts: ``health.lua`` (the rate
controller) and ``queue.lua`` (a shard's keys and entry helpers); a script is
its preludes and its own file, joined here once at import. The key layout and
why no script reads Redis's clock: docs/distributed.md, "Redis keys and scripts".
"""

from __future__ import annotations

from importlib import resources


def _read(name: str) -> str:
    """The script file *name*; the embedded copy where the package's data did not travel."""
    try:
        return resources.files(__name__).joinpath(f"{name}.lua").read_text(encoding="utf-8")
    except (FileNotFoundError, KeyError):  # (KeyError: a member missing from a zip, on some Pythons)
        from scrapy_openclaw.distributed.lua._embedded import SCRIPTS

        return SCRIPTS[name]


def _script(*parts: str) -> str:
    """The preludes and the script's own file, as one script."""
    return "\n".join((_health() if part == "health" else _read(part)).rstrip("\n") for part in parts) + "\n"


#: the rate controller (a prelude): a line-by-line port of ``health/registry/`` (its ``pacing`` and ``recording`` parts)
def _constants() -> str:
    """The rate controller's module constants (``tuning.py``, as ``k_name``) as the table ``K``
    the health prelude starts with: a script decodes only the domain's own knobs per call."""
    from scrapy_openclaw.health.registry import tuning

    items = ", ".join(f"{name} = {value!r}" for name, value in sorted(tuning.lua_constants().items()))
    return f"local K = {{{items}}}\n"


def _health() -> str:
    return _constants() + _read("health")


HEALTH = _script("health")
#: a shard's keys and the entry helpers (a prelude of every queue script)
QUEUE = _script("queue")

PUSH = _script("queue", "push")
POP = _script("health", "queue", "pop")
ACK = _script("queue", "ack")
HEARTBEAT = _script("queue", "heartbeat")
RELEASE = _script("queue", "release")
REJECT = _script("queue", "reject")
COUNTS = _script("counts")
RECLAIM = _script("queue", "reclaim")
WAKE = _script("queue", "wake")
WORKERS = _script("workers")
#: a page's items with its mark (``distributed/items.py``)
ITEMS = _script("items")

H_ENSURE = _script("health", "h_ensure")
H_ACQUIRE = _script("health", "h_acquire")
H_RECORD = _script("health", "h_record")
H_HOLD = _script("health", "h_hold")
H_CRAWL_DELAY = _script("health", "h_crawl_delay")
H_DECLARE = _script("health", "h_declare")
H_CONTROL = _script("health", "h_control")

#: the dead-letter stream (``dlq/stores/redis_stream.py``): exactly-once add, in-place update
DLQ_ADD = _script("dlq_add")
DLQ_UPDATE = _script("dlq_update")
#: site memory (``sites/store.py``): replace an entry only if unchanged since it was read
SITES_REPLACE = _script("sites_replace")
#: the scheduler's window locks (``schedule/locks.py``)
LOCK_ACQUIRE = _script("lock_acquire")
LOCK_EXTEND = _script("lock_extend")
LOCK_RELEASE = _script("lock_release")
