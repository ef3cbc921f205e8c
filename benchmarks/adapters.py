"""Turn each scenario's own result dict into comparable tables.

Scenario modules are written by different people and return what suits
them (``run(quick) -> dict``). The report needs one shape: tables whose rows
are configurations and whose columns are metrics, with a baseline row (plain
Scrapy, or what stands for it) to compute ratios against. Each adapter reads
one scenario's dict defensively: a configuration that failed or a key that is
missing becomes an empty cell, never a crash, so one broken scenario cannot
take the report down.

A scenario may also return the suite's native shape directly::

    {"baseline": "scrapy", "configs": {"scrapy": {"metric": 1.0, ...}, ...}}

which :func:`generic` understands (see :mod:`benchmarks.overhead`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    better: str = ""  # "higher", "lower" or "" (information only)
    ratio: bool = True  # show the ratio to the baseline row


@dataclass(frozen=True)
class Headline:
    """The one number a reader should look at first, with the issue's target."""

    metric: str
    ours: str  # the configuration that is scrapy-openclaw
    target: str  # human text, e.g. ">= 0.99"
    check: Callable[[float | None, float | None], bool | None]  # (value, ratio) -> met?


@dataclass
class Table:
    title: str
    baseline: str | None  # row the ratios are computed against (None: no ratios)
    metrics: list[Metric]
    rows: dict[str, dict[str, float | None]] = field(default_factory=dict)
    headlines: list[Headline] = field(default_factory=list)


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _rows(configs: dict[str, Any], metrics: list[Metric]) -> dict[str, dict[str, float | None]]:
    rows = {}
    for name, data in configs.items():
        if not isinstance(data, dict):
            continue
        failed = "error" in data
        rows[name] = {m.key: None if failed else _num(data.get(m.key)) for m in metrics}
    return rows


def at_least(limit: float, on: str = "value") -> Callable[[float | None, float | None], bool | None]:
    def check(value: float | None, ratio: float | None) -> bool | None:
        x = value if on == "value" else ratio
        return None if x is None else x >= limit

    return check


def at_most(limit: float, on: str = "value") -> Callable[[float | None, float | None], bool | None]:
    def check(value: float | None, ratio: float | None) -> bool | None:
        x = value if on == "value" else ratio
        return None if x is None else x <= limit

    return check


# --------------------------------------------------------------------------- per scenario


def flaky(raw: dict[str, Any]) -> list[Table]:
    metrics = [
        Metric("success_rate", "success rate", "higher"),
        Metric("seconds", "wall s", "lower"),
        Metric("requests_at_server", "requests at server", "lower"),
        Metric("retries", "retries", "", ratio=False),
        Metric("dead_letters", "dead letters", "", ratio=False),
    ]
    configs = {k: v for k, v in raw.items() if isinstance(v, dict) and ("success_rate" in v or "error" in v)}
    return [Table("flaky: 4 hosts, 503 windows ~30%, drops and hangs", "scrapy", metrics,
                  _rows(configs, metrics), [Headline("success_rate", "openclaw", ">= 0.99", at_least(0.99))])]


def ratelimit(raw: dict[str, Any]) -> list[Table]:
    metrics = [
        Metric("share_429_after_5s", "429 share after 5 s", "lower"),
        Metric("share_429", "429 share", "lower"),
        Metric("rate_2xx_fraction_after_5s", "2xx rate / limit after 5 s", "higher"),
        Metric("rate_2xx_fraction", "2xx rate / limit", "higher"),
        Metric("scraped_fraction", "pages scraped", "higher"),
        Metric("seconds", "wall s", "lower"),
    ]
    configs = {k: v for k, v in raw.items()
               if isinstance(v, dict) and k != "summary" and ("share_429" in v or "error" in v)}
    return [Table("ratelimit: 3 hosts, 10 req/s + burst 5 each, 429 beyond", "scrapy", metrics,
                  _rows(configs, metrics),
                  [Headline("share_429_after_5s", "openclaw", "<= 0.02", at_most(0.02)),
                   # plain Scrapy may give up within 5 s: the whole crawl compares them too
                   Headline("share_429", "openclaw", "(whole crawl, no target)", lambda value, ratio: None),
                   Headline("rate_2xx_fraction_after_5s", "openclaw", ">= 0.85", at_least(0.85))])]


