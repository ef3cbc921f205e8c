"""Where site memory is kept: one signed JSON file under the project, or Redis in distributed mode.

Both are sealed with the store key, keep at most ``OPENCLAW_SITES_MAX_ENTRIES``
domains and drop entries past ``OPENCLAW_SITES_MAX_AGE`` (docs/site-memory.md).
Reading validates every entry; the calls block, so a crawl runs them off the reactor.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy_openclaw._files import atomic_write, open_existing, private_dir
from scrapy_openclaw.distributed import lua
from scrapy_openclaw.distributed.connection import reply_text
from scrapy_openclaw.paths import base_dir, resolve_path
from scrapy_openclaw.serialization import signing
from scrapy_openclaw.sites.entry import SiteEntry, rebased

if TYPE_CHECKING:
    from collections.abc import Iterable

    from scrapy_openclaw.settings import OpenClawSettings

VERSION = 1
PURPOSE = "sites"
FILE_NAME = "sites.json"
MAX_FILE_BYTES = 64 * 1024 * 1024  # a store larger than this is not ours

logger = logging.getLogger(__name__)


class SiteStoreError(ValueError):
    """A store that cannot be read (names it and what is wrong); the crawl goes on without it."""


class _Bounded:
    max_entries: int
    max_age: float

    def _keep(self, entries: dict[str, SiteEntry], now: float) -> dict[str, SiteEntry]:
        """The entries still young enough, the most recently seen *max_entries* of them."""
        young = [(d, e) for d, e in entries.items() if now - e.seen_at <= self.max_age]
        young.sort(key=lambda item: (-item[1].seen_at, item[0]))
        return dict(young[: self.max_entries])


class FileSiteStore(_Bounded):
    """Site memory in one local file, ``{"version": 1, "mac": ..., "entries": {domain: entry}}``.

    Sealed with the store key as a whole (a file anyone else wrote is refused whole),
    replaced atomically, private, never read through a symlink.
    """

    def __init__(self, path: Path, *, max_entries: int = 10000, max_age: float = 30 * 86400.0):
        self.path = path
        self.max_entries = max_entries
        self.max_age = max_age

    def __str__(self) -> str:
        return str(self.path)

    def load(self, now: float | None = None) -> dict[str, SiteEntry]:
        """Every entry still young enough; {} when there is no file yet; SiteStoreError otherwise."""
        now = time.time() if now is None else now
        raw = self._read()
        if raw is None:
            return {}
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise SiteStoreError(f"{self.path}: not JSON ({exc})") from None
        if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
            raise SiteStoreError(f"{self.path}: not a site memory file (expected an object with 'entries')")
        if data.get("version") != VERSION:
            raise SiteStoreError(f"{self.path}: version {data.get('version')!r}, this version reads {VERSION}")
        mac = data.get("mac")
        if not isinstance(mac, str) or not signing.current().check(PURPOSE, _body(data["entries"]), mac):
            raise SiteStoreError(f"{self.path}: its seal does not match the store key (written by someone else?)")
        entries = {}
        for domain, fields in data["entries"].items():
            entries[domain] = SiteEntry.from_data(fields, f"{self.path}: domain {domain!r}")
        return self._keep(entries, now)

    def _read(self) -> bytes | None:
        try:
            fd = open_existing(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise SiteStoreError(f"{self.path}: cannot read it: {exc.strerror or exc}") from None
        with os.fdopen(fd, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
        if len(raw) > MAX_FILE_BYTES:
            raise SiteStoreError(f"{self.path}: larger than {MAX_FILE_BYTES} bytes: not a site memory file")
        return raw

    def save(
        self, entries: dict[str, SiteEntry], now: float | None = None, saved: dict[str, SiteEntry] | None = None
    ) -> dict[str, SiteEntry]:
        """Merge *entries* into the file (what another crawl saved meanwhile is kept, unless
        unreadable: then replaced; counts add up, see :func:`.rebased`, *saved* being what this
        crawl wrote last); return *entries* (all written, at once)."""
        now = time.time() if now is None else now
        saved = saved or {}
        try:
            merged = self.load(now)
        except (SiteStoreError, ValueError):
            merged = {}
        for domain, entry in entries.items():
            merged[domain] = rebased(entry, saved.get(domain), merged.get(domain))
        self._write(self._keep(merged, now))
        return entries

    def forget(self, domains: Iterable[str] | None = None) -> list[str]:
        """Drop *domains* (None: every one); the domains dropped."""
        entries = self.load()
        gone = list(entries) if domains is None else [d for d in domains if d in entries]
        for domain in gone:
            del entries[domain]
        self._write(entries)
        return gone

    def _write(self, entries: dict[str, SiteEntry]) -> dict[str, SiteEntry]:
        data = {d: e.to_data() for d, e in sorted(entries.items())}
        doc = {"version": VERSION, "mac": signing.current().mac(PURPOSE, _body(data)), "entries": data}
        private_dir(self.path.parent)
        atomic_write(self.path, json.dumps(doc, indent=1).encode())
        return entries


#: Read-rebase-replace rounds a save tries before it leaves the rest to the next save.
_SAVE_ROUNDS = 5


class RedisSiteStore(_Bounded):
    """Site memory in Redis: one hash per domain, ``<spider>:sites:<domain>``.

    Fields ``entry`` and ``mac``; the hash expires ``OPENCLAW_SITES_MAX_AGE`` after its
    domain was last crawled.
    """

    def __init__(self, server: Any, spider: str, *, max_entries: int = 10000, max_age: float = 30 * 86400.0):
        self.server = server
        self.prefix = f"{spider}:sites:"
        self.max_entries = max_entries
        self.max_age = max_age

    def __str__(self) -> str:
        return f"Redis {self.prefix}*"

    def _domains(self) -> list[str]:
        return [reply_text(k)[len(self.prefix) :] for k in self.server.scan_iter(match=self.prefix + "*", count=500)]

    def load(self, now: float | None = None, *, problems: list[str] | None = None) -> dict[str, SiteEntry]:
        """Every valid, young entry; those that are not (damaged, forged) are left out and
        named in *problems*."""
        now = time.time() if now is None else now
        entries = {}
        for domain in self._domains():
            try:
                entries[domain] = self.read(domain)
            except SiteStoreError as exc:
                if problems is not None:
                    problems.append(str(exc))
        return self._keep(entries, now)

    def read(self, domain: str) -> SiteEntry:
        return self._entry(domain, self.server.hgetall(self.prefix + domain))

    def _entry_or_none(self, domain: str, raw: dict[Any, Any]) -> SiteEntry | None:
        """The stored entry, None when there is none or it is not a sealed one (then replaced)."""
        try:
            return self._entry(domain, raw) if raw else None
        except SiteStoreError:
            return None

    def _entry(self, domain: str, raw: dict[Any, Any]) -> SiteEntry:
        key = self.prefix + domain
        fields = {reply_text(k): v for k, v in raw.items()}
        body, mac = fields.get("entry"), fields.get("mac")
        if not isinstance(body, bytes) or mac is None or not signing.current().check(PURPOSE, body, mac):
            raise SiteStoreError(f"Redis {key}: not a sealed site memory entry (written by someone else?)")
        try:
            return SiteEntry.from_data(json.loads(body), f"Redis {key}")
        except ValueError as exc:
            raise SiteStoreError(str(exc)) from None

    def save(
        self, entries: dict[str, SiteEntry], now: float | None = None, saved: dict[str, SiteEntry] | None = None
    ) -> dict[str, SiteEntry]:
        """Write *entries* over what Redis holds, their counts added to the stored ones (see
        :func:`.rebased`); return those written. Each domain's entry is replaced only if it is
        still the one read (``SITES_REPLACE``, one key: Cluster too); one another worker changed
        in between is read and rebased again, so two workers saving at once both count."""
        now = time.time() if now is None else now
        saved = saved or {}
        pending = dict(entries)
        for _ in range(_SAVE_ROUNDS):
            domains = list(pending)
            pipe = self.server.pipeline(transaction=False)
            for domain in domains:
                pipe.hgetall(self.prefix + domain)
            stored = dict(zip(domains, pipe.execute()))
            pipe = self.server.pipeline(transaction=False)
            for domain in domains:
                raw = stored[domain]
                entry = rebased(pending[domain], saved.get(domain), self._entry_or_none(domain, raw))
                body = json.dumps(entry.to_data(), sort_keys=True).encode()
                seal = raw.get(b"mac", raw.get("mac", b""))
                ttl = max(1, int(self.max_age - (now - entry.seen_at)))
                pipe.eval(
                    lua.SITES_REPLACE, 1, self.prefix + domain, seal, body, signing.current().mac(PURPOSE, body), ttl
                )
            written = pipe.execute()
            pending = {d: pending[d] for d, ok in zip(domains, written) if not ok}
            if not pending:
                break
        else:
            logger.warning(
                "Site memory: %(n)d entries kept changing under this save (%(rounds)d rounds), e.g. %(some)s; "
                "they are saved next time",
                {"n": len(pending), "rounds": _SAVE_ROUNDS, "some": sorted(pending)[:3]},
            )
        known = self._domains()
        if len(known) > self.max_entries:  # the least recently seen go
            kept = self._keep(self.load(now), now)
            self.forget([d for d in known if d not in kept])
        return {d: e for d, e in entries.items() if d not in pending}

    def forget(self, domains: Iterable[str] | None = None) -> list[str]:
        known = set(self._domains())
        gone = sorted(known if domains is None else known.intersection(domains))
        if gone:
            pipe = self.server.pipeline(transaction=False)
            for domain in gone:
                pipe.delete(self.prefix + domain)
            pipe.execute()
        return gone


def sites_path(config: OpenClawSettings) -> Path:
    """``OPENCLAW_SITES_PATH``, else ``<project>/openclaw-data/sites.json`` (one per project)."""
    if config.sites_path:
        return resolve_path(config.sites_path, setting="OPENCLAW_SITES_PATH")
    return Path(base_dir(), "openclaw-data", FILE_NAME)


def open_store(
    config: OpenClawSettings, settings: Any, spider: str, *, redis: bool | None = None
) -> FileSiteStore | RedisSiteStore:
    """The crawl's store: Redis in distributed mode (or with *redis*; reached through *settings*'
    ``REDIS_*``), else the file."""
    bounds: dict[str, Any] = {"max_entries": config.sites_max_entries, "max_age": config.sites_max_age}
    if redis if redis is not None else config.distributed:
        from scrapy_openclaw.distributed.connection import client_from_settings

        return RedisSiteStore(client_from_settings(settings, config), spider, **bounds)
    return FileSiteStore(sites_path(config), **bounds)


def _body(entries: Any) -> bytes:
    return json.dumps(entries, sort_keys=True, separators=(",", ":")).encode()
