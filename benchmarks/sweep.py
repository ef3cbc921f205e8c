"""Benchmark: hosts limited anywhere from 3 to 150 req/s, found on defaults.

The site (``presets.limit_sweep_site``) has one host per limit (3, 12, 40 and
60 req/s, and 150 at full size; burst 2-15, 429 + ``Retry-After: 1`` beyond
it), each with ``limit x SECONDS`` pages all linked from its root, so every
host needs about the same time at its limit. Plain Scrapy, careful Scrapy
and the add-on on its defaults crawl it in the same run; from the server's
ground truth, per host and overall:

- ``rate_after_5s_<limit>``: 2xx answers per second after the host's first
  5 s, over the limit (target >= 0.9 on every host; ``..._min_host``);
- ``share_429_<limit>``: requests answered 429 / requests (target <= 2%,
  overall and on every host; ``share_429_max_host``); ``share_429_after_5s_max_host``
  counts only the requests after each host's first 5 s (the steady state: a
  client that does not know the limit needs a 429 or two to find it, and on
  the 3 req/s host's ~63 requests each is 1.6%);
- ``wall_vs_bound``: first request to last answer, over the lower bound
  ``max(pages / limit)``; ``scraped_fraction`` next to it, since a crawl that
  gives pages up (plain Scrapy after 2 retries) can beat the bound.

    python -m benchmarks.sweep [--quick]
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from benchmarks.ratelimit import host_numbers
from benchmarks.suite import crawl_site, run_module
from scrapy_openclaw.testing.crawl import CrawlTimeout
from scrapy_openclaw.testing.presets import limit_sweep_site

LIMITS = (3, 12, 40, 60, 150)
QUICK_LIMITS = (3, 12, 40, 60)
SECONDS, QUICK_SECONDS = 20.0, 8.0  # per host at its limit
LIMIT, QUICK_LIMIT = 150.0, 25.0  # CLOSESPIDER_TIMEOUT per crawl

COMMON: dict[str, Any] = {"LOG_LEVEL": "INFO"}
CONFIGS: dict[str, dict[str, Any]] = {
    "scrapy": {},
    "scrapy_careful": {"AUTOTHROTTLE_ENABLED": True, "RETRY_TIMES": 10},
    "openclaw": {"ADDONS": {"scrapy_openclaw.Addon": 100}},
}


def measure(crawl: Any, limits: dict[str, float], pages: dict[str, int]) -> dict[str, Any]:
    """The sweep's numbers for one crawl; ``limits``/``pages`` by host address."""
    result, truth = crawl.result, crawl.truth["hosts"]
    reason = result.stats.get("finish_reason")
    row: dict[str, Any] = {
        "returncode": result.returncode,
        "finish_reason": reason,
        "finished": int(reason == "finished"),
        "seconds": round(crawl.seconds, 1),
    }
    requests = total_429 = 0
    starts, ends, rates, shares, late_shares = [], [], [], [], []
    for address, limit in limits.items():
        reqs = truth[address]["requests"]
        numbers = host_numbers(reqs, limit)
        key = f"{limit:g}"
        row[f"rate_after_5s_{key}"] = _round(numbers.get("rate_2xx_fraction_after_5s"), 3)
        row[f"share_429_{key}"] = round(numbers["429"] / numbers["requests"], 4) if reqs else None
        requests += numbers["requests"]
        total_429 += numbers.get("429", 0)
        if reqs:
            starts.append(reqs[0]["t"])
            ends.append(max(r["end"] or r["t"] for r in reqs))
            shares.append(row[f"share_429_{key}"])
            if numbers["late_requests"]:
                late_shares.append(round(numbers["late_429"] / numbers["late_requests"], 4))
        rates.append(row[f"rate_after_5s_{key}"])
    bound = max(pages[a] / limit for a, limit in limits.items())
    span = max(ends) - min(starts) if starts else None
    scraped = {item["url"] for item in result.items} & crawl.reachable
    row.update(
        {
            "requests_at_server": requests,
            "share_429": round(total_429 / requests, 4) if requests else None,
            "share_429_max_host": max(shares) if shares else None,
            "share_429_after_5s_max_host": max(late_shares) if late_shares else None,
            # a host with too short a span after its first 5 s counts as missing the target
            "rate_after_5s_min_host": None if None in rates else min(rates),
            "span_s": _round(span, 2),
            "lower_bound_s": round(bound, 2),
            "wall_vs_bound": _round(span / bound if span is not None else None, 3),
            "scraped_fraction": round(len(scraped) / len(crawl.reachable), 4) if crawl.reachable else None,
        }
    )
    return row


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def one(
    name: str,
    settings: dict[str, Any],
    limits: tuple[float, ...],
    seconds: float,
    out: Path,
    limit: float,
    burst: int | None = None,
) -> dict[str, Any]:
    site = limit_sweep_site(limits=limits, seconds=seconds, burst=burst)
    by_address = {h.address: float(h.rate_limit.rate) for h in site.hosts if h.rate_limit}
    pages = {h.address: h.pages for h in site.hosts}
    try:
        crawl = crawl_site(site, name, {**COMMON, **settings}, out, limit=limit, requests=True)
    except CrawlTimeout as exc:
        return {"error": str(exc)[:300]}
    row = measure(crawl, by_address, pages)
    if crawl.result.returncode != 0:
        row["log_tail"] = crawl.result.log[-1500:]
    return row


def run(quick: bool = False) -> dict[str, Any]:
    """``{"baseline": "scrapy", "configs": {name: {...}}}``, one crawl per configuration."""
    return run_sweep(QUICK_LIMITS if quick else LIMITS, quick)


def run_sweep(limits: tuple[float, ...], quick: bool, burst: int | None = None) -> dict[str, Any]:
    """Each configuration crawls one host per limit (*burst*: every host's bucket; None: the sweep's)."""
    seconds = QUICK_SECONDS if quick else SECONDS
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="openclaw-bench-sweep-") as tmp:
        for name, settings in CONFIGS.items():
            results[name] = one(name, settings, limits, seconds, Path(tmp), QUICK_LIMIT if quick else LIMIT, burst)
    return {
        "baseline": "scrapy",
        "quick": quick,
        "limits": list(limits),
        "burst": burst,
        "seconds_per_host": seconds,
        "configs": results,
    }


def main() -> None:
    run_module(run)


if __name__ == "__main__":
    main()
