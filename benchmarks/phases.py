"""Figures of a crawl against limits that move: per phase of a host's limit, from the site's ground truth.

A phase is the time one rate of a :class:`~scrapy_openclaw.testing.chaos.RateLimit`
schedule is in force (seconds after the site started). Its figures count the
requests sent from the phase's first ``SKIP`` seconds on (the client has to meet a
change before it can follow it) to its end, or to the host's last request:

- ``rate``: 2xx answers per second over the limit then in force (target >= 0.85);
- ``limiter``: share of those requests the limiter answered (its status; target <= 2%).

The configurations (plain Scrapy, careful Scrapy = AutoThrottle + 10 retries, the
add-on on its defaults) are the sweep's, crawled one after the other in the same run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scrapy_openclaw.testing.chaos import RateLimit

SKIP = 3.0  # seconds after a change before a phase is judged
CONFIGS: dict[str, dict[str, Any]] = {
    "scrapy": {},
    "scrapy_careful": {"AUTOTHROTTLE_ENABLED": True, "RETRY_TIMES": 10},
    "openclaw": {"ADDONS": {"scrapy_openclaw.Addon": 100}},
}
COMMON: dict[str, Any] = {"LOG_LEVEL": "INFO"}


def phase_rows(limit: RateLimit) -> list[tuple[float, float, float]]:
    """``(start, end, rate)`` of each phase, seconds after the site started (the last ends never)."""
    rows = [(0.0, limit.rate), *((at, rate) for at, rate, _ in limit.schedule)]
    return [
        (start, rows[i + 1][0] if i + 1 < len(rows) else float("inf"), rate) for i, (start, rate) in enumerate(rows)
    ]


def phase_figures(requests: list[dict[str, Any]], started_at: float, limit: RateLimit) -> list[dict[str, Any]]:
    """One dict per phase: its limit, 2xx rate / limit and limiter share after its first SKIP s."""
    if not requests:
        return []
    first, last = requests[0]["t"], max(r["t"] for r in requests)
    out = []
    for start, end, rate in phase_rows(limit):
        lo = max(started_at + start, first) + SKIP
        hi = min(started_at + end, last)
        window = [r for r in requests if lo <= r["t"] < hi]
        judged = hi - lo >= 2.0 and window
        ok = sum(1 for r in window if str(r["status"]).startswith("2"))
        refused = sum(1 for r in window if r["status"] == limit.status)
        out.append(
            {
                "limit": rate,
                "rate": round(ok / (hi - lo) / rate, 3) if judged and rate > 0 else None,
                "limiter": round(refused / len(window), 4) if judged else None,
            }
        )
    return out


def host_summary(requests: list[dict[str, Any]], limit: RateLimit | None) -> dict[str, Any]:
    """Requests, the limiter's share of all of them, and the host's span (first request to last answer)."""
    if not requests:
        return {"requests": 0, "limiter": None, "span": None}
    status = limit.status if limit is not None else None
    refused = sum(1 for r in requests if status is not None and r["status"] == status)
    span = max(r["end"] or r["t"] for r in requests) - requests[0]["t"]
    return {"requests": len(requests), "limiter": round(refused / len(requests), 4), "span": round(span, 2)}


def flat_row(prefix: str, figures: list[dict[str, Any]]) -> dict[str, Any]:
    """``<prefix>_p<N>_rate`` / ``_limiter`` keys for a report table, and the worst phase's."""
    row: dict[str, Any] = {}
    for i, f in enumerate(figures, 1):
        row[f"{prefix}_p{i}_rate"] = f["rate"]
        row[f"{prefix}_p{i}_limiter"] = f["limiter"]
    rates = [f["rate"] for f in figures]
    shares = [f["limiter"] for f in figures]
    row[f"{prefix}_min_phase_rate"] = None if None in rates or not rates else min(rates)
    row[f"{prefix}_max_phase_limiter"] = None if None in shares or not shares else max(shares)
    return row


def plot(
    crawls: dict[str, tuple[list[dict[str, Any]], float]], limit: RateLimit, path: Path, title: str
) -> Path | None:
    """A PNG of each configuration's 2xx and limiter answers per second against the limit in
    force (config -> (requests, site start)); None without matplotlib (the ``plot`` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    labels = {
        "scrapy": "plain Scrapy",
        "scrapy_careful": "careful Scrapy (AutoThrottle)",
        "openclaw": "scrapy-openclaw",
    }
    fig, axes = plt.subplots(len(crawls), 1, figsize=(9, 2.6 * len(crawls)), sharex=True, squeeze=False)
    for ax, (name, (requests, started)) in zip(axes[:, 0], crawls.items()):
        seconds = int(max((r["t"] - started for r in requests), default=0)) + 1
        ok, refused = [0] * seconds, [0] * seconds
        for r in requests:
            second = int(r["t"] - started)
            if str(r["status"]).startswith("2"):
                ok[second] += 1
            elif r["status"] == limit.status:
                refused[second] += 1
        # (the phases the crawl lived through: one that ended early met no later change)
        steps = [(s, min(e, seconds), rate) for s, e, rate in phase_rows(limit) if s < seconds]
        xs = [x for s, e, _ in steps for x in (s, e)]
        ys = [rate for _, _, rate in steps for _ in (0, 1)]
        ax.plot(xs, ys, color="black", linewidth=1.5, label="limit in force")
        ax.plot(range(seconds), ok, color="tab:blue", label="2xx / s")
        ax.plot(range(seconds), refused, color="tab:red", linestyle="--", label=f"{limit.status} / s")
        ax.set_ylabel("req/s")
        ax.set_title(labels.get(name, name), fontsize=9)
        ax.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("seconds since the site started")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
