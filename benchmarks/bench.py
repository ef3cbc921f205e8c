"""Benchmark: ``scrapy bench`` with and without the add-on, side by side in one run.

``scrapy bench`` is the number a Scrapy user measures first: Scrapy's own
benchmark spider follows links on a local server for ``CLOSESPIDER_TIMEOUT``
seconds. This scenario runs it as a user would (``python -m scrapy bench``,
in an empty scratch directory, outside any project), alternating plain
Scrapy and ``-s ADDONS={"scrapy_openclaw.Addon": 100}`` (A B, A B, ...), and
reads two figures from each run's log:

* ``pages_per_min``: the median of the per-second ``Crawled N pages (at X
  pages/min)`` lines (the first, always 0, and the last, a partial second,
  left out): the steady rate, without start-up and close;
* ``overall_pages_per_min``: ``response_received_count`` over
  ``elapsed_time_seconds`` from the stats dump: the whole run;
* ``kb_per_s``, ``bytes_per_page`` and ``depth_max`` (response bytes, the
  deepest request): the bench server's pages are not all alike. Each link
  carries the whole path that led to it (``scrapy.utils.benchserver`` copies
  the page's query, whose ``n`` arrives as a bytes key, and adds a new str
  ``n``), so a page at depth 60 is about twice the size of one at depth 10
  and costs about twice as much to parse and to canonicalise. Pages/min
  therefore depends on the order the queue hands requests out.

So each round also runs both with ``DEPTH_LIMIT=5`` (``scrapy_depth5``,
``openclaw_depth5``): every page then has at most five ``n`` and pages/min
compares like with like. The ratios the suite reports are medians of the
paired per-round ratios, per table (as run; depth-limited).

    python -m benchmarks.bench [--quick]
"""

from __future__ import annotations

import ast
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from scrapy_openclaw.testing.servers import subprocess_env

ROUNDS, QUICK_ROUNDS = 5, 2
SECONDS, QUICK_SECONDS = 10, 4  # CLOSESPIDER_TIMEOUT of each run (scrapy bench's own default is 10)
TIMEOUT = 120.0  # per scrapy bench process
_ADDON = ["-s", 'ADDONS={"scrapy_openclaw.Addon": 100}']
_DEPTH = ["-s", "DEPTH_LIMIT=5"]
CONFIGS: dict[str, list[str]] = {
    "scrapy": [],
    "openclaw": _ADDON,
    "scrapy_depth5": _DEPTH,
    "openclaw_depth5": _ADDON + _DEPTH,
}
FIGURES = ("pages_per_min", "overall_pages_per_min", "kb_per_s", "bytes_per_page", "depth_max")
_CRAWLED = re.compile(r"Crawled (\d+) pages \(at (\d+) pages/min\)")
_STATS = re.compile(r"Dumping Scrapy stats:\n(\{.*?\})\n", re.S)


def parse_log(log: str) -> dict[str, Any]:
    """The figures of one ``scrapy bench`` log (see the module docstring); None where the log lacks them."""
    rates = [int(m.group(2)) for m in _CRAWLED.finditer(log)]
    steady = rates[1:-1] or rates[1:]
    stats: dict[str, Any] = {}
    found = _STATS.search(log)
    if found:
        try:
            text = re.sub(r"datetime\.datetime\([^)]*\)", "None", found.group(1))
            stats = ast.literal_eval(re.sub(r"(?<=: )-?(inf|nan)(?=,|\})", "None", text))  # (a rate of inf)
        except (ValueError, SyntaxError):
            stats = {}
    pages, elapsed = stats.get("response_received_count"), stats.get("elapsed_time_seconds")
    size = stats.get("downloader/response_bytes")
    return {
        "pages_per_min": statistics.median(steady) if steady else None,
        "overall_pages_per_min": round(pages / elapsed * 60, 1) if pages and elapsed else None,
        "kb_per_s": round(size / elapsed / 1000, 1) if size and elapsed else None,
        "bytes_per_page": round(size / pages) if size and pages else None,
        "depth_max": stats.get("request_depth_max"),
        "pages": pages,
        "rate_lines": len(rates),
        "finish_reason": stats.get("finish_reason"),
        "errors": log.count("] ERROR:") + log.count("Traceback"),
    }


