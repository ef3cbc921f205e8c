"""Benchmark: the limit sweep's hosts with a bucket of 2, found on defaults.

Many sites limit with almost no burst (nginx's ``limit_req`` with a small
``burst``; an API gateway that spaces requests). The sweep's hosts hold a
quarter second's worth of tokens, as much as the add-on sends at once; here
each host at 12, 40, 60 and 150 req/s holds 2, so a client's resume after a
Retry-After hold, or any bunching of its requests, is refused. Same
configurations and numbers as :mod:`benchmarks.sweep` (``rate_after_5s_<limit>``,
``share_429_<limit>``, ``wall_vs_bound``), from the server's ground truth.

    python -m benchmarks.smallbucket [--quick]
"""

from __future__ import annotations

from typing import Any

from benchmarks.suite import run_module
from benchmarks.sweep import run_sweep

LIMITS = (12, 40, 60, 150)
QUICK_LIMITS = (12, 40)
BURST = 2


def run(quick: bool = False) -> dict[str, Any]:
    """``{"baseline": "scrapy", "configs": {name: {...}}}``, one crawl per configuration."""
    return run_sweep(QUICK_LIMITS if quick else LIMITS, quick, burst=BURST)


def main() -> None:
    run_module(run)


if __name__ == "__main__":
    main()
