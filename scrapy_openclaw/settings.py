"""Every ``OPENCLAW_*`` setting and its default, in one place.

Components read these through ``crawler.settings`` with typed getters; the
defaults below are what they fall back to. The add-on writes them at
``"addon"`` priority, so a project's own ``settings.py`` always wins.
Per-domain knobs (health, retry, deadline) are not flat settings: they live in
the policy (``OPENCLAW_POLICY`` / ``OPENCLAW_POLICY_FILE``, see ``policy.py``).
"""

from __future__ import annotations

from typing import Any

DEFAULTS: dict[str, Any] = {
    "OPENCLAW_CRAWL_ID": None,  # unset: a random id, kept across checkpoint resumes
    # --- policy (per-domain knobs; schema in scrapy_openclaw/policy.py) ---
    "OPENCLAW_POLICY_FILE": None,  # path to a YAML policy file
    "OPENCLAW_POLICY": {},  # the same schema as the YAML file, as a dict
    # --- error taxonomy ---
    # statuses that are worth retrying; every other 4xx/5xx is permanent
    "OPENCLAW_RETRY_HTTP_CODES": [408, 429, 500, 502, 503, 504, 522, 524],
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
    "OPENCLAW_HEALTH_ENABLED": True,
    # --- retry (ClassifiedRetryMiddleware, ParseRetryMiddleware) ---
    "OPENCLAW_RETRY_ENABLED": True,  # Scrapy's RETRY_ENABLED=False also disables it
    # --- queue (DeadlinePriorityQueue) ---
    # --- checkpoint (CheckpointExtension) ---
    "OPENCLAW_CHECKPOINT_DIR": None,  # unset: no checkpointing
    "OPENCLAW_CHECKPOINT_FLUSH": 1.0,  # seconds between journal fsyncs (group commit)
    # --- dead letters (DeadLetterPipeline) ---
    "OPENCLAW_DLQ_URI": None,  # unset: jsonl file under the checkpoint dir or ./openclaw-data
    # --- metrics (MetricsExtension) ---
    "OPENCLAW_METRICS_PORT": 0,  # 0: no HTTP endpoint
    "OPENCLAW_METRICS_HOST": "127.0.0.1",
    # --- distributed (scrapy-redis) ---
    "OPENCLAW_DISTRIBUTED": False,
}


# Ranges for the numeric flat settings; the type comes from the default.
_RANGES: dict[str, tuple[float, float]] = {
    "OPENCLAW_CHECKPOINT_FLUSH": (0.001, 3600.0),
    "OPENCLAW_METRICS_PORT": (0, 65535),
}

_GETTERS = {bool: "getbool", int: "getint", float: "getfloat", list: "getlist", dict: "getdict"}


def validate_settings(settings: Any) -> None:
    """Reject unknown ``OPENCLAW_*`` names, wrong types and out-of-range values."""
    from scrapy_openclaw.errors import OpenClawConfigError

    for name in list(settings.attributes if hasattr(settings, "attributes") else settings):
        if not name.startswith("OPENCLAW_") or name in DEFAULTS:
            continue
        close = [n for n in DEFAULTS if n[9:12] == name[9:12]]
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise OpenClawConfigError(f"setting {name}: unknown scrapy-openclaw setting{hint}")
    for name, default in DEFAULTS.items():
        if name not in settings or settings.get(name) is None:
            continue
        getter = _GETTERS.get(type(default))
        if getter is None:  # str or path settings: any string is fine
            if not isinstance(settings.get(name), (str, bytes)) and default is None and not hasattr(settings.get(name), "__fspath__"):
                raise OpenClawConfigError(f"setting {name}: expected a string, got {settings.get(name)!r}")
            continue
        try:
            value = getattr(settings, getter)(name)
        except (TypeError, ValueError):
            raise OpenClawConfigError(
                f"setting {name}: expected {type(default).__name__}, got {settings.get(name)!r}"
            ) from None
        bounds = _RANGES.get(name)
        if bounds and not bounds[0] <= value <= bounds[1]:
            raise OpenClawConfigError(
                f"setting {name}: {value!r} is out of range [{bounds[0]}, {bounds[1]}]"
            )