def bench_once(name: str, seconds: int, work: Path) -> dict[str, Any]:
    """One ``scrapy bench`` in its own empty directory (the add-on's files, if any, stay there)."""
    cwd = work / name
    cwd.mkdir(parents=True, exist_ok=True)
    env = subprocess_env()
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    cmd = [sys.executable, "-m", "scrapy", "bench", "-s", f"CLOSESPIDER_TIMEOUT={seconds}", *CONFIGS[name]]
    try:
        proc = subprocess.run(
            cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=TIMEOUT
        )
    except subprocess.TimeoutExpired as exc:
        return {"error": f"timed out after {TIMEOUT:.0f} s", "log_tail": str(exc.stderr or "")[-1500:]}
    row = parse_log(proc.stderr)
    row["returncode"] = proc.returncode
    if proc.returncode != 0 or row["pages_per_min"] is None or row["errors"]:
        row["error"] = f"exit {proc.returncode}, {row['rate_lines']} rate lines, {row['errors']} errors"
        row["log_tail"] = proc.stderr[-1500:]
    return row


def _table(runs: dict[str, list[dict[str, Any]]], base: str, ours: str) -> dict[str, Any]:
    """Median figures of two configurations and the paired per-round ratios of *ours* to *base*."""
    configs: dict[str, Any] = {}
    for name in (base, ours):
        good = [r for r in runs[name] if "error" not in r]
        configs[name] = {
            key: statistics.median(values) if (values := [r[key] for r in good if r[key] is not None]) else None
            for key in FIGURES
        }
        configs[name]["runs_ok"] = len(good)
        errors = [r for r in runs[name] if "error" in r]
        if errors:  # the first failure's reason, kept with the run; the row fails only when no run is left
            configs[name]["failed_run"] = {"error": errors[0]["error"], "log_tail": errors[0].get("log_tail")}
        if not good:
            configs[name]["error"] = errors[0]["error"]
    ratios = {
        key: [
            round(o[key] / b[key], 3)
            for b, o in zip(runs[base], runs[ours])
            if "error" not in b and "error" not in o and b[key] and o[key]
        ]
        for key in FIGURES
    }
    return {
        "baseline": base,
        "configs": configs,
        "paired_ratios": ratios,
        "ratio_pages_per_min": statistics.median(ratios["pages_per_min"]) if ratios["pages_per_min"] else None,
        "ratio_kb_per_s": statistics.median(ratios["kb_per_s"]) if ratios["kb_per_s"] else None,
    }


def run(quick: bool = False) -> dict[str, Any]:
    """``ROUNDS`` alternating rounds of every configuration; a table per pair (as run, depth-limited)."""
    rounds = QUICK_ROUNDS if quick else ROUNDS
    seconds = QUICK_SECONDS if quick else SECONDS
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in CONFIGS}
    with tempfile.TemporaryDirectory(prefix="openclaw-bench-bench-") as tmp:
        for i in range(rounds):
            for name in CONFIGS:
                runs[name].append(bench_once(name, seconds, Path(tmp) / f"round{i + 1}"))
    tables = {"as_run": _table(runs, "scrapy", "openclaw"), "depth5": _table(runs, "scrapy_depth5", "openclaw_depth5")}
    ratio = tables["as_run"]["ratio_pages_per_min"]
    fair = tables["depth5"]["ratio_pages_per_min"]
    return {
        "rounds": rounds,
        "seconds_per_run": seconds,
        "cores": os.cpu_count(),
        "tables": tables,
        "per_run": runs,
        "target_met": {
            "openclaw >= 0.95 x scrapy pages/min": bool(ratio is not None and ratio >= 0.95),
            "depth-limited: openclaw >= 0.95 x scrapy pages/min": bool(fair is not None and fair >= 0.95),
        },
    }


if __name__ == "__main__":
    from benchmarks.suite import run_module

    run_module(run)
