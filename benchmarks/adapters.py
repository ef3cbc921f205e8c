"""How each scenario's result reads as tables: metric labels, ratios and the issue's targets.

Every scenario returns tables in one shape, either a single table::

    {"baseline": "scrapy", "configs": {"scrapy": {"metric": 1.0, ...}, ...}, ...}

or several under ``"tables"``: ``{"tables": {"kill": {<table>}, "throughput": {<table>}}}``.
Rows are configurations, ``baseline`` is the row ratios are computed against
(plain Scrapy, or what stands for it; ``None`` for no ratios). What a table
*means* (title, which metrics to show and how, headline targets) is declared
here in :data:`SPECS`, next to the other scenarios', so the report reads
alike everywhere. A configuration that failed (``{"error": ...}``) or a
missing key becomes an empty cell, never a crash: one broken scenario cannot
take the report down. A scenario without a spec gets every numeric key.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Check = Callable[[float | None, float | None], bool | None]  # (value, ratio) -> met?


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
    check: Check


@dataclass(frozen=True)
class Spec:
    title: str
    metrics: list[Metric]
    headlines: list[Headline] = field(default_factory=list)
    key: str | None = None  # the table under raw["tables"]; None: raw is the table


@dataclass
class Table:
    title: str
    baseline: str | None
    metrics: list[Metric]
    rows: dict[str, dict[str, float | None]] = field(default_factory=dict)
    headlines: list[Headline] = field(default_factory=list)


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def at_least(limit: float, on: str = "value") -> Check:
    return lambda value, ratio: (
        None if (value if on == "value" else ratio) is None else ((value if on == "value" else ratio) >= limit)
    )


def at_most(limit: float, on: str = "value") -> Check:
    return lambda value, ratio: (
        None if (value if on == "value" else ratio) is None else ((value if on == "value" else ratio) <= limit)
    )


def no_target(value: float | None, ratio: float | None) -> None:
    return None


M = Metric
SWEEP_LIMITS = (3, 12, 40, 60, 150)  # benchmarks.sweep.LIMITS (not imported: the report must not need it)
SMALL_BUCKET_LIMITS = (12, 40, 60, 150)  # benchmarks.smallbucket.LIMITS


def _limit_specs(name: str, site: str, limits: tuple[int, ...], headlines: list[Headline]) -> list[Spec]:
    """The tables of a limit sweep (``benchmarks.sweep``, ``benchmarks.smallbucket``): the crawl, then per host."""
    return [
        Spec(
            f"{name}: {site}",
            [
                M("rate_after_5s_min_host", "min host 2xx rate / limit after 5 s", "higher"),
                M("share_429", "429 share", "lower"),
                M("share_429_max_host", "max host 429 share", "lower"),
                M("share_429_after_5s_max_host", "max host 429 share after its first 5 s", "lower"),
                M("wall_vs_bound", "wall / lower bound", "lower"),
                M("scraped_fraction", "pages scraped", "higher"),
                M("finished", "ended by itself", ratio=False),
            ],
            headlines,
        ),
        Spec(
            f"{name} per host: 2xx rate / limit after the host's first 5 s, and 429 share",
            [
                *(M(f"rate_after_5s_{limit}", f"{limit}/s: rate", "higher", ratio=False) for limit in limits),
                *(M(f"share_429_{limit}", f"{limit}/s: 429s", "lower", ratio=False) for limit in limits),
            ],
        ),
    ]


SPECS: dict[str, list[Spec]] = {
    "overhead": [
        Spec(
            "overhead: fault-free fast site, one host x 5,000 pages (quick 500), no latency",
            [
                M("pages_per_s", "pages/s", "higher"),
                M("peak_rss_mb", "peak RSS MB", "lower"),
                M("wall_s", "wall s", "lower"),
                M("scraped", "pages scraped", ratio=False),
                M("duplicates", "duplicates", ratio=False),
                M("complete", "done within the cap", ratio=False),
            ],
            [Headline("pages_per_s", "openclaw", ">= 0.95 x", at_least(0.95, on="ratio"))],
        )
    ],
    "bench": [
        Spec(
            f"bench: scrapy bench {title}",
            [
                M("pages_per_min", "pages/min (steady)", "higher"),
                M("overall_pages_per_min", "pages/min (whole run)", "higher"),
                M("kb_per_s", "response kB/s", "higher"),
                M("bytes_per_page", "bytes per page"),
                M("depth_max", "deepest request", ratio=False),
                M("runs_ok", "runs", ratio=False),
            ],
            [Headline("pages_per_min", ours, ">= 0.95 x", at_least(0.95, on="ratio"))],
            key=key,
        )
        for key, ours, title in (
            ("as_run", "openclaw", "as a user runs it, 10 s per run (quick 4 s), alternating"),
            ("depth5", "openclaw_depth5", "with DEPTH_LIMIT=5 (pages alike: the per-page comparison)"),
        )
    ],
    "flaky": [
        Spec(
            "flaky: 4 hosts, 503 windows ~30%, drops and hangs",
            [
                M("success_rate", "success rate", "higher"),
                M("seconds", "wall s", "lower"),
                M("requests_at_server", "requests at server", "lower"),
                M("retries", "retries", ratio=False),
                M("dead_letters", "dead letters", ratio=False),
            ],
            [Headline("success_rate", "openclaw", ">= 0.99", at_least(0.99))],
        )
    ],
    "ratelimit": [
        Spec(
            "ratelimit: 3 hosts, 10 req/s + burst 5 each, 429 beyond",
            [
                M("share_429_after_5s", "429 share after 5 s", "lower"),
                M("share_429", "429 share", "lower"),
                M("rate_2xx_fraction_after_5s", "2xx rate / limit after 5 s", "higher"),
                M("rate_2xx_fraction", "2xx rate / limit", "higher"),
                M("scraped_fraction", "pages scraped", "higher"),
                M("seconds", "wall s", "lower"),
            ],
            [
                Headline("share_429_after_5s", "openclaw", "<= 0.02", at_most(0.02)),
                # plain Scrapy may give up within 5 s: the whole crawl compares them too
                Headline("share_429", "openclaw", "(whole crawl, no target)", no_target),
                Headline("rate_2xx_fraction_after_5s", "openclaw", ">= 0.85", at_least(0.85)),
            ],
        )
    ],
    "repeat": [
        Spec(
            f"repeat: {title}, crawled twice (site memory between the crawls)",
            [
                M("first_429_max_host", "1st crawl: max 429s on a host", "lower", ratio=False),
                M("second_429_max_host", "2nd crawl: max 429s on a host", "lower", ratio=False),
                M("first_vs_bound", "1st crawl: slowest host / bound", "lower"),
                M("second_vs_bound", "2nd crawl: slowest host / bound", "lower"),
                M("second_scraped_fraction", "2nd crawl: pages scraped", "higher"),
            ],
            [
                Headline("second_429_max_host", "openclaw_memory_on", "<= 1 per host", at_most(1)),
                Headline("second_vs_bound", "openclaw_memory_on", "<= 1.05", at_most(1.05)),
            ],
            key=key,
        )
        for key, title in (("ratelimit", "3 hosts at 10 req/s + burst 5"), ("sweep", "hosts at 3, 12, 40 req/s"))
    ],
    "hol": [
        Spec(
            "hol: 8 fast hosts + 2 slow (1.5 s) hosts, by priority queue",
            [
                M("total_vs_bound", "total / lower bound", "lower"),
                M("fast_vs_alone", "fast done / fast alone", "lower"),
                M("total", "total s", "lower"),
                M("fast_done", "fast hosts done s", "lower"),
                M("pages", "pages", ratio=False),
            ],
            [
                Headline("total_vs_bound", "deadline", "<= 1.15", at_most(1.15)),
                Headline("fast_vs_alone", "deadline", "<= 1.2", at_most(1.2)),
            ],
        )
    ],
    "queue": [
        Spec(
            "queue: push/pop at 1,000,000 pending requests (quick 100,000); memory traced at 100,000 (quick 20,000)",
            [
                M("push_per_s", "push/s", "higher"),
                M("pop_per_s", "pop/s", "higher"),
                M("total_bytes_per_request", "bytes per pending request", "lower"),
                # near zero for Scrapy's own queue: a ratio to it means nothing
                M("overhead_bytes_per_request", "queue overhead bytes/request", "lower", ratio=False),
                M("cost_growth_20x", "cost per op at 40k / at 2k", "lower", ratio=False),
            ],
            [
                Headline("total_bytes_per_request", "deadline", "<= 1.10 x", at_most(1.10, on="ratio")),
                Headline("cost_growth_20x", "deadline+deadlines", "< 4 (O(log n))", at_most(3.99)),
            ],
        )
    ],
    "broad": [
        Spec(
            "broad: pop cost (microseconds) at 1,000 / 10,000 / 100,000 domains x 10 pages (quick 2)",
            [
                M("pop_us_1000", "pop us, 1k domains", "lower"),
                M("pop_us_10000", "pop us, 10k", "lower"),
                M("pop_us_100000", "pop us, 100k", "lower"),
                M("pop_growth", "pop us 100k / 1k", "lower", ratio=False),
                M("push_us_100000", "push us, 100k", "lower"),
            ],
            [Headline("pop_growth", "deadline", "<= 1.5 (flat)", at_most(1.5))],
            key="pop",
        ),
        Spec(
            "broad: memory traced, 20,000 domains x 10 pages (quick 3,000)",
            [
                M("bytes_per_request", "bytes per pending request", "lower"),
                M("queue_bytes_per_domain", "queue bytes per domain", "lower"),
                M("reported_queue_bytes_per_domain", "estimate in stats", ratio=False),
            ],
            [Headline("bytes_per_request", "deadline", "<= 1.10 x DownloaderAware", at_most(1.10, on="ratio"))],
            key="memory",
        ),
        Spec(
            "broad: health registry, 100,000 domains (quick 20,000), 1 in 100 held, then all idle",
            [
                M("bytes_per_domain", "bytes per domain", ratio=False),
                M("reported_bytes_per_domain", "estimate in stats", ratio=False),
                M("snapshot_bytes_per_domain", "snapshot bytes per domain", ratio=False),
                M("snapshot_mb", "snapshot MB", ratio=False),
                M("kept", "kept after eviction", ratio=False),
                M("mb_before_eviction", "MB before", ratio=False),
                M("mb_after_eviction", "MB after", ratio=False),
                M("snapshot_mb_after_eviction", "snapshot MB after", ratio=False),
                M("checkpoint_bytes_per_request", "checkpoint bytes per pending request", ratio=False),
            ],
            key="registry",
        ),
        Spec(
            "broad: crawl, 5,000 download slots x 4 pages on one chaos host (quick 500 x 2)",
            [
                M("pages_per_s", "pages/s", "higher"),
                M("pages", "pages", ratio=False),
                M("peak_rss_mb", "peak RSS MB", "lower"),
                M("health_domains", "domains known at close", ratio=False),
                M("health_evicted", "domains evicted", ratio=False),
                M("health_bytes_per_domain", "registry bytes/domain (stats)", ratio=False),
                M("complete", "complete", ratio=False),
            ],
            key="crawl",
        ),
    ],
    "killresume": [
        Spec(
            "killresume: kill -9 up to 3 times (after 1/8 of the pages each), then finish",
            [
                M("pages_lost", "pages lost", "lower", ratio=False),
                M("kills", "kills", ratio=False),
                M("duplicate_fetches", "duplicate fetches", "lower", ratio=False),
                M("feed_items_lost", "feed items lost", "lower", ratio=False),
                M("feed_items_duplicated", "feed items duplicated", "lower", ratio=False),
                M("feed_torn_lines", "torn feed lines", "lower", ratio=False),
                M("reachable_pages", "reachable pages", ratio=False),
                M("seconds", "wall s", "lower"),
            ],
            [
                Headline("pages_lost", "openclaw_checkpoint", "== 0", at_most(0)),
                Headline("feed_items_lost", "openclaw_checkpoint", "== 0", at_most(0)),
                Headline("feed_items_duplicated", "openclaw_checkpoint", "== 0", at_most(0)),
            ],
            key="kill",
        ),
        Spec(
            "killresume: throughput with checkpointing (medians of 4 off/on pairs, ABBA order)",
            [
                M("pages_per_s", "pages/s", "higher"),
                M("paired_ratio", "median paired ratio on/off", "higher", ratio=False),
            ],
            [Headline("paired_ratio", "checkpoint_on", ">= 0.95", at_least(0.95))],
            key="throughput",
        ),
        Spec(
            "killresume: throughput with durable feeds (checkpoint on, jsonlines feed; medians of 4 "
            "off/on pairs, ABBA order)",
            [
                M("pages_per_s", "pages/s", "higher"),
                M("paired_ratio", "median paired ratio on/off", "higher", ratio=False),
            ],
            [Headline("paired_ratio", "durable_feeds_on", ">= 0.95", at_least(0.95))],
            key="feeds",
        ),
        Spec(
            "killresume: checkpoint at scale",
            [
                M("pending_requests", "pending requests"),
                M("checkpoint_bytes", "checkpoint bytes"),
                M("bytes_per_request", "bytes per request"),
                M("track_seconds", "track s"),
                M("snapshot_inline_stall_seconds", "reactor stall, inline snapshot s"),
                M("snapshot_background_stall_seconds", "reactor stall, background snapshot s"),
                M("snapshot_write_seconds", "snapshot write s"),
                M("resume_seconds_total", "resume s"),
            ],
            key="scale",
        ),
    ],
    "every3rd": [
        Spec(
            "every3rd: every third request refused whatever the pace (400 pages, quick 120; answers after 1 s)",
            [
                M("span_s", "first request to last answer s", "lower"),
                M("seconds_vs_scrapy", "time vs plain Scrapy", "lower", ratio=False),
                M("seconds_per_page_vs_scrapy", "time per page scraped vs plain Scrapy", "lower", ratio=False),
                M("scraped_fraction", "pages scraped", "higher"),
                M("requests_at_server", "requests at the server", "lower"),
                M("share_429", "429 share", ratio=False),
                M("max_in_flight", "most requests open at once (cap 8)", ratio=False),
                M("mean_in_flight", "mean requests open at once", "higher"),
                M("circuit_opened", "circuit opened", "lower", ratio=False),
                M("finished", "ended by itself", ratio=False),
            ],
            [
                Headline("seconds_vs_scrapy", "openclaw", "<= 1.1", at_most(1.1)),
                Headline("scraped_fraction", "openclaw", ">= 1.0", at_least(1.0)),
                Headline("max_in_flight", "openclaw", "<= 8", at_most(8)),
            ],
        )
    ],
    "mixed": [
        Spec(
            "mixed: 2 hosts x 200 pages (quick 60), on one every 5th page always 503 and a few 404",
            [
                M("scraped_fraction", "reachable pages scraped", "higher"),
                M("failed_urls", "failed URLs", ratio=False),
                M("dead_letter_urls", "failed URLs dead-lettered", ratio=False),
                M("dead_letters_per_failed_url", "dead letters per failed URL", ratio=False),
                M("dead_letter_duplicates", "duplicate dead letters", "lower", ratio=False),
                M("dead_letters_on_good_pages", "dead letters on good pages", "lower", ratio=False),
                M("seconds", "wall s", "lower"),
                M("seconds_over_scrapy", "wall s over plain Scrapy", "lower", ratio=False),
                M("broken_host_health", "broken host's final health", "higher", ratio=False),
                M("finished", "ended by itself", ratio=False),
            ],
            [
                Headline("scraped_fraction", "openclaw", ">= 1.0", at_least(1.0)),
                Headline("dead_letters_per_failed_url", "openclaw", "== 1", lambda v, r: None if v is None else v == 1),
                Headline("dead_letter_duplicates", "openclaw", "== 0", at_most(0)),
                Headline("seconds_over_scrapy", "openclaw", "<= 10 s", at_most(10.0)),
                Headline("finished", "openclaw", "== 1", at_least(1)),
            ],
        )
    ],
    "sweep": _limit_specs(
        "sweep",
        "one host each at 3, 12, 40, 60 (and 150) req/s, burst 2-15, 429 + Retry-After 1",
        SWEEP_LIMITS,
        [
            Headline("rate_after_5s_min_host", "openclaw", ">= 0.9 (every host)", at_least(0.9)),
            Headline("share_429", "openclaw", "<= 0.02", at_most(0.02)),
            Headline("share_429_max_host", "openclaw", "<= 0.02 (every host)", at_most(0.02)),
        ],
    ),
    "smallbucket": _limit_specs(
        "smallbucket",
        "one host each at 12, 40, 60 and 150 req/s, burst 2, 429 + Retry-After 1",
        SMALL_BUCKET_LIMITS,
        [
            Headline("rate_after_5s_min_host", "openclaw", ">= 0.9 (the sweep's)", at_least(0.9)),
            Headline("share_429_max_host", "openclaw", "<= 0.02 (the sweep's)", at_most(0.02)),
        ],
    ),
    "queueing": [
        Spec(
            "queueing: one host with 2 workers (~55 ms an answer, ~36 pages/s), the rest wait in line",
            [
                M("vs_capacity", "pages/s / capacity", "higher"),
                M("pages_per_s", "pages/s", "higher"),
                M("wait_p50_ms", "server line wait p50 ms", "lower"),
                M("wait_p90_ms", "server line wait p90 ms", "lower"),
                M("max_in_flight", "max requests at the server", "lower"),
                M("scraped_fraction", "pages scraped", "higher"),
                M("finished", "ended by itself", ratio=False),
            ],
            [
                # "a healthy site as fast as plain Scrapy": a slower answer is not a sick site
                Headline("pages_per_s", "openclaw", ">= 0.95 x (no issue target)", at_least(0.95, on="ratio")),
                Headline("wait_p50_ms", "openclaw", "(the site's cost, no target)", no_target),
            ],
        )
    ],
    "deadhosts": [
        Spec(
            "deadhosts: 2 healthy hosts + 40 URLs on a refused and 40 on an unresolvable host",
            [
                M("seconds", "wall s", "lower"),
                M("seconds_over_scrapy", "wall s over plain Scrapy", "lower", ratio=False),
                M("dead_letter_urls", "dead URLs dead-lettered (of 80)", ratio=False),
                M("dead_letter_duplicates", "duplicate dead letters", "lower", ratio=False),
                M("scraped_fraction", "healthy pages scraped", "higher"),
                M("dead_attempts", "failed attempts", "lower"),
                M("finished", "ended by itself", ratio=False),
                M("killed_after_s", "killed after s", ratio=False),
            ],
            [
                Headline("seconds_over_scrapy", "openclaw", "<= 20 s", at_most(20.0)),
                Headline("finished", "openclaw", "== 1", at_least(1)),
                Headline("dead_letter_urls", "openclaw", "== 80", at_least(80)),
                Headline("dead_letter_duplicates", "openclaw", "== 0", at_most(0)),
            ],
        )
    ],
    "distributed": [
        Spec(
            "distributed: scaling, 3 hosts x 150 pages (quick 60) at 50 ms, no rate limit, add-on on defaults "
            "(2 requests in flight per worker; the median of 3 runs of each, quick 1)",
            [
                M("pages_per_s", "pages/s at the server", "higher"),
                M("speedup", "pages/s vs 1 worker of its kind", "higher", ratio=False),
                M("vs_scrapy_redis", "pages/s vs scrapy-redis, same workers", "higher", ratio=False),
                M("seconds", "wall s (start-up included)", "lower"),
                M("unique", "pages", ratio=False),
                M("expected", "reachable", ratio=False),
            ],
            [
                Headline("speedup", "openclaw_3_workers", ">= 2.5", at_least(2.5)),
                *(Headline("vs_scrapy_redis", f"openclaw_{n}_workers", ">= 1", at_least(1.0)) for n in (1, 2, 3)),
            ],
            key="scaling",
        ),
        Spec(
            "distributed: 3 workers, one killed -9 (several rounds)",
            [
                M("lost_total", "pages lost (all rounds)", "lower", ratio=False),
                M("rounds_with_loss", "rounds with a loss", "lower", ratio=False),
                M("rounds", "rounds", ratio=False),
                M("duplicates_median", "duplicates (median)", "lower", ratio=False),
                M("seconds_median", "wall s (median)", "lower"),
                M("unkilled_seconds_median", "wall s unkilled", ratio=False),
                M("seconds_over_unkilled_max", "worst round's s over unkilled", "lower", ratio=False),
                M("expected", "reachable per round", ratio=False),
            ],
            [
                Headline("lost_total", "openclaw", "== 0", at_most(0)),
                Headline("seconds_over_unkilled_max", "openclaw", "<= 15", at_most(15.0)),
            ],
            key="kill",
        ),
        Spec(
            "distributed: combined per-domain rate, 3 workers",
            [
                M("over_limit", "busiest 1 s / (limit + burst)", "lower"),
                M("max_1s_window", "busiest 1 s", "lower"),
                M("limit", "limit req/s", ratio=False),
                M("requests", "requests", ratio=False),
            ],
            [Headline("over_limit", "openclaw", "<= 1", at_most(1.0))],
            key="rate",
        ),
    ],
    "rediscost": [
        Spec(
            "rediscost: Redis commands, round trips and CPU per crawled page (6 hosts; the project lists "
            "scrapy-redis's RedisPipeline, which ours replaces: items with their page's acknowledgement)",
            [
                M("commands_per_page", "Redis commands / page", "lower"),
                M("round_trips_per_page", "round trips / page", "lower"),
                M("queue_commands_per_page", "... without the items' RPUSH", "lower"),
                M("evalsha_per_page", "scripts / page", "lower"),
                M("redis_cpu_ms_per_page", "Redis CPU ms / page", "lower"),
                M("pages_per_s_cpu_bound", "pages/s the Redis node(s) could carry (CPU-bound)", "higher"),
                M("pages_per_s", "pages/s in this run", ratio=False),
                M("pages", "pages", ratio=False),
                M("nodes", "Redis nodes", ratio=False),
                M("round_trips_per_s", "idle worker: round trips / s", "lower", ratio=False),
                M("commands_per_s", "idle worker: commands / s", "lower", ratio=False),
                M("wake_s", "idle worker: s to lease a pushed request", "lower", ratio=False),
            ],
            [
                Headline("commands_per_page", "single_openclaw_3_workers", "<= 12", at_most(12.0)),
                Headline("round_trips_per_page", "single_openclaw_3_workers", "<= 1.5", at_most(1.5)),
                Headline("round_trips_per_page", "cluster_openclaw_3_workers", "<= 1.5", at_most(1.5)),
                Headline(
                    "redis_cpu_ms_per_page",
                    "single_openclaw_3_workers",
                    "<= 2 x scrapy-redis",
                    at_most(2.0, on="ratio"),
                ),
                Headline("round_trips_per_s", "single_openclaw_idle", "<= 2", at_most(2.0)),
                Headline("wake_s", "single_openclaw_idle", "<= 0.5", at_most(0.5)),
            ],
            key="cost",
        )
    ],
    "redisbytes": [
        Spec(
            "redisbytes: Redis memory per pending request (request, its ordering, its dupefilter mark)",
            [
                M("bytes_per_pending", "bytes per pending request", "lower"),
                M("used_mb", "Redis used_memory (MB)", "lower"),
                M("pending", "pending requests", ratio=False),
                M("push_seconds", "seconds to queue them", ratio=False),
            ],
            [Headline("bytes_per_pending", "openclaw", "<= 1.0 x scrapy-redis", at_most(1.0, on="ratio"))],
        )
    ],
    "workermemory": [
        Spec(
            "workermemory: a distributed worker's RSS after 1,000 and 100,000 domains (registry level)",
            [
                M("rss_ratio", "RSS at the end / at 1,000 domains", "lower", ratio=False),
                M("rss_at_1000_mb", "RSS at 1,000 domains (MB)", ratio=False),
                M("rss_at_end_mb", "RSS at the end (MB)", "lower"),
                M("held_at_end", "domains held at the end", "lower"),
                M("domains", "domains met", ratio=False),
            ],
            [Headline("rss_ratio", "idle_sweep", "<= 1.1", at_most(1.1))],
            key="worker_memory",
        )
    ],
}


def _table(spec: Spec, raw: dict[str, Any]) -> Table:
    data = raw if spec.key is None else (raw.get("tables") or {}).get(spec.key) or {}
    rows = {}
    for name, values in (data.get("configs") or {}).items():
        if isinstance(values, dict):
            failed = "error" in values
            rows[name] = {m.key: None if failed else _num(values.get(m.key)) for m in spec.metrics}
    return Table(spec.title, data.get("baseline"), spec.metrics, rows, spec.headlines)


def _generic(raw: dict[str, Any]) -> list[Spec]:
    keys: list[str] = []
    for values in (raw.get("configs") or {}).values():
        if isinstance(values, dict):
            keys += [k for k, v in values.items() if _num(v) is not None and k not in keys]
    return [Spec("results", [Metric(k, k.replace("_", " ")) for k in keys])]


def adapt(scenario: str, raw: dict[str, Any]) -> list[Table]:
    """Tables for one run of ``scenario`` (a scenario without a spec shows every numeric key)."""
    return [_table(spec, raw) for spec in SPECS.get(scenario) or _generic(raw)]
