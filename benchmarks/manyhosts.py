"""Benchmark: a limit of 30, then 5, then 30 req/s, on one host among twelve healthy ones.

``presets.among_many_site``: the limited host (429 + ``Retry-After: 1``, bucket 5, pages
for 45 s) competes for the crawl's concurrency with the others (100 pages each). Per
phase of its limit: ``manyhosts_p<N>_rate`` and ``manyhosts_p<N>_limiter`` as in
:mod:`benchmarks.moving` (targets >= 0.85 and <= 2%).

    python -m benchmarks.manyhosts [--quick]
"""

from __future__ import annotations

from typing import Any

from benchmarks.moving import run_site
from benchmarks.suite import run_module
from scrapy_openclaw.testing.presets import among_many_site


def run(quick: bool = False) -> dict[str, Any]:
    site = among_many_site(others=6 if quick else 12)
    return {"quick": quick, **run_site(site, "manyhosts", 90.0 if quick else 150.0, None)}


def main() -> None:
    run_module(run)


if __name__ == "__main__":
    main()