def hol(raw: dict[str, Any]) -> list[Table]:
    metrics = [
        Metric("total_vs_bound", "total / lower bound", "lower"),
        Metric("fast_vs_alone", "fast done / fast alone", "lower"),
        Metric("total", "total s", "lower"),
        Metric("fast_done", "fast hosts done s", "lower"),
        Metric("pages", "pages", "", ratio=False),
    ]
    queues = raw.get("queues") or {}
    # Scrapy's default queue (DownloaderAwarePriorityQueue since 2.x) is the plain-Scrapy baseline.
    baseline = "downloader_aware" if "downloader_aware" in queues else "scrapy"
    return [Table("hol: 8 fast hosts + 2 slow (1.5 s) hosts, by priority queue", baseline, metrics,
                  _rows(queues, metrics),
                  [Headline("total_vs_bound", "deadline", "<= 1.15", at_most(1.15)),
                   Headline("fast_vs_alone", "deadline", "<= 1.2", at_most(1.2))])]


def queue(raw: dict[str, Any]) -> list[Table]:
    metrics = [
        Metric("push_per_s", "push/s", "higher"),
        Metric("pop_per_s", "pop/s", "higher"),
        Metric("total_bytes_per_request", "bytes per pending request", "lower"),
        # near zero for Scrapy's own queue: a ratio to it means nothing
        Metric("overhead_bytes_per_request", "queue overhead bytes/request", "lower", ratio=False),
    ]
    n = raw.get("requests")
    title = f"queue: {n:,} pending requests in memory" if isinstance(n, int) else "queue: pending requests"
    return [Table(title, "scrapy", metrics, _rows(raw.get("results") or {}, metrics),
                  [Headline("total_bytes_per_request", "deadline", "<= 1.10 x", at_most(1.10, on="ratio"))])]


def killresume(raw: dict[str, Any]) -> list[Table]:
    tables = []
    kills = raw.get("kill9_x3") or {}
    km = [
        Metric("pages_lost", "pages lost", "lower", ratio=False),
        Metric("duplicate_fetches", "duplicate fetches", "lower"),
        Metric("kills", "kills", "", ratio=False),
        Metric("reachable_pages", "reachable pages", "", ratio=False),
        Metric("seconds", "wall s", "lower"),
    ]
    tables.append(Table("killresume: kill -9 x3 then finish", "scrapy_jobdir", km, _rows(kills, km),
                        [Headline("pages_lost", "openclaw_checkpoint", "== 0", at_most(0))]))
    tp = raw.get("throughput") or {}
    tm = [Metric("pages_per_s", "pages/s", "higher")]
    tp_rows = {"checkpoint_off": {"pages_per_s": _num(tp.get("pages_per_s_off"))},
               "checkpoint_on": {"pages_per_s": _num(tp.get("pages_per_s_on"))}}
    tables.append(Table("killresume: throughput with checkpointing", "checkpoint_off", tm, tp_rows,
                        [Headline("pages_per_s", "checkpoint_on", ">= 0.95 x", at_least(0.95, on="ratio"))]))
    scale = raw.get("scale") or {}
    if scale:
        sm = [Metric(k, k.replace("_", " "), "", ratio=False) for k, v in scale.items() if _num(v) is not None]
        tables.append(Table("killresume: checkpoint at scale", None, sm, _rows({"openclaw_checkpoint": scale}, sm)))
    return tables


