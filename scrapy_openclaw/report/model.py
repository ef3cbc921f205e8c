"""The politeness report as data: what a crawl did to each site, merged across workers, validated when read back.

Built from the figures' and the health registry's own values, never counted again
here. One domain's fields are explained in docs/politeness-report.md ("The figures").
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from scrapy_openclaw.metrics.figures import ROBOTS_EXAMPLES
from scrapy_openclaw.metrics.peaks import WINDOWS

if TYPE_CHECKING:
    from scrapy_openclaw.health.reader import HealthReader
    from scrapy_openclaw.metrics.figures import CrawlFigures, DomainFigures

VERSION = 1
#: Fields that add up across workers (the rest: the largest, or the shared registry's value).
SUMMED: tuple[str, ...] = (
    "requests",
    "retries",
    "done",
    "failures",
    "errors",
    "bytes",
    "throttled_429",
    "unavailable_503",
    "circuit_openings",
)


class ReportError(ValueError):
    """A stored report that is not one (names the file and what is wrong)."""


def domain_entry(f: DomainFigures, state: Any = None) -> dict[str, Any]:
    """One domain's entry from its figures and, when known, its health-registry state."""
    return {
        "requests": f.requests,
        "retries": f.retries,
        "done": f.done,
        "failures": f.failures,
        "errors": f.errors,
        "bytes": f.bytes,
        "busiest_1s": f.peaks.peak(WINDOWS[0]),
        "busiest_5s": f.peaks.peak(WINDOWS[1]),
        "answers": dict(sorted(f.answers.items())),
        "statuses": {str(s): n for s, n in sorted(f.statuses.items())},
        "throttled_429": f.statuses.get(429, 0),
        "unavailable_503": f.statuses.get(503, 0),
        "retry_after": {
            "received": f.retry_after_received,
            "honoured": int(state.retry_after_holds) if state is not None else 0,
            "largest_seconds": f.retry_after_max,
            "held_seconds": _seconds(state.blocked_seconds - state.circuit_seconds) if state is not None else 0.0,
        },
        "held_seconds": _seconds(state.blocked_seconds) if state is not None else 0.0,
        "circuit_openings": f.circuit_openings,
        "circuit_seconds": _seconds(state.circuit_seconds) if state is not None else 0.0,
        "robots_txt": {
            "status": f.robots_status,
            "crawl_delay": float(state.crawl_delay) if state is not None else 0.0,
            "disallowed": f.robots_refused,
            "disallowed_paths": list(f.robots_refused_paths),
        },
        "limit": state.limit if state is not None else None,
        # the pace the site said in its RateLimit headers (req/s; None: it said none)
        "declared_limit": (float(state.declared) or None) if state is not None else None,
        "dead_letters": dict(sorted(f.dead_letters.items())),
    }


def _seconds(value: float) -> float:
    return round(max(0.0, float(value)), 3)


def build_report(
    figures: CrawlFigures,
    registry: HealthReader | None,
    *,
    spider: str,
    crawl_id: str,
    started_at: float,
    finish_reason: str | None = None,
    robots_forbidden: int = 0,
) -> dict[str, Any]:
    """The report of this process's crawl (a worker's part in distributed mode)."""
    known = set(registry.domains()) if registry is not None else set()
    domains = {
        domain: domain_entry(f, registry.state(domain) if registry is not None and domain in known else None)
        for domain, f in figures.domains.items()
    }
    return {
        "version": VERSION,
        "spider": spider,
        "crawl_id": crawl_id,
        "started_at": started_at,
        "finished_at": time.time(),
        "finish_reason": finish_reason,
        "workers": 1,
        "robots_forbidden": robots_forbidden,
        "domains": dict(sorted(domains.items(), key=busiest_first)),
    }


def busiest_first(item: tuple[str, dict[str, Any]]) -> tuple[int, int, str]:
    domain, entry = item
    return (-int(entry["busiest_1s"]), -int(entry["requests"]), domain)


def merge(parts: list[dict[str, Any]], peaks: dict[str, dict[str, int]] | None = None) -> dict[str, Any]:
    """Several workers' parts as one report; *peaks* (domain -> busiest_1s/5s across all workers,
    from Redis) replaces the per-worker ones, which do not add up."""
    if not parts:
        raise ReportError("no report parts to merge")
    merged: dict[str, Any] = {k: v for k, v in parts[0].items() if k != "domains"}
    merged["workers"] = sum(int(p.get("workers", 1)) for p in parts)
    merged["started_at"] = min(p["started_at"] for p in parts)
    merged["finished_at"] = max(p["finished_at"] for p in parts)
    merged["robots_forbidden"] = sum(int(p.get("robots_forbidden", 0)) for p in parts)
    domains: dict[str, dict[str, Any]] = {}
    for part in parts:
        for domain, entry in part["domains"].items():
            into = domains.get(domain)
            domains[domain] = _copy(entry) if into is None else _add(into, entry)
    for domain, best in (peaks or {}).items():
        if domain in domains:
            domains[domain].update(best)
    merged["domains"] = dict(sorted(domains.items(), key=busiest_first))
    return merged


def _copy(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: dict(v) if isinstance(v, dict) else v for k, v in entry.items()}


def _add(into: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    for name in SUMMED:
        into[name] += entry[name]
    for name in ("answers", "statuses", "dead_letters"):
        for key, n in entry[name].items():
            into[name][key] = into[name].get(key, 0) + n
    into["retry_after"]["received"] += entry["retry_after"]["received"]
    largest = max(into["retry_after"]["largest_seconds"], entry["retry_after"]["largest_seconds"])
    into["retry_after"]["largest_seconds"] = largest
    for name in (
        "busiest_1s",
        "busiest_5s",
        "held_seconds",
        "circuit_seconds",
    ):  # (the shared registry's, or the largest)
        into[name] = max(into.get(name, 0), entry.get(name, 0))
    for name in ("honoured", "held_seconds"):  # (a part from before these existed has neither)
        into["retry_after"][name] = max(into["retry_after"].get(name, 0), entry["retry_after"].get(name, 0))
    robots, theirs = into["robots_txt"], entry["robots_txt"]
    if robots["status"] is None:
        robots.update(status=theirs["status"], crawl_delay=theirs["crawl_delay"])
    robots["disallowed"] = robots.get("disallowed", 0) + theirs.get("disallowed", 0)
    paths = robots.get("disallowed_paths", []) + theirs.get("disallowed_paths", [])
    robots["disallowed_paths"] = list(dict.fromkeys(paths))[:ROBOTS_EXAMPLES]
    into["limit"] = into["limit"] if into["limit"] is not None else entry["limit"]
    if into.get("declared_limit") is None:  # (a part from before it existed has none)
        into["declared_limit"] = entry.get("declared_limit")
    return into


def validate(data: Any, where: str) -> dict[str, Any]:
    """*data* if it is a report this version reads; a :class:`ReportError` naming *where* otherwise."""
    if not isinstance(data, dict):
        raise ReportError(f"{where}: not a politeness report (expected a JSON object)")
    if data.get("version") != VERSION:
        raise ReportError(f"{where}: report version {data.get('version')!r}, this version reads {VERSION}")
    domains = data.get("domains")
    if not isinstance(domains, dict):
        raise ReportError(f"{where}: 'domains' is missing or not an object")
    for domain, entry in domains.items():
        if not isinstance(entry, dict) or not all(isinstance(entry.get(k), (int, float)) for k in SUMMED):
            raise ReportError(f"{where}: domain {domain!r}: an entry needs the numbers {', '.join(SUMMED)}")
    return data
