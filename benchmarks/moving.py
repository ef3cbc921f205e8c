"""Benchmark: a limit that drops and comes back (40 -> 8 req/s from 15 s -> 40 from 30 s), on defaults.

One host (``presets.moving_limit_site``): 429 + ``Retry-After: 1`` past a bucket of 5,
with enough pages (1,325, all linked from its root) that a compliant client needs
45 s. Per phase (see :mod:`benchmarks.phases`): 2xx rate over the limit then in force
after the change's first 3 s (``moving_p<N>_rate``, target >= 0.85 in every phase)
and the 429 share (``moving_p<N>_limiter``, target <= 2%); ``wall_vs_bound`` (first
request to last answer over the 45 s bound) next to ``scraped_fraction``. A plot of
each configuration's rate against the limit is written beside the suite's output
(``moving-limit.png``) when matplotlib is installed.

    python -m benchmarks.moving [--quick]
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.phases import COMMON, CONFIGS, flat_row, host_summary, phase_figures, plot
from benchmarks.suite import OUT_DIR_ENV, crawl_site, run_module
from scrapy_openclaw.testing.chaos import ChaosConfig
from scrapy_openclaw.testing.crawl import CrawlTimeout
from scrapy_openclaw.testing.presets import limit_seconds, moving_limit_site

PREFIX = "moving"


def one_host(
    site: ChaosConfig, name: str, settings: dict[str, Any], out: Path, limit: float, prefix: str
) -> tuple[dict[str, Any], list[dict[str, Any]], float]:
    """Crawl a one-host limited *site*: (its row, the host's requests, the site's start)."""
    host = site.hosts[0]
    assert host.rate_limit is not None
    try:
        crawl = crawl_site(site, name, {**COMMON, **settings}, out, limit=limit, requests=True)
    except CrawlTimeout as exc:
        return {"error": str(exc)[:300]}, [], 0.0
    truth = crawl.truth
    requests = truth["hosts"][host.address]["requests"]
    summary = host_summary(requests, host.rate_limit)
    bound = limit_seconds(host.rate_limit, host.pages)
    scraped = {item["url"] for item in crawl.result.items} & crawl.reachable
    row: dict[str, Any] = {
        "returncode": crawl.result.returncode,
        "finished": int(crawl.result.stats.get("finish_reason") == "finished"),
        "seconds": round(crawl.seconds, 1),
        "requests_at_server": summary["requests"],
        "limiter_share": summary["limiter"],
        "wall_vs_bound": round(summary["span"] / bound, 3) if summary["span"] else None,
        "scraped_fraction": round(len(scraped) / len(crawl.reachable), 4) if crawl.reachable else None,
        "circuit_opened": crawl.result.stats.get("openclaw/health/circuit_opened", 0),
        **flat_row(prefix, phase_figures(requests, truth["started_at"], host.rate_limit)),
    }
    final = crawl.result.stats.get(f"openclaw/health/final_health/{host.address}")
    if final is not None:
        row["final_health"] = final
    return row, requests, truth["started_at"]


def run_site(site: ChaosConfig, prefix: str, limit: float, picture: str | None) -> dict[str, Any]:
    """Every configuration crawls a fresh *site*; a plot of the three when *picture* names one."""
    results: dict[str, Any] = {}
    drawn: dict[str, tuple[list[dict[str, Any]], float]] = {}
    with tempfile.TemporaryDirectory(prefix=f"openclaw-bench-{prefix}-") as tmp:
        for name, settings in CONFIGS.items():
            results[name], requests, started = one_host(site, name, settings, Path(tmp), limit, prefix)
            drawn[name] = (requests, started)
    out: dict[str, Any] = {"baseline": "scrapy", "configs": results}
    rate_limit = site.hosts[0].rate_limit
    if picture and rate_limit is not None and all(r for r, _ in drawn.values()):
        where = Path(os.environ.get(OUT_DIR_ENV) or tempfile.gettempdir()) / picture
        drawn_at = plot(drawn, rate_limit, where, f"{prefix}: 2xx rate against the limit in force")
        out["plot"] = str(drawn_at) if drawn_at else None
    return out


def crawl_sites(sites: dict[str, ChaosConfig], limit: float, prefix: str) -> dict[str, dict[str, Any]]:
    """Every configuration crawls each one-host site in turn: per configuration, one row whose
    columns carry the site's name (``<site>_p1_rate``)."""
    results: dict[str, dict[str, Any]] = {name: {} for name in CONFIGS}
    with tempfile.TemporaryDirectory(prefix=f"openclaw-bench-{prefix}-") as tmp:
        for site_name, site in sites.items():
            for name, settings in CONFIGS.items():
                row, _, _ = one_host(site, name, settings, Path(tmp) / site_name, limit, site_name)
                results[name].update({k if k.startswith(site_name) else f"{site_name}_{k}": v for k, v in row.items()})
    return results


def run(quick: bool = False) -> dict[str, Any]:
    return {"quick": quick, **run_site(moving_limit_site(), PREFIX, 90.0 if quick else 150.0, "moving-limit.png")}


def main() -> None:
    run_module(run)


if __name__ == "__main__":
    main()