def distributed(raw: dict[str, Any]) -> list[Table]:
    tables = []
    sm = [Metric("seconds", "wall s", "lower"), Metric("speedup", "speedup", "higher", ratio=False),
          Metric("unique", "pages", "", ratio=False), Metric("expected", "reachable", "", ratio=False)]
    scaling = {f"openclaw_{row.get('workers')}_workers": row for row in raw.get("scaling") or []
               if isinstance(row, dict)}
    tables.append(Table("distributed: scaling on a fault-free site", "openclaw_1_workers", sm, _rows(scaling, sm),
                        [Headline("speedup", "openclaw_3_workers", "> 1 (informative)", at_least(1.0))]))
    km = [Metric("lost", "pages lost", "lower", ratio=False), Metric("duplicates", "duplicates", "lower"),
          Metric("scraped_unique", "pages scraped", "higher"), Metric("expected", "reachable", "", ratio=False)]
    kills = {_kind(row): row for row in raw.get("kill") or [] if isinstance(row, dict)}
    tables.append(Table("distributed: 3 workers, one killed -9", "scrapy_redis", km, _rows(kills, km),
                        [Headline("lost", "openclaw", "== 0", at_most(0))]))
    rm = [Metric("over_limit", "busiest 1 s / (limit + burst)", "lower"),
          Metric("max_1s_window", "busiest 1 s", "lower"),
          Metric("limit", "limit req/s", "", ratio=False), Metric("requests", "requests", "", ratio=False)]
    rate = {}
    for row in raw.get("rate") or []:
        if isinstance(row, dict):
            allowed = (_num(row.get("limit")) or 0) + (_num(row.get("burst")) or 0)
            peak = _num(row.get("max_1s_window"))
            rate[_kind(row)] = {**row, "over_limit": peak / allowed if allowed and peak is not None else None}
    tables.append(Table("distributed: combined per-domain rate, 3 workers", "scrapy_redis", rm, _rows(rate, rm),
                        [Headline("over_limit", "openclaw", "<= 1", at_most(1.0))]))
    return tables


def _kind(row: dict[str, Any]) -> str:
    kind = str(row.get("kind"))
    return "scrapy_redis" if kind == "plain" else kind


def generic(raw: dict[str, Any], title: str = "") -> list[Table]:
    """The native shape ``{"baseline": ..., "configs": {name: {metric: number}}}``."""
    configs = raw.get("configs") or {}
    keys: list[str] = []
    for data in configs.values():
        if isinstance(data, dict):
            keys += [k for k, v in data.items() if _num(v) is not None and k not in keys]
    metrics = [Metric(k, k.replace("_", " ")) for k in keys]
    return [Table(title or "results", raw.get("baseline"), metrics, _rows(configs, metrics))]


def overhead(raw: dict[str, Any]) -> list[Table]:
    metrics = [
        Metric("pages_per_s", "pages/s", "higher"),
        Metric("peak_rss_mb", "peak RSS MB", "lower"),
        Metric("wall_s", "wall s", "lower"),
        Metric("scraped", "pages scraped", "", ratio=False),
        Metric("duplicates", "duplicates", "", ratio=False),
    ]
    n = f"{raw.get('hosts')} hosts x {raw.get('pages_per_host')} pages"
    return [Table(f"overhead: fault-free fast site, {n}", raw.get("baseline", "scrapy"), metrics,
                  _rows(raw.get("configs") or {}, metrics),
                  [Headline("pages_per_s", "openclaw", ">= 0.95 x", at_least(0.95, on="ratio"))])]


ADAPTERS: dict[str, Callable[[dict[str, Any]], list[Table]]] = {
    "flaky": flaky,
    "ratelimit": ratelimit,
    "hol": hol,
    "queue": queue,
    "killresume": killresume,
    "distributed": distributed,
    "overhead": overhead,
}


def adapt(scenario: str, raw: dict[str, Any]) -> list[Table]:
    """Tables for one run of ``scenario``; an unknown scenario gets the generic reading."""
    return ADAPTERS.get(scenario, generic)(raw)
