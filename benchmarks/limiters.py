"""Benchmark: limiters that speak differently: 429 without Retry-After, and 503 with one.

Three one-host sites, crawled in turn by every configuration: 20 req/s with a bucket
of 3 answering a bare 429 (``noretry``), and 10 req/s (bucket 3) answering 503 +
``Retry-After: 2`` (``limiter503``), each with pages for 20 s at its limit; and the
503 limiter again with pages for 90 s (``limiter503_long``: a hard limit probed every
25 s or so, each probe's cut fitted from the last probe's refusals). Per site:
2xx rate over the limit after its first 3 s (``<site>_p1_rate``, target >= 0.85, as
for a 429 with Retry-After) and the limiter's share (``<site>_p1_limiter``).

    python -m benchmarks.limiters [--quick]
"""

from __future__ import annotations

from typing import Any

from benchmarks.moving import crawl_sites
from benchmarks.suite import run_module
from scrapy_openclaw.testing.presets import moving_limit_site

SITES: dict[str, dict[str, Any]] = {
    "noretry": {"rate": 20.0, "burst": 3, "retry_after": None},
    "limiter503": {"rate": 10.0, "burst": 3, "retry_after": "2", "status": 503},
    "limiter503_long": {"rate": 10.0, "burst": 3, "retry_after": "2", "status": 503, "seconds": 90.0},
}


def run(quick: bool = False) -> dict[str, Any]:
    sites = {}
    for name, spec in SITES.items():
        limit = dict(spec)
        seconds = float(limit.pop("seconds", 20.0)) * (0.6 if quick else 1.0)
        sites[name] = moving_limit_site(schedule=(), seconds=seconds, **limit)
    return {"baseline": "scrapy", "quick": quick, "configs": crawl_sites(sites, 200.0, "limiters")}


def main() -> None:
    run_module(run)


if __name__ == "__main__":
    main()
