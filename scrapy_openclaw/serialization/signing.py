"""The store key: an HMAC-SHA-256 seal on everything the crawl stores and reads back.

A forged entry is refused before any byte of it is interpreted, so the crawl's
own entries can be trusted whole (``meta["proxy"]`` included); each store seals
under its own *purpose*. One key per process: the serializer scrapy-redis calls
is a module. Where the key comes from: docs/security.md, "The store key".
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import stat
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from scrapy_openclaw import settings as _settings
from scrapy_openclaw._files import open_existing, private_dir
from scrapy_openclaw.exceptions import OpenClawConfigError
from scrapy_openclaw.paths import base_dir

if TYPE_CHECKING:
    from scrapy_openclaw.settings import OpenClawSettings

__all__ = ["MAC_LEN", "StoreKey", "configure", "current", "key_file_path", "resolve"]

logger = logging.getLogger(__name__)

#: Hex digits of a MAC (128 bits of HMAC-SHA-256, RFC 2104 truncation).
MAC_LEN = 32
#: Shortest key accepted from a setting or the environment.
MIN_KEY_LEN = 16


@dataclass(frozen=True)
class StoreKey:
    """A key and where it came from (the source is logged, the key never)."""

    secret: bytes
    source: str
    accept_unsigned: bool = False  #: read unsigned records of older versions (with a warning)

    def mac(self, purpose: str, body: bytes) -> str:
        return hmac.new(self.secret, purpose.encode("ascii") + b"\0" + body, hashlib.sha256).hexdigest()[:MAC_LEN]

    def check(self, purpose: str, body: bytes, mac: bytes | str) -> bool:
        given = mac.decode("ascii", "replace") if isinstance(mac, bytes) else mac
        return hmac.compare_digest(self.mac(purpose, body), given)


def key_file_path() -> Path:
    """Where a project's generated key lives: ``<project>/openclaw-data/store.key``.

    ``<project>`` is the project root (the working directory outside a
    project), as for the other project paths (:mod:`scrapy_openclaw.paths`).
    """
    return Path(base_dir(), "openclaw-data", "store.key")


@dataclass(frozen=True)
class _Spec:
    """What a crawl's settings say about its key (read once; resolved when first needed)."""

    key: str | None
    env: str
    distributed: bool
    accept_unsigned: bool

    @classmethod
    def of(cls, config: OpenClawSettings | None) -> _Spec:
        if config is None:
            return cls(None, str(_settings.DEFAULTS["OPENCLAW_STORE_KEY_ENV"]), False, False)
        return cls(config.store_key, str(config.store_key_env), config.distributed, config.store_accept_unsigned)


def resolve(config: OpenClawSettings | None = None) -> StoreKey:
    """The key *config* names (generating the project's key file if that is where it lives)."""
    return _resolve(_Spec.of(config))


def _resolve(spec: _Spec) -> StoreKey:
    if spec.key:
        return StoreKey(_checked(spec.key, "setting OPENCLAW_STORE_KEY"), "OPENCLAW_STORE_KEY", spec.accept_unsigned)
    value = os.environ.get(spec.env) if spec.env else None
    if value:
        return StoreKey(_checked(value, f"environment variable {spec.env}"), f"${spec.env}", spec.accept_unsigned)
    if spec.distributed:
        raise _settings.missing_shared_key(spec.env)
    path = key_file_path()
    return StoreKey(_key_file(path), str(path), spec.accept_unsigned)


def _checked(value: str, where: str) -> bytes:
    if len(value) < MIN_KEY_LEN:
        raise OpenClawConfigError(f"{where}: a store key needs at least {MIN_KEY_LEN} characters")
    return value.encode("utf-8")


def _key_file(path: Path) -> bytes:
    """Read the project's key, or create it (0600, exclusively: two crawls starting at once agree)."""
    private_dir(path.parent)
    if not os.path.lexists(path):
        _create_key_file(path)
    fd = open_existing(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
            raise OpenClawConfigError(
                f"store key file {path}: must be owned by this user and private (chmod 600 {path})"
            )
        text = f.read(4096).decode("ascii", "replace").strip()
    if len(text) < MIN_KEY_LEN:
        raise OpenClawConfigError(f"store key file {path}: empty or too short (delete it to generate a new key)")
    return text.encode("ascii")


def _create_key_file(path: Path) -> None:
    """Write a new key beside *path*, then link it into place: the file appears whole or not at all,
    and of crawls starting at once (scrapyd jobs) the first link wins and the others read its key."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # never replaces: an existing key (or a planted symlink) stays
        except FileExistsError:
            return
        logger.info("Generated the store key %(path)s (keep it private; see docs/security.md)", {"path": path})
    finally:
        os.unlink(tmp)


# --- the process's key ----------------------------------------------------------------

_lock = threading.Lock()
_spec: _Spec | None = None
_key: StoreKey | None = None


def configure(config: OpenClawSettings) -> None:
    """Make *config*'s key the process's (resolved when first used); every configuration read
    (:meth:`OpenClawSettings.from_settings <scrapy_openclaw.settings.OpenClawSettings.from_settings>`) calls it.

    A crawl that names another key than one already in use wins, with a
    warning: stores sealed with the first key no longer verify.
    """
    global _spec, _key
    spec = _Spec.of(config)
    with _lock:
        if spec == _spec:
            return
        if _key is not None and _spec is not None and (spec.key, spec.env) != (_spec.key, _spec.env):
            logger.warning("A second crawl in this process names another store key; it is used from now on")
        _spec, _key = spec, None


def current() -> StoreKey:
    """The process's key: the one :func:`configure` named, else the default sources."""
    global _key
    key = _key
    if key is not None:
        return key
    with _lock:
        if _key is None:
            _key = _resolve(_spec or _Spec.of(None))
        return _key


_settings.on_configured(configure)
