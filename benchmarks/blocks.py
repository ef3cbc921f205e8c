"""Benchmark: limiters that refuse everything for a while: a block, and a spent fixed window.

Four one-host sites, crawled in turn by every configuration:

- ``block`` (429 + ``Retry-After: 1``) and ``block_bare`` (a bare 429): 30 req/s past a
  bucket of 3, and nothing at all from 10 s to 25 s (a temporary block), pages for 45 s
  at the limits. Per phase (see :mod:`benchmarks.phases`): 2xx rate over the limit after
  the change's first 3 s (``<site>_p3_rate``: how soon the pace is back after the block;
  target >= 0.85) and the limiter's share (``<site>_p2_limiter``: what the block was sent).
- ``window`` (a bare 429) and ``window_rest`` (``Retry-After`` saying the window's rest):
  100 requests per fixed 10-s window, 401 pages (a client that takes each window's quota
  at its start needs 40 s). ``<site>_p1_rate``: 2xx rate over the quota's average (10 req/s).

``wall_vs_bound`` and ``scraped_fraction`` beside them.

    python -m benchmarks.blocks [--quick]
"""

from __future__ import annotations

from typing import Any

from benchmarks.moving import crawl_sites
from benchmarks.suite import run_module
from scrapy_openclaw.testing.presets import moving_limit_site

BLOCK = ((10.0, 0.0, 1), (25.0, 30.0, 3))
SITES: dict[str, dict[str, Any]] = {
    "block": {"rate": 30.0, "burst": 3, "schedule": BLOCK, "seconds": 45.0},
    "block_bare": {"rate": 30.0, "burst": 3, "schedule": BLOCK, "seconds": 45.0, "retry_after": None},
    "window": {"rate": 10.0, "window": 10.0, "schedule": (), "seconds": 40.0, "retry_after": None},
    "window_rest": {"rate": 10.0, "window": 10.0, "schedule": (), "seconds": 40.0, "retry_after": "{rest}"},
}


def run(quick: bool = False) -> dict[str, Any]:
    sites = {name: moving_limit_site(**spec) for name, spec in SITES.items()}
    return {"baseline": "scrapy", "quick": quick, "configs": crawl_sites(sites, 200.0, "blocks")}


def main() -> None:
    run_module(run)


if __name__ == "__main__":
    main()
