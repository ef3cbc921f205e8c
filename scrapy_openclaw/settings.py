"""Every ``OPENCLAW_*`` setting and its default, read and validated once per crawl.

The bottom of the import graph: components take :class:`OpenClawSettings`
from here, so a bad value fails at start, with or without the add-on.
"""

from __future__ import annotations

import difflib
import json
import os
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy.settings import SETTINGS_PRIORITIES

from scrapy_openclaw import redact
from scrapy_openclaw.exceptions import OpenClawConfigError
from scrapy_openclaw.runtime import peek, shared
from scrapy_openclaw.startup import refuse_start

if TYPE_CHECKING:
    from collections.abc import Callable
    from os import PathLike

    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings

DEFAULTS: dict[str, Any] = {
    "OPENCLAW_CRAWL_ID": None,  # unset: a random id, kept across checkpoint resumes
    # --- policy (per-domain knobs; schema in scrapy_openclaw/policy/policies.py) ---
    "OPENCLAW_POLICY_FILE": None,  # path to a YAML policy file
    "OPENCLAW_POLICY": {},  # the same schema as the YAML file, as a dict
    # --- error taxonomy ---
    # statuses that are worth retrying, every other 4xx/5xx is permanent; None:
    # Scrapy's RETRY_HTTP_CODES (the project's, or Scrapy's default list)
    "OPENCLAW_RETRY_HTTP_CODES": None,
    # exception types (dotted paths) that a callback raises when a page did
    # not parse; they are retried with the parse budget
    "OPENCLAW_PARSE_EXCEPTIONS": [
        "scrapy_openclaw.errors.ParseError",
        "json.JSONDecodeError",
        "ValueError",
        "KeyError",
        "IndexError",
        "AttributeError",
        "TypeError",
    ],
    # exception types a pipeline raises for an item that failed validation;
    # such items become dead letters of class "business"
    "OPENCLAW_VALIDATION_EXCEPTIONS": ["scrapy_openclaw.errors.ItemValidationError"],
    # --- health (DomainHealthMiddleware) ---
    "OPENCLAW_HEALTH_ENABLED": True,  # False: no DomainHealthMiddleware
    # class of the per-domain state owner (distributed mode selects a Redis one)
    "OPENCLAW_HEALTH_REGISTRY_CLASS": "scrapy_openclaw.health.HealthRegistry",
    # cap (seconds) on a robots.txt Crawl-delay the health middleware honours (with
    # ROBOTSTXT_OBEY, Scrapy >= 2.18); 0: ignore Crawl-delay
    "OPENCLAW_CRAWL_DELAY_MAX": 30.0,
    # seconds a domain with nothing pending or in flight keeps its health state (locally and
    # the TTL of its Redis hash); holds, open circuits, give-ups, operator overrides and a
    # Crawl-delay are kept regardless; 0: never forget a domain
    "OPENCLAW_HEALTH_IDLE_TTL": 1800.0,
    "OPENCLAW_BAN_ENABLED": True,  # False: no BanDetectionMiddleware (ban pages reach callbacks)
    # --- retry (ClassifiedRetryMiddleware, ParseRetryMiddleware) ---
    "OPENCLAW_RETRY_ENABLED": True,  # Scrapy's RETRY_ENABLED=False also disables it
    # record permanent failures (404, 410, other non-retryable 4xx/5xx) as dead
    # letters too, unless the spider handles that status (handle_httpstatus_list)
    "OPENCLAW_DLQ_PERMANENT": True,
    # --- queue (DeadlinePriorityQueue) ---
    # priority points a deadline request gains over its aging window (policy
    # deadline.aging_window); at the deadline the policy's `expired` applies
    "OPENCLAW_QUEUE_AGING_BOOST": 100.0,
    # --- checkpoint (CheckpointExtension) ---
    "OPENCLAW_CHECKPOINT_DIR": None,  # unset: no checkpointing; %(name)s: the spider, %(job)s: the scrapyd job
    "OPENCLAW_CHECKPOINT_FLUSH": 1.0,  # seconds between journal fsyncs (group commit)
    "OPENCLAW_CHECKPOINT_SNAPSHOT_INTERVAL": 60.0,  # seconds between snapshots (journal compaction)
    "OPENCLAW_CHECKPOINT_SNAPSHOT_RECORDS": 200000,  # also snapshot after this many journal records (0: off)
    "OPENCLAW_CHECKPOINT_RESTART": False,  # True: discard the checkpoint found in the dir and start over
    # mode of the feed files a checkpointed crawl creates (durable feeds); e.g. 0o644 to share them
    "OPENCLAW_FEED_FILE_MODE": 0o600,
    # --- dead letters (DeadLetterPipeline) ---
    "OPENCLAW_DLQ_URI": None,  # unset: <project>/openclaw-data/<spider>/deadletters.jsonl
    "OPENCLAW_DLQ_ENABLED": True,  # False: no DeadLetterPipeline (dead letters are only counted by others)
    "OPENCLAW_DLQ_ALERT_COUNT": 0,  # alert when this many dead letters were written (0: off)
    "OPENCLAW_DLQ_ALERT_RATIO": 0.0,  # alert when dead letters / downloaded requests exceeds this (0: off)
    "OPENCLAW_DLQ_ALERT_MIN_REQUESTS": 20,  # the ratio alert waits for this many requests
    "OPENCLAW_DLQ_ALERT_CLOSE": False,  # on alert also close the spider ("openclaw_dlq_threshold")
    # error snapshots (ErrorSnapshotMiddleware): the first responses of each error signature
    "OPENCLAW_SNAPSHOT_COUNT": 3,  # snapshots kept per signature (class, status, exception, domain); 0: off
    "OPENCLAW_SNAPSHOT_MAX_BYTES": 65536,  # body bytes kept per snapshot (the rest is cut)
    "OPENCLAW_SNAPSHOT_DIR": None,  # unset: snapshots/ beside the dead-letter file (<project>/openclaw-data/<spider>/)
    # --- stored requests (Redis queue, dead-letter replay, checkpoint): untrusted data ---
    "OPENCLAW_STORED_SCHEMES": ["http", "https"],  # URL schemes a stored request may have
    # meta keys a stored request may not carry, an extra filter on top of the store key (which is
    # the defence: a crawl's own sealed entries are trusted whole); e.g. ["bindaddress"]
    "OPENCLAW_STORED_META_DENY": [],
    # --- store key (HMAC seal on checkpoint lines, dead letters, Redis entries, control messages) ---
    # the key itself (16+ characters); unset: the environment variable below, else a key file
    # generated once per project (<project>/openclaw-data/store.key, 0600; not in distributed mode)
    "OPENCLAW_STORE_KEY": None,
    "OPENCLAW_STORE_KEY_ENV": "OPENCLAW_STORE_KEY",  # environment variable holding the key
    # True: read unsigned checkpoints and dead letters of older versions (with a warning)
    "OPENCLAW_STORE_ACCEPT_UNSIGNED": False,
    # query parameters masked in every log line and CLI output (a regex of names, "|"-separated;
    # also matched as the last _/-/. part of a name, e.g. x_signature)
    "OPENCLAW_SECRET_QUERY_PARAMS": (
        "password|passwd|pass|pwd|secret|token|access_token|api_key|apikey|key|sig|signature|auth|session"
    ),
    # --- metrics (MetricsExtension) ---
    "OPENCLAW_METRICS_PORT": 0,  # 0: no HTTP endpoint
    "OPENCLAW_METRICS_HOST": "127.0.0.1",  # interface the /metrics endpoint listens on
    # domains labelled individually in metrics; the rest aggregate as domain="other"
    "OPENCLAW_METRICS_MAX_DOMAINS": 50,
    "OPENCLAW_METRICS_PUSHGATEWAY": None,  # "host:port" of a Pushgateway: push once at close
    "OPENCLAW_LOG_DOMAINS": 10,  # rows of the per-domain table logged every LOGSTATS_INTERVAL; 0: off
    # seconds between the summed-up lines of a domain's repeated circuit openings; 0: log each one
    "OPENCLAW_LOG_REPEAT_INTERVAL": 60.0,
    # seconds a domain may stay near its min_rate (or keep its circuit opening) before one hint
    # names the policy key to change; 0: no hint
    "OPENCLAW_SLOW_HINT_AFTER": 600.0,
    # --- politeness report (PolitenessReportExtension, scrapy openclaw-report) ---
    "OPENCLAW_REPORT_ENABLED": True,  # False: no report at the end of the crawl
    "OPENCLAW_REPORT_PATH": None,  # unset: <project>/openclaw-data/<spider>/report.json (beside the dead letters); %(job)s: the scrapyd job
    "OPENCLAW_REPORT_ROWS": 20,  # domains in the report's log table (the busiest first); 0: no table
    # domains counted one by one in the figures and the report; the rest share one "other" row
    "OPENCLAW_REPORT_MAX_DOMAINS": 10000,
    # --- site memory (SiteMemoryExtension, scrapy openclaw-sites) ---
    "OPENCLAW_SITES_ENABLED": True,  # False: every crawl meets each site as a stranger (slow start)
    "OPENCLAW_SITES_PATH": None,  # unset: <project>/openclaw-data/sites.json (distributed mode: Redis)
    "OPENCLAW_SITES_MAX_ENTRIES": 10000,  # domains remembered; the least recently seen are dropped
    "OPENCLAW_SITES_MAX_AGE": 30 * 86400.0,  # seconds a domain is remembered after it was last crawled
    "OPENCLAW_SITES_SAVE_INTERVAL": 300.0,  # seconds between saves during a crawl (and one at close); 0: at close
    # --- live control (API on the metrics port, scrapy openclaw-ctl) ---
    "OPENCLAW_CONTROL_TOKEN": None,  # unset: no control API; set: the bearer token every call must carry
    "OPENCLAW_CONTROL_POLL": 0.5,  # seconds between reads of the Redis control stream (distributed mode)
    # Host header names the control API and /metrics answer besides IP addresses, localhost, this
    # machine's name and OPENCLAW_METRICS_HOST; others get 421 (a DNS-rebinding page cannot read them)
    "OPENCLAW_ALLOWED_HOSTS": [],
    # --- distributed (scrapy-redis) ---
    "OPENCLAW_DISTRIBUTED": False,  # True (with scrapy-redis's REDIS_URL): distributed mode
    "OPENCLAW_DISTRIBUTED_LEASE": 60.0,  # seconds a popped request stays leased without a heartbeat
    "OPENCLAW_DISTRIBUTED_HEARTBEAT": 0.0,  # seconds between lease extensions; 0: lease / 3
    "OPENCLAW_DISTRIBUTED_SCAN": 32,  # domains a pop considers at once (least recently served first)
    "OPENCLAW_DISTRIBUTED_MAX_RELEASES": 3,  # re-queues after an item failed in a pipeline; then dead letter
    "OPENCLAW_DISTRIBUTED_MAX_OUTAGE": 120.0,  # seconds a worker stays open while Redis is unreachable
    "OPENCLAW_DISTRIBUTED_SHARDS": 16,  # queue shards (by domain), one Redis Cluster hash tag each; fixed per crawl
    "OPENCLAW_DISTRIBUTED_PREFETCH": 4,  # requests a worker leases ahead at least (more when its downloader has free slots, or runs dry between rounds: up to 2x CONCURRENT_REQUESTS)
    "OPENCLAW_DISTRIBUTED_LIVENESS": 5.0,  # seconds without a sign of life before a worker's leases are handed back
    "OPENCLAW_DISTRIBUTED_ROUND_GAP": 0.05,  # seconds a page's writes wait to share a round (more: fewer round trips, more pages crawled twice after a crash)
    "OPENCLAW_REDIS_SENTINELS": [],  # "host:port" of Redis Sentinels; set: the master comes from them
    "OPENCLAW_REDIS_SENTINEL_MASTER": "mymaster",  # the Sentinel service name of the master
    # --- schedule (scrapy openclaw-schedule) ---
    "OPENCLAW_SCHEDULE_STATE_DIR": "openclaw-schedule",  # history, cursors, locks, per-window checkpoints
    "OPENCLAW_SCHEDULE_LOCK_TTL": 60.0,  # seconds a window lock lives without extension (extended every ttl/3)
    "OPENCLAW_SCHEDULE_STOP_TIMEOUT": 60.0,  # seconds a SIGTERMed crawl gets to checkpoint before SIGKILL
    "OPENCLAW_SCHEDULE_REDIS_PREFIX": "openclaw:schedule",  # key prefix of locks/history/cursors (with REDIS_URL)
    "OPENCLAW_SCHEDULE_METRICS_PORT": 0,  # the scheduler's own /metrics port (0: off); host OPENCLAW_METRICS_HOST
    "OPENCLAW_SCHEDULE_RUN_FILE": None,  # set by the scheduler on each crawl: where RunStatsExtension reports
    # --- process (HeapFreeze) ---
    "OPENCLAW_GC_FREEZE": True,  # freeze the start-up heap out of the cyclic GC while crawling (see heap.py)
}


