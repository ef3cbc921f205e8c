"""The registry's state as JSON-safe data and back, for checkpoints; restoring validates every field.

A mixin of :class:`HealthRegistry`: a bad or foreign snapshot raises
ValueError naming the spot rather than crawling on made-up state.
"""

from __future__ import annotations

import math
import time
from typing import Any

from scrapy_openclaw.health.registry.core import _RegistryCore
from scrapy_openclaw.health.registry.record import _COUNTERS, _FIELD_TYPES, _OBSOLETE, _Domain
from scrapy_openclaw.health.registry.tuning import _MAX_DOUBLINGS, _MAX_RATE, CLOSED, HALF_OPEN, OPEN, SNAPSHOT_VERSION


class _Snapshots(_RegistryCore):
    """``snapshot`` and ``restore``."""

    def snapshot(self) -> dict[str, Any]:
        """Every domain's state as JSON-safe data (for checkpoints)."""
        return {
            "version": SNAPSHOT_VERSION,
            "domains": {
                name: {field: getattr(d, field) for field in _Domain.__slots__} for name, d in self._domains.items()
            },
        }

    def restore(self, data: Any) -> None:
        """Replace the state with a :meth:`snapshot`; bad data raises ValueError naming the spot."""
        if not isinstance(data, dict):
            raise ValueError(f"health snapshot: expected a dict, got {type(data).__name__}")
        if data.get("version") != SNAPSHOT_VERSION:
            raise ValueError(
                f"health snapshot: unsupported version {data.get('version')!r} "
                f"(this scrapy-openclaw reads version {SNAPSHOT_VERSION})"
            )
        domains = data.get("domains")
        if not isinstance(domains, dict):
            raise ValueError("health snapshot: 'domains' must be a mapping of domain to state")
        restored = {}
        for name, fields in domains.items():
            restored[name] = self._restore_domain(name, fields)
        self._domains = restored
        self._histories = {}  # (not in snapshots: a fit starts again from the next answers)
        self.readiness_epoch += 1

    def _restore_domain(self, name: Any, fields: Any) -> _Domain:
        where = f"health snapshot: domain {name!r}"
        if not isinstance(name, str) or not isinstance(fields, dict):
            raise ValueError(f"{where}: expected a string domain mapped to a dict of fields")
        d = _Domain(self.policy(name), time.time())
        for field, value in fields.items():
            if field in _OBSOLETE:
                continue
            types = _FIELD_TYPES.get(field)
            if types is None:
                raise ValueError(f"{where}: unknown field {field!r}")
            bad_type = not isinstance(value, types) or (isinstance(value, bool) and bool not in types)
            if bad_type or (isinstance(value, float) and not math.isfinite(value)):
                raise ValueError(f"{where}: field {field!r}: bad value {value!r}")
            if field == "circuit" and value not in (CLOSED, OPEN, HALF_OPEN):
                raise ValueError(f"{where}: field 'circuit': {value!r} is not closed/open/half_open")
            setattr(d, field, int(value) if field in _COUNTERS else value)
        d.health = min(100.0, max(0.0, float(d.health)))
        d.opens = min(max(0, d.opens), _MAX_DOUBLINGS)
        d.burst_cap = max(0, d.burst_cap)  # (0: none; a negative one would pin the bucket at one token)
        d.cooldown = max(0.0, float(d.cooldown))
        d.rate = min(max(float(d.rate), 0.0), _MAX_RATE)
        return d
