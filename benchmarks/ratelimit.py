"""Benchmark: a rate-limited 3-host site, plain Scrapy vs a careful user vs scrapy-openclaw.

Every host of the site (``presets.rate_limited_site``) allows 10 req/s with a
burst of 5 and answers 429 (``Retry-After: 1``) beyond that. Reported per
configuration, from the server's ground truth:

- ``share_429``: requests answered 429 / all requests (and the same for
  requests more than 5 s after a host's first request: after the learning
  phase; target <= 2%);
- ``rate_2xx_fraction``: 2xx answers per second over each host's active
  span, as a fraction of the 10 req/s limit, averaged over hosts (and the
  same after the first 5 s; target >= 85%);
- ``scraped_fraction``: pages scraped / pages reachable.

A crawl that gives up early (plain Scrapy drops pages after 2 retries) can
show a high 2xx rate over its short span; read it with ``scraped_fraction``.
Each configuration crawls a freshly started site, in the same run.

    python -m benchmarks.ratelimit [--quick]
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from benchmarks.suite import crawl_site, run_module
from scrapy_openclaw.testing.crawl import CrawlTimeout
from scrapy_openclaw.testing.presets import rate_limited_site

RATE, BURST, HOSTS = 10.0, 5, 3
LEARNING = 5.0  # seconds after a host's first request

COMMON = {"LOG_LEVEL": "INFO", "CONCURRENT_REQUESTS": 16}
CONFIGS: dict[str, dict[str, Any]] = {
    "scrapy": {},
    # what a careful user would set: AutoThrottle and more retries (429 is in RETRY_HTTP_CODES)
    "scrapy_careful": {"AUTOTHROTTLE_ENABLED": True, "RETRY_TIMES": 10},
    "openclaw": {"ADDONS": {"scrapy_openclaw.Addon": 100}},
}


def host_numbers(requests: list[dict[str, Any]], rate: float = RATE) -> dict[str, Any]:
    """One host's 429s and 2xx rate / ``rate``, over its active span and after its first ``LEARNING`` s."""
    if not requests:
        return {"requests": 0}
    first = requests[0]["t"]
    span = max(requests[-1]["t"] - first, 1e-9)
    late = [r for r in requests if r["t"] > first + LEARNING]
    ok = sum(1 for r in requests if str(r["status"]).startswith("2"))
    ok_late = sum(1 for r in late if str(r["status"]).startswith("2"))
    return {
        "requests": len(requests),
        "429": sum(1 for r in requests if r["status"] == 429),
        "late_requests": len(late),
        "late_429": sum(1 for r in late if r["status"] == 429),
        "rate_2xx_fraction": ok / span / rate,
        "rate_2xx_fraction_after_5s": ok_late / (span - LEARNING) / rate if span > LEARNING + 1 else None,
    }


def _one(name: str, settings: dict[str, Any], quick: bool, out: Path) -> dict[str, Any]:
    site = rate_limited_site(n_hosts=HOSTS, rate=RATE, burst=BURST, pages=150 if quick else 400)
    try:
        crawl = crawl_site(site, name, {**COMMON, **settings}, out, limit=120 if quick else 300, requests=True)
    except CrawlTimeout as exc:
        return {"error": str(exc)[:300]}
    result, ok, truth, elapsed = crawl.result, crawl.reachable, crawl.truth, crawl.seconds
    hosts = [host_numbers(h["requests"]) for h in truth["hosts"].values()]
    total = sum(h["requests"] for h in hosts)
    late = sum(h.get("late_requests", 0) for h in hosts)
    after = [h["rate_2xx_fraction_after_5s"] for h in hosts if h.get("rate_2xx_fraction_after_5s") is not None]
    scraped = {item["url"] for item in result.items} & ok
    return {
        "returncode": result.returncode,
        "finish_reason": result.stats.get("finish_reason"),
        "seconds": round(elapsed, 1),
        "requests_at_server": total,
        "responses_429": sum(h.get("429", 0) for h in hosts),
        "share_429": round(sum(h.get("429", 0) for h in hosts) / total, 4) if total else None,
        "share_429_after_5s": round(sum(h.get("late_429", 0) for h in hosts) / late, 4) if late else None,
        "rate_2xx_fraction": round(sum(h.get("rate_2xx_fraction", 0) for h in hosts) / len(hosts), 3),
        "rate_2xx_fraction_after_5s": round(sum(after) / len(after), 3) if after else None,
        "scraped_fraction": round(len(scraped) / len(ok), 4) if ok else None,
        "log_tail": None if result.returncode == 0 else result.log[-1500:],
    }


def run(quick: bool) -> dict[str, Any]:
    """Crawl the rate-limited site once per configuration: ``{"baseline": "scrapy", "configs": {...}}``."""
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="openclaw-bench-ratelimit-") as tmp:
        for name, settings in CONFIGS.items():
            res = _one(name, settings, quick, Path(tmp))
            if res.get("log_tail") is None:
                res.pop("log_tail", None)
            results[name] = res
    return {
        "baseline": "scrapy",
        "quick": quick,
        "limit": {"rate": RATE, "burst": BURST, "hosts": HOSTS},
        "configs": results,
    }


def main() -> None:
    run_module(run)


if __name__ == "__main__":
    main()