# Ranges for the numeric flat settings; the type comes from the default.
_RANGES: dict[str, tuple[float, float]] = {
    "OPENCLAW_DISTRIBUTED_LEASE": (0.5, 86400.0),
    "OPENCLAW_DISTRIBUTED_HEARTBEAT": (0.0, 86400.0),
    "OPENCLAW_DISTRIBUTED_SCAN": (1, 10000),
    "OPENCLAW_DISTRIBUTED_MAX_RELEASES": (0, 1000),
    "OPENCLAW_DISTRIBUTED_MAX_OUTAGE": (0.0, 86400.0),
    "OPENCLAW_DISTRIBUTED_SHARDS": (1, 4096),
    "OPENCLAW_DISTRIBUTED_PREFETCH": (1, 1000),
    "OPENCLAW_DISTRIBUTED_LIVENESS": (1.0, 3600.0),
    "OPENCLAW_DISTRIBUTED_ROUND_GAP": (0.0, 10.0),
    "OPENCLAW_CHECKPOINT_FLUSH": (0.001, 3600.0),
    "OPENCLAW_CHECKPOINT_SNAPSHOT_INTERVAL": (0.01, 86400.0),
    "OPENCLAW_CHECKPOINT_SNAPSHOT_RECORDS": (0, 10**12),
    "OPENCLAW_FEED_FILE_MODE": (0, 0o777),
    "OPENCLAW_QUEUE_AGING_BOOST": (0.001, 1e9),
    "OPENCLAW_CRAWL_DELAY_MAX": (0.0, 86400.0),
    "OPENCLAW_HEALTH_IDLE_TTL": (0.0, 10**9),
    "OPENCLAW_DLQ_ALERT_COUNT": (0, 10**12),
    "OPENCLAW_DLQ_ALERT_RATIO": (0.0, 1.0),
    "OPENCLAW_DLQ_ALERT_MIN_REQUESTS": (0, 10**12),
    "OPENCLAW_SNAPSHOT_COUNT": (0, 1000),
    "OPENCLAW_SNAPSHOT_MAX_BYTES": (0, 64 * 1024 * 1024),
    "OPENCLAW_METRICS_PORT": (0, 65535),
    "OPENCLAW_METRICS_MAX_DOMAINS": (0, 100000),
    "OPENCLAW_LOG_DOMAINS": (0, 1000),
    "OPENCLAW_LOG_REPEAT_INTERVAL": (0.0, 86400.0),
    "OPENCLAW_SLOW_HINT_AFTER": (0.0, 10**7),
    "OPENCLAW_REPORT_ROWS": (0, 100000),
    "OPENCLAW_REPORT_MAX_DOMAINS": (1, 10**7),
    "OPENCLAW_SITES_MAX_ENTRIES": (1, 10**7),
    "OPENCLAW_SITES_MAX_AGE": (1.0, 10 * 365 * 86400.0),
    "OPENCLAW_SITES_SAVE_INTERVAL": (0.0, 86400.0),
    "OPENCLAW_CONTROL_POLL": (0.05, 60.0),
    "OPENCLAW_SCHEDULE_LOCK_TTL": (1.0, 86400.0),
    "OPENCLAW_SCHEDULE_STOP_TIMEOUT": (0.0, 86400.0),
    "OPENCLAW_SCHEDULE_METRICS_PORT": (0, 65535),
}

