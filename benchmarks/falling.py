"""Benchmark: a limit that falls and stays down (from 15 s), on defaults.

Three one-host sites, crawled in turn by every configuration, a bucket of 3 in both phases
and pages for 40 s at the limits: 30 req/s then 5, answering 429 + ``Retry-After: 1``
(``falling``) or a bare 429 (``falling_noretry``); and 40 req/s then 30, a fall by a
quarter, with ``Retry-After: 1`` (``falling_quarter``). The second phase's figures (2xx rate
over the new limit after its first 3 s, target >= 0.85; the limiter's share, target <= 2%)
say how soon the limit that fell was learned, not the one before it, and not one far under
it. Figures as in :mod:`benchmarks.moving`.

    python -m benchmarks.falling [--quick]
"""

from __future__ import annotations

from typing import Any

from benchmarks.moving import crawl_sites
from benchmarks.suite import run_module
from scrapy_openclaw.testing.presets import moving_limit_site

SITES: dict[str, dict[str, Any]] = {
    "falling": {"retry_after": "1", "rate": 30.0, "schedule": ((15.0, 5.0, 3),)},
    "falling_noretry": {"retry_after": None, "rate": 30.0, "schedule": ((15.0, 5.0, 3),)},
    "falling_quarter": {"retry_after": "1", "rate": 40.0, "schedule": ((15.0, 30.0, 3),)},
}


def run(quick: bool = False) -> dict[str, Any]:
    seconds = 30.0 if quick else 40.0
    sites = {name: moving_limit_site(burst=3, seconds=seconds, **limit) for name, limit in SITES.items()}
    return {"baseline": "scrapy", "quick": quick, "configs": crawl_sites(sites, 120.0, "falling")}


def main() -> None:
    run_module(run)


if __name__ == "__main__":
    main()
