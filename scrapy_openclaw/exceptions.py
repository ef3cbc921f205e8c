"""Every exception scrapy-openclaw raises, under one root.

``except OpenClawError`` catches any of them; each also keeps the standard
base it always had (``ValueError`` for bad input, ``DropItem`` for an item
that failed validation, ...), so existing ``except`` clauses keep working.
The modules that raise them re-export them under their old names. This
module imports nothing from the package, so any module may import it.
"""

from __future__ import annotations

from scrapy.exceptions import DropItem


class OpenClawError(Exception):
    """The root of scrapy-openclaw's exceptions."""


# --- raised by your code, handled by ours ----------------------------------------------


class ParseError(OpenClawError):
    """Raise from a callback when a page did not have what the spider expected.

    The parse-retry middleware refetches the page within the parse budget.
    """


class ItemValidationError(OpenClawError, DropItem):
    """Raise from a pipeline for an item that failed validation.

    The item is dropped as with ``DropItem`` and becomes a dead letter of
    class ``business``.
    """


# --- bad input ---------------------------------------------------------------------------


class OpenClawConfigError(OpenClawError, ValueError):
    """A setting or policy file is invalid; the message names file, line and key."""


class SerializationError(OpenClawError, ValueError):
    """A request holds something that cannot be stored as data."""


class RefusedRequest(SerializationError):
    """A stored request that must not be sent (scheme, callback or meta key not allowed).

    ``kind`` is ``"scheme"``, ``"callback"`` or ``"meta"`` (stats and messages);
    ``url`` is the stored URL, for a dead letter.
    """

    def __init__(self, message: str, *, kind: str, url: str = ""):
        super().__init__(message)
        self.kind = kind
        self.url = url


class InvalidRecord(OpenClawError, ValueError):
    """A stored dead letter that cannot be used; the message says which field and why."""


class ControlError(OpenClawError, ValueError):
    """A control command that cannot be applied as given (the API answers 400 with this text)."""


# --- state on disk -----------------------------------------------------------------------


class UnsafeDirectory(OpenClawConfigError):
    """A directory we would write crawl data into is a symlink, not a directory, or open to others."""


class CheckpointError(OpenClawError):
    """A checkpoint directory cannot be used as it is (the message says what and where)."""


class CheckpointVersionError(CheckpointError):
    """The checkpoint was written by an incompatible format version."""


class CorruptSnapshot(CheckpointError):
    """A snapshot failed its checksums or is incomplete (truncated)."""


# --- distributed mode --------------------------------------------------------------------


class RefusedPayload(SerializationError):
    """A queue entry that is not one of our JSON requests (pickle, garbage)."""


class RedisUnavailableError(OpenClawError, ConnectionError):
    """Redis did not answer at crawl start."""


class LegacyQueueError(OpenClawError, RuntimeError):
    """Redis holds a queue in the single-node key layout from before sharding."""


class QueueFormatError(OpenClawError, RuntimeError):
    """Redis holds a crawl whose stored data a newer scrapy-openclaw wrote (its format)."""


class ShardLayoutError(OpenClawError, ValueError):
    """A key or spider name that cannot carry a shard's hash tag."""