_GETTERS = {bool: "getbool", int: "getint", float: "getfloat", list: "getlist", dict: "getdict"}
# The type of a setting whose default (None: unset) does not tell it.
_TYPES: dict[str, type] = {"OPENCLAW_RETRY_HTTP_CODES": list}


def validate_settings(settings: Any) -> None:
    """Reject unknown ``OPENCLAW_*`` names, wrong types and out-of-range values."""
    for name in list(settings.attributes if hasattr(settings, "attributes") else settings):
        if not name.startswith("OPENCLAW_") or name in DEFAULTS:
            continue
        close = difflib.get_close_matches(name, DEFAULTS, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise OpenClawConfigError(f"setting {name}: unknown scrapy-openclaw setting{hint}")
    for name, default in DEFAULTS.items():
        if name not in settings or settings.get(name) is None:
            continue
        getter = _GETTERS.get(_TYPES.get(name, type(default)))
        if getter is None:  # str or path settings: any string is fine
            if (
                not isinstance(settings.get(name), (str, bytes))
                and default is None
                and not hasattr(settings.get(name), "__fspath__")
            ):
                raise OpenClawConfigError(f"setting {name}: expected a string, got {_short(settings.get(name))}")
            continue
        try:
            value = getattr(settings, getter)(name)
        except (TypeError, ValueError):
            raise OpenClawConfigError(
                f"setting {name}: expected {type(default).__name__}, got {_short(settings.get(name))}"
            ) from None
        bounds = _RANGES.get(name)
        if bounds and not bounds[0] <= value <= bounds[1]:
            raise OpenClawConfigError(f"setting {name}: {value!r} is out of range [{bounds[0]}, {bounds[1]}]")
        if name in _HTTP_STATUS_LISTS:
            _check_statuses(name, value)
    inline_policy(settings.get("OPENCLAW_POLICY"))  # a JSON text must hold an object
    registry = settings.get("OPENCLAW_HEALTH_REGISTRY_CLASS")
    if registry is not None and not isinstance(registry, (str, type)):
        raise OpenClawConfigError(
            f"setting OPENCLAW_HEALTH_REGISTRY_CLASS: expected a class or its import path, got {_short(registry)}"
        )


def inline_policy(value: Any) -> Any:
    """``OPENCLAW_POLICY`` as data: a dict, or a JSON object given as text (``-s OPENCLAW_POLICY='{...}'``)."""
    if hasattr(value, "copy_to_dict"):
        return value.copy_to_dict()
    if isinstance(value, (str, bytes)):
        if not value.strip():
            return {}
        try:
            value = json.loads(value)
        except (ValueError, RecursionError) as exc:
            raise OpenClawConfigError(f"setting OPENCLAW_POLICY: not a JSON object: {exc}") from None
        if not isinstance(value, dict):
            raise OpenClawConfigError(
                f"setting OPENCLAW_POLICY: the policy must be a mapping with 'defaults' and/or 'domains', "
                f"got JSON {type(value).__name__}"
            )
    return value or {}


def is_set(settings: BaseSettings, name: str) -> bool:
    """Whether *name* (a Scrapy setting) was set above Scrapy's default priority."""
    priority = settings.getpriority(name)
    return priority is not None and priority > SETTINGS_PRIORITIES["default"]


PREFIX = "OPENCLAW_"


def field_name(name: str) -> str:
    """``OPENCLAW_DLQ_ALERT_RATIO`` -> ``dlq_alert_ratio``, its field in :class:`OpenClawSettings`."""
    return name[len(PREFIX) :].lower()


def read_setting(settings: Any, name: str) -> Any:
    """One ``OPENCLAW_*`` setting, typed as its default, the default when unset.

    Lists come back as tuples; a string setting with a default also falls back
    to it when set to "". Call :func:`validate_settings` first: a value of the
    wrong type raises here as Scrapy's getters do.
    """
    default = DEFAULTS[name]
    kind = _TYPES.get(name, type(default))
    value = settings.get(name)
    if name == "OPENCLAW_POLICY":
        return inline_policy(value)
    if value is None:
        return tuple(default) if isinstance(default, list) else default
    getter = _GETTERS.get(kind)
    if getter is None:
        return value if value or default is None else default
    value = getattr(settings, getter)(name)
    return tuple(value) if kind is list else value


@dataclass(frozen=True)
class OpenClawSettings:
    """Every ``OPENCLAW_*`` setting of a crawl, validated, one field each (see :data:`DEFAULTS`).

    Components take it from :meth:`for_crawler`; built once per crawl, so a
    bad value raises :class:`OpenClawConfigError` at start in the first
    component that asks, with or without the add-on.
    """

    crawl_id: str | None
    policy_file: str | PathLike[str] | None
    policy: dict[str, Any]
    retry_http_codes: tuple[int | str, ...] | None
    parse_exceptions: tuple[str | type, ...]
    validation_exceptions: tuple[str | type, ...]
    health_enabled: bool
    health_registry_class: str | type
    crawl_delay_max: float
    health_idle_ttl: float
    ban_enabled: bool
    retry_enabled: bool
    dlq_permanent: bool
    queue_aging_boost: float
    checkpoint_dir: str | PathLike[str] | None
    checkpoint_flush: float
    checkpoint_snapshot_interval: float
    checkpoint_snapshot_records: int
    checkpoint_restart: bool
    feed_file_mode: int
    dlq_uri: str | PathLike[str] | None
    dlq_enabled: bool
    dlq_alert_count: int
    dlq_alert_ratio: float
    dlq_alert_min_requests: int
    dlq_alert_close: bool
    snapshot_count: int
    snapshot_max_bytes: int
    snapshot_dir: str | PathLike[str] | None
    stored_schemes: tuple[str, ...]
    stored_meta_deny: tuple[str, ...]
    store_key: str | None
    store_key_env: str
    store_accept_unsigned: bool
    secret_query_params: str
    metrics_port: int
    metrics_host: str
    metrics_max_domains: int
    metrics_pushgateway: str | None
    log_domains: int
    log_repeat_interval: float
    slow_hint_after: float
    report_enabled: bool
    report_path: str | PathLike[str] | None
    report_rows: int
    report_max_domains: int
    sites_enabled: bool
    sites_path: str | PathLike[str] | None
    sites_max_entries: int
    sites_max_age: float
    sites_save_interval: float
    control_token: str | None
    control_poll: float
    allowed_hosts: tuple[str, ...]
    distributed: bool
    distributed_lease: float
    distributed_heartbeat: float
    distributed_scan: int
    distributed_max_releases: int
    distributed_max_outage: float
    distributed_shards: int
    distributed_prefetch: int
    distributed_liveness: float
    distributed_round_gap: float
    redis_sentinels: tuple[str, ...]
    redis_sentinel_master: str
    schedule_state_dir: str
    schedule_lock_ttl: float
    schedule_stop_timeout: float
    schedule_redis_prefix: str
    schedule_metrics_port: int
    schedule_run_file: str | PathLike[str] | None
    gc_freeze: bool

    @classmethod
    def from_settings(cls, settings: Any) -> OpenClawSettings:
        """Validate *settings* (:func:`validate_settings`) and read every ``OPENCLAW_*`` setting.

        The result becomes the process's configuration (:func:`on_configured`).
        """
        validate_settings(settings)
        return cls.read(settings)

    @classmethod
    def read(cls, settings: Any) -> OpenClawSettings:
        """Read *settings* that :func:`validate_settings` accepted (the add-on's own writes since)."""
        config = cls(**{field_name(name): read_setting(settings, name) for name in DEFAULTS})
        if config.distributed and not config.store_key and not os.environ.get(config.store_key_env or ""):
            raise missing_shared_key(config.store_key_env)
        _configured(config)
        return config

    @classmethod
    def for_crawler(cls, crawler: Crawler) -> OpenClawSettings:
        """The crawl's one instance, built from ``crawler.settings`` by the first caller
        (the add-on's, unless a setting changed after it).

        A bad value stops the crawl at start with one line (:func:`~scrapy_openclaw.startup.refuse_start`).
        """
        try:
            return shared(crawler, "openclaw_settings", lambda: _seen_or_new(crawler))
        except OpenClawConfigError as exc:
            refuse_start(crawler, exc)
            raise

    def remember(self, crawler: Crawler, settings: BaseSettings) -> OpenClawSettings:
        """Keep this instance (read from *settings*, the crawl's) for :meth:`for_crawler`."""
        seen: dict[str, tuple[dict[str, Any], OpenClawSettings]] = shared(crawler, "openclaw_settings_seen", dict)
        seen["seen"] = (_raw(settings), self)
        return self


def missing_shared_key(env: str) -> OpenClawConfigError:
    """Distributed mode without a store key every worker shares."""
    return OpenClawConfigError(
        "setting OPENCLAW_DISTRIBUTED=True needs a store key shared by every worker: set "
        f"OPENCLAW_STORE_KEY or the environment variable {env or 'OPENCLAW_STORE_KEY'} to the same "
        "secret (at least 16 characters, e.g. `python -c 'import secrets; print(secrets.token_hex(32))'`) "
        "on every worker"
    )


def crawl_id(crawler: Crawler) -> str:
    """A stable id for this crawl (``OPENCLAW_CRAWL_ID`` or a random one).

    The checkpoint extension restores it on resume, so dead letters and
    metrics of a resumed crawl carry the same id.
    """
    return shared(crawler, "crawl_id", lambda: OpenClawSettings.for_crawler(crawler).crawl_id or uuid.uuid4().hex[:16])


def _raw(settings: Any) -> dict[str, Any]:
    return {name: settings.get(name) for name in settings if str(name).startswith(PREFIX)}


def _seen_or_new(crawler: Crawler) -> OpenClawSettings:
    seen = (peek(crawler, "openclaw_settings_seen") or {}).get("seen")
    if seen is not None and seen[0] == _raw(crawler.settings):
        return seen[1]
    return OpenClawSettings.from_settings(crawler.settings)


_listeners: list[Callable[[OpenClawSettings], None]] = []
_latest: list[OpenClawSettings] = []


def on_configured(listener: Callable[[OpenClawSettings], None]) -> None:
    """Call *listener* with every configuration read from now on, and the latest one at once.

    For process-wide state a crawl's settings name (the store key): the
    modules that keep it listen here, so this one imports none of them.
    """
    _listeners.append(listener)
    if _latest:
        listener(_latest[0])


def _configured(config: OpenClawSettings) -> None:
    redact.configure(config.secret_query_params)
    _latest[:] = [config]
    for listener in _listeners:
        listener(config)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"


#: List settings whose elements are HTTP statuses.
_HTTP_STATUS_LISTS = ("OPENCLAW_RETRY_HTTP_CODES",)


def _check_statuses(name: str, values: list[Any]) -> None:
    for value in values:
        text = str(value).strip()
        if isinstance(value, bool) or not text.isdigit() or not 100 <= int(text[:4]) <= 599 or len(text) != 3:
            raise OpenClawConfigError(
                f"setting {name}: {value!r} is not an HTTP status (a whole number from 100 to 599)"
            )
