"""Benchmark: a limit that rises (10 req/s, then 30 from 15 s), on defaults.

One host, 429 + ``Retry-After: 1`` past a bucket of 5, 605 pages (a compliant client
needs 30 s). A learned limit is evidence that ages: the second phase's
``rising_p2_rate`` (2xx rate over 30 req/s after its first 3 s, target >= 0.85) says
how soon the add-on found the new limit. Figures as in :mod:`benchmarks.moving`.

    python -m benchmarks.rising [--quick]
"""

from __future__ import annotations

from typing import Any

from benchmarks.moving import run_site
from benchmarks.suite import run_module
from scrapy_openclaw.testing.presets import moving_limit_site


def run(quick: bool = False) -> dict[str, Any]:
    site = moving_limit_site(rate=10.0, schedule=((15.0, 30.0, 5),), seconds=30.0)
    return {"quick": quick, **run_site(site, "rising", 80.0 if quick else 120.0, "rising-limit.png")}


def main() -> None:
    run_module(run)


if __name__ == "__main__":
    main()
