"""The Lua scripts behind the Redis queue, the shared health registry, the dead-letter stream, site memory and the scheduler's locks.

Why Lua: every multi-key change (pop = pick + token + lease, ack, lease
expiry, health update) must be atomic across workers, and one ``EVALSHA`` is
also one round trip. Only Redis 6.2 features are used (sorted sets, hashes,
``cjson``).

The queue is split into shards by domain (``OPENCLAW_DISTRIBUTED_SHARDS``);
each shard's keys share one hash tag, ``{<spider>#<n>}``, and every script
runs on one shard with all its keys declared in ``KEYS`` (see ``queue.lua``), so
one pop or push touches one cluster slot. Per shard (``S`` = ``K:{spider#n}``)::

    S:q S:a S:e   zset  ready entries of the shard's domains (lexicographic, see queue.lua)
    S:domains     zset  domain index: domains with ready entries, score = when a
                        pop should look at the domain again (<= now: now; a held
                        or throttled domain gets its ready time, a served one now,
                        so the least recently looked-at come first)
    S:served      hash  domain -> serve sequence (round-robin among equals)
    S:count       str   number of ready entries
    S:delayed     zset  not-before entries, score = due time
    S:inflight    zset  leased entries, score = lease expiry
    S:owner       hash  id -> worker id holding the lease
    S:data        hash  id -> request payload (JSON)
    S:info        hash  id -> cjson {p, d, w, x, dom}: priority, deadline,
                        aging window, expired mode, domain
    S:released    hash  id -> times the entry was handed back after a failed item
    S:rejected    hash  id -> refused payload (never executed)
    S:found       str   requests discovered (pushed, copies of leased ones aside)
    <dupefilter key>:{spider#n}  set  the shard's fingerprints

The crawl's workers (``workers.lua``) live in shard 0's tag, ``K:{spider#0}:``::

    live          zset  worker id -> when it counts as dead (its liveness thread pushes it on)
    busy          set   workers with work of their own not (yet) in the queue
    epoch         str   +1 whenever a worker turns busy (a count is believed only if unchanged)

Each domain's best entry is compared (heads of three orders) instead of the
first N entries of one global set, so a held domain with many queued requests
cannot hide the others.

Health keys: ``<spider>:health:{spider#n}:d:<domain>`` hash in the domain's shard,
see :data:`HEALTH` (the rate controller, ``health.lua``).

The scripts are ``.lua`` files in this package (package data, read with
:mod:`importlib.resources`, so from an egg or a zip too), so they can be
read, linted and diffed as Lua. ``_embedded.py`` holds a generated copy for a
package copied without its data (vendored into an egg by a ``setup.py``
that lists none); a test keeps it equal to the files.
Two are shared preludes, not scripts of their own: ``health.lua`` (the rate
controller) and ``queue.lua`` (a shard's keys and the entry helpers). A
script is its preludes followed by its own file, concatenated here once at
import; each file's header says what it takes in ``KEYS`` and ``ARGV``.

Time: no script reads Redis's clock (``TIME``). Every "now" (lease expiry,
due times, health refill) is the calling worker's clock reading, passed in
``ARGV``: deadlines and not-before times are already the workers' UNIX
times, the health hashes store them too, so one time base is kept, and a
test can drive expiry with a fake clock (the ``clock`` parameter of the
queue, the link and the registry) instead of sleeping. Workers' clocks are
assumed NTP-close, as before.
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
    return "\n".join(_read(part).rstrip("\n") for part in parts) + "\n"


#: the rate controller (a prelude): a line-by-line port of ``health/registry/`` (its ``pacing`` and ``recording`` parts)
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
WORKERS = _script("workers")

H_ENSURE = _script("health", "h_ensure")
H_ACQUIRE = _script("health", "h_acquire")
H_RECORD = _script("health", "h_record")
H_HOLD = _script("health", "h_hold")
H_CRAWL_DELAY = _script("health", "h_crawl_delay")
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
