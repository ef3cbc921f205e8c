"""A PNG of per-domain request rate and health over time, from the recorder's data.

For the ``ratelimit`` and ``flaky`` scenarios (one row each): the request rate
per domain of plain Scrapy, of the careful user's Scrapy (AutoThrottle, more
retries) and of scrapy-openclaw, and
scrapy-openclaw's health score per domain with the rate its controller
allows, so a reader sees the controller back off and recover. Throttle and
server errors (429/503 answers per second) are drawn dashed under the rates.

matplotlib is an optional extra (``pip install scrapy-openclaw[plot]``);
without it the suite prints a message and skips the plot.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PLOTTED = ("ratelimit", "flaky")
BASELINE, CAREFUL, OURS = "scrapy", "scrapy_careful", "openclaw"
LABELS = {BASELINE: "plain Scrapy", CAREFUL: "careful Scrapy (AutoThrottle, 10 retries)", OURS: "scrapy-openclaw"}
ERROR_STATUSES = ("429", "503")
WINDOW = 1.0  # seconds over which a rate is computed


def read_recording(path: Path) -> list[dict[str, Any]]:
    """The samples of one recorder file (a torn last line, from a killed crawl, is skipped)."""
    samples = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if "domains" in data:
            samples.append(data)
    return samples


def series(samples: list[dict[str, Any]], domain: str, key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for s in samples:
        value = s["domains"].get(domain, {}).get(key)
        if value is not None:
            xs.append(s["elapsed"])
            ys.append(value)
    return xs, ys


def rate_series(
    samples: list[dict[str, Any]], domain: str, count: Any = lambda d: d.get("done", 0)
) -> tuple[list[float], list[float]]:
    """Events per second over the last ``WINDOW`` seconds, from cumulative counts."""
    points = [(s["elapsed"], count(s["domains"].get(domain, {}))) for s in samples]
    xs, ys = [], []
    lo = 0
    for t, c in points:
        while lo < len(points) - 1 and t - points[lo + 1][0] >= WINDOW:
            lo += 1
        t0, c0 = points[lo]
        if t > t0:
            xs.append(t)
            ys.append((c - c0) / (t - t0))
    return xs, ys


def _errors(entry: dict[str, Any]) -> int:
    status = entry.get("status", {})
    return sum(status.get(s, 0) for s in ERROR_STATUSES)


def find_recordings(record_root: Path, scenario: str) -> dict[str, Path]:
    """``{config: path}`` from the first run of ``scenario`` that recorded anything."""
    base = record_root / scenario
    for run in sorted(base.glob("run*")) if base.exists() else []:
        files = {p.stem: p for p in sorted(run.glob("*.jsonl"))}
        if files:
            return files
    return {}


def plot(record_root: Path, out_path: Path, limits: dict[str, float] | None = None) -> tuple[Path | None, str]:
    """Write the PNG; returns ``(path or None, message)``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None, "matplotlib is not installed (pip install 'scrapy-openclaw[plot]'): no plot"
    scenarios = {name: find_recordings(record_root, name) for name in PLOTTED}
    scenarios = {k: v for k, v in scenarios.items() if BASELINE in v or OURS in v}
    if not scenarios:
        return None, f"no recordings for {' or '.join(PLOTTED)} under {record_root}: no plot"
    limits = limits or {}
    fig, axes = plt.subplots(len(scenarios), 4, figsize=(21, 4.2 * len(scenarios)), squeeze=False)
    for row, (name, files) in enumerate(scenarios.items()):
        data = {config: read_recording(path) for config, path in files.items()}
        for col, config in enumerate((BASELINE, CAREFUL, OURS)):
            ax = axes[row][col]
            _rates(ax, data.get(config, []), limits.get(name))
            ax.set_title(f"{name}: {LABELS[config]}\nrequests/s per domain", fontsize=10)
        _health(axes[row][3], data.get(OURS, []))
        axes[row][3].set_title(f"{name}: scrapy-openclaw\nhealth and allowed rate", fontsize=10)
    fig.tight_layout()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, dpi=90)
    plt.close(fig)
    return out_path, f"plot written to {out_path}"


def _domains(samples: list[dict[str, Any]]) -> list[str]:
    return sorted({d for s in samples for d in s["domains"]})


def _rates(ax: Any, samples: list[dict[str, Any]], limit: float | None) -> None:
    if not samples:
        ax.text(0.5, 0.5, "no recording", ha="center", va="center", transform=ax.transAxes)
        return
    for i, domain in enumerate(_domains(samples)):
        color = f"C{i % 10}"
        xs, ys = rate_series(samples, domain)
        marker = "o" if len(xs) < 8 else None  # a crawl that gave up within a second or two
        ax.plot(xs, ys, color=color, label=domain, linewidth=1.2, marker=marker)
        ax.plot(*rate_series(samples, domain, _errors), color=color, linestyle="--", linewidth=0.9, marker=marker)
    if limit:
        ax.axhline(limit, color="black", linestyle=":", linewidth=1, label=f"server limit {limit:g}/s")
    ax.set_xlabel("seconds")
    ax.set_ylabel("requests/s (dashed: 429/503 answers/s)")
    ax.legend(fontsize=7, loc="upper right")


def _health(ax: Any, samples: list[dict[str, Any]]) -> None:
    if not samples or not any("health" in e for s in samples for e in s["domains"].values()):
        ax.text(0.5, 0.5, "no health recorded", ha="center", va="center", transform=ax.transAxes)
        return
    twin = ax.twinx()
    for i, domain in enumerate(_domains(samples)):
        color = f"C{i % 10}"
        ax.plot(*series(samples, domain, "health"), color=color, label=f"{domain} health", linewidth=1.2)
        twin.plot(*series(samples, domain, "rate"), color=color, linestyle=":", linewidth=1)
    ax.set_ylim(0, 105)
    ax.set_xlabel("seconds")
    ax.set_ylabel("health (0..100)")
    twin.set_ylabel("allowed rate req/s (dotted)")
    ax.legend(fontsize=7, loc="lower right")
