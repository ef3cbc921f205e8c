"""Benchmark: a limit that moves and says so (40 -> 8 req/s from 15 s -> 40 from 30 s), on defaults.

The :mod:`benchmarks.moving` site, its every answer saying the limit in force: in the
IETF draft's ``RateLimit-Policy``/``RateLimit`` (``ietf``: a quota per 1 s window, a
pace), and in GitHub's ``X-RateLimit-*`` (``x``: no window, so only "none left until
then"). Per site and phase, as in :mod:`benchmarks.moving`: 2xx rate over the limit in
force after the change's first 3 s (``<site>_p<N>_rate``, target >= 0.85) and the 429
share (``<site>_p<N>_limiter``, target <= 2%); the whole crawl's 429 share
(``<site>_limiter_share``) and ``wall_vs_bound``. Plain and careful Scrapy do not read
the headers: their rows are the silent site's. The ``ietf`` site's rate against the
limit in force is drawn in ``declared-limit.png``.

    python -m benchmarks.declared [--quick]
"""

from __future__ import annotations

from typing import Any

from benchmarks.moving import crawl_sites, run_site
from benchmarks.suite import run_module
from scrapy_openclaw.testing.presets import moving_limit_site


def run(quick: bool = False) -> dict[str, Any]:
    limit = 90.0 if quick else 150.0
    said = run_site(moving_limit_site(declare="ietf"), "ietf", limit, "declared-limit.png")
    rows = crawl_sites({"x": moving_limit_site(declare="x")}, limit, "declared")
    for name, row in said["configs"].items():
        rows[name].update({k if k.startswith("ietf") else f"ietf_{k}": v for k, v in row.items()})
    return {"baseline": "scrapy", "quick": quick, "configs": rows, "plot": said.get("plot")}


def main() -> None:
    run_module(run)


if __name__ == "__main__":
    main()
