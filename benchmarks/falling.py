"""Benchmark: a limit that falls six-fold and stays down (30 req/s, then 5 from 15 s), on defaults.

Two one-host sites, crawled in turn by every configuration, a bucket of 3 in both phases
and pages for 40 s at the limits: one answering 429 + ``Retry-After: 1`` (``falling``), one
a bare 429 (``falling_noretry``). The second phase's figures (2xx rate over 5 req/s after
its first 3 s, target >= 0.85; the limiter's share, target <= 2%) say how soon the limit
that fell was learned, not the one before it. Figures as in :mod:`benchmarks.moving`.

    python -m benchmarks.falling [--quick]
"""

from __future__ import annotations

from typing import Any

from benchmarks.moving import crawl_sites
from benchmarks.suite import run_module
from scrapy_openclaw.testing.presets import moving_limit_site

SITES = {"falling": {"retry_after": "1"}, "falling_noretry": {"retry_after": None}}


def run(quick: bool = False) -> dict[str, Any]:
    seconds = 30.0 if quick else 40.0
    sites = {
        name: moving_limit_site(rate=30.0, burst=3, schedule=((15.0, 5.0, 3),), seconds=seconds, **limit)  # type: ignore[arg-type]
        for name, limit in SITES.items()
    }
    return {"baseline": "scrapy", "quick": quick, "configs": crawl_sites(sites, 120.0, "falling")}


def main() -> None:
    run_module(run)


if __name__ == "__main__":
    main()
