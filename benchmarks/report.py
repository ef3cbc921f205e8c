"""The report: a markdown table of ratios to plain Scrapy, and a JSON file with every raw number.

The markdown leads with one line per headline metric (scrapy-openclaw vs the
baseline, the ratio, the issue's target and whether it is met), then one
table per scenario: configurations as rows, metrics as columns, each cell
``median (x ratio to the baseline row)``. The JSON keeps everything the
markdown was made from (every repeat's raw dict, errors, timings) plus the
date, the exact command and the machine, so a number can be traced back.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def machine_info() -> dict[str, Any]:
    import scrapy
    import twisted

    info: dict[str, Any] = {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "scrapy": scrapy.__version__,
        "twisted": twisted.__version__,
        "platform": platform.platform(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    try:
        from importlib.metadata import version

        info["scrapy_openclaw"] = version("scrapy-openclaw")
    except Exception:  # not installed as a distribution: report what we can
        info["scrapy_openclaw"] = None
    try:
        info["git_commit"] = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True
        ).stdout
        info["git_dirty"] = bool(dirty.strip())
    except (OSError, subprocess.SubprocessError):
        info["git_commit"] = None
    return info


def command_line(argv: list[str] | None = None) -> str:
    args = sys.argv[1:] if argv is None else argv
    return "python -m benchmarks " + shlex.join(args)


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def fmt(value: float | None) -> str:
    if value is None:
        return "–"
    magnitude = abs(value)
    if value == int(value) and magnitude < 1e15:
        return f"{int(value):,}"
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def fmt_ratio(ratio: float | None) -> str:
    if ratio is None:
        return ""
    return f"×{ratio:.2f}" if abs(ratio) >= 0.1 else f"×{ratio:.2g}"


def _met(met: bool | None) -> str:
    return "–" if met is None else ("yes" if met else "**no**")


def headline_table(result: dict[str, Any]) -> list[str]:
    lines = [
        "| scenario | metric | baseline | baseline value | ours | our value | ratio | target | met |",
        "| --- | --- | --- | ---: | --- | ---: | ---: | --- | --- |",
    ]
    for name, scenario in result["scenarios"].items():
        if not scenario["tables"]:
            lines.append(f"| {name} | – | – | – | – | – | – | – | failed |")
        for table in scenario["tables"]:
            labels = {m["key"]: m["label"] for m in table["metrics"]}
            for h in table["headlines"]:
                lines.append(
                    f"| {name} | {labels.get(h['metric'], h['metric'])} | {table['baseline'] or '–'} | "
                    f"{fmt(h['baseline_value'])} | {h['ours']} | {fmt(h['value'])} | "
                    f"{fmt_ratio(h['ratio']) or '–'} | {h['target']} | {_met(h['met'])} |"
                )
    return lines


def scenario_tables(name: str, scenario: dict[str, Any]) -> list[str]:
    runs = len(scenario["seconds"])
    secs = ", ".join(f"{s:.0f}" for s in scenario["seconds"])
    lines = [f"### {name}", "", f"{scenario['about']}. {runs} run{'s' if runs != 1 else ''} ({secs} s)."]
    for error in scenario["errors"]:
        lines += ["", f"**A run failed:** {error.splitlines()[0]}"]
    for table in scenario["tables"]:
        metrics = table["metrics"]
        header = "| configuration | " + " | ".join(m["label"] for m in metrics) + " |"
        lines += [
            "",
            f"**{table['title']}**" + (f" (ratios to `{table['baseline']}`)" if table["baseline"] else ""),
            "",
            header,
            "| --- |" + " ---: |" * len(metrics),
        ]
        for config, cells in table["rows"].items():
            row = [f"`{config}`" + (" (baseline)" if config == table["baseline"] else "")]
            for m in metrics:
                cell = cells.get(m["key"], {})
                text = fmt(cell.get("median"))
                if cell.get("ratio") is not None:
                    text += f" ({fmt_ratio(cell['ratio'])})"
                row.append(text)
            lines.append("| " + " | ".join(row) + " |")
    return lines


def render_markdown(result: dict[str, Any]) -> str:
    meta = result["meta"]
    m = meta["machine"]
    lines = [
        f"## Benchmark results ({meta['date']})",
        "",
        f"Command: `{meta['command']}`{' (quick sizes)' if meta['quick'] else ''}. "
        f"Machine: {m['cores']} cores, Python {m['python']}, Scrapy {m['scrapy']}, Twisted {m['twisted']}, "
        f"load average at start {m['load_average_at_start'][0]}. Total wall time {result['total_seconds']:.0f} s.",
        "",
        "Values are medians over the runs; a ratio is the median of the per-run ratios to the baseline "
        "configuration of the same run (the configurations run interleaved, A B A B ...).",
        "",
        *headline_table(result),
    ]
    for name, scenario in result["scenarios"].items():
        lines += ["", *scenario_tables(name, scenario)]
    return "\n".join(lines) + "\n"


def write_json(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, sort_keys=False), encoding="utf-8")
