"""``python -m benchmarks run [SCENARIO ...] [--repeat N] [--quick] [--out DIR]``, ``... list``, ``... report [DIR]``.

``run`` with no scenario runs them all, in registry order. It prints progress
to stderr and the markdown report to stdout, and writes ``DIR/results.json``
(every raw number, the date, the command, the machine), ``DIR/results.md``
and, when matplotlib is installed, ``DIR/health.png``. ``--profile`` adds,
in every ``overhead`` run, one unmeasured add-on crawl under cProfile:
``DIR/profile-overhead.txt`` (use ``--repeat 1``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from benchmarks import plot, report, suite

DEFAULT_OUT = Path("benchmarks") / "results"


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _limits(result: dict[str, Any]) -> dict[str, float]:
    """The server's per-host limit for the plot's reference line, as the scenario reported it."""
    limits = {}
    for raw in result["scenarios"].get("ratelimit", {}).get("raw", [])[:1]:
        rate = (raw.get("limit") or {}).get("rate") if isinstance(raw.get("limit"), dict) else None
        if isinstance(rate, (int, float)):
            limits["ratelimit"] = float(rate)
    return limits


def finish(result: dict[str, Any], out: Path) -> None:
    """Plot, render and write a suite result (fresh, or re-read by ``report``)."""
    png = None
    if any(suite.SCENARIOS.get(n) and suite.SCENARIOS[n].record for n in result["scenarios"]):
        png, message = plot.plot(out / "recordings", out / "health.png", _limits(result))
        _progress(message)
    result["plot"] = str(png) if png else None
    markdown = report.render_markdown(result)
    if png:
        markdown += f"\n![per-domain request rate and health over time]({png.name})\n"
    report.write_json(out / "results.json", result)
    (out / "results.md").write_text(markdown, encoding="utf-8")
    print(markdown)
    _progress(f"results: {out / 'results.json'}, {out / 'results.md'}; total {result['total_seconds']:.0f} s")


def cmd_run(args: argparse.Namespace) -> int:
    names = args.scenarios or list(suite.SCENARIOS)
    if args.repeat is not None and args.repeat < 1:
        raise SystemExit("--repeat must be >= 1")
    out = Path(args.out)
    if args.profile:  # read by benchmarks.overhead in its child process
        os.environ["BENCH_PROFILE"] = "1"
    meta = {
        "date": report.now_iso(),
        "command": report.command_line(),
        "quick": args.quick,
        "machine": report.machine_info(),
        "scenarios": names,
        "repeat": args.repeat,
    }
    result = suite.run_suite(names, quick=args.quick, repeat=args.repeat, out=out, progress=_progress)
    result = {"meta": meta, **result}
    finish(result, out)
    failed = [n for n, s in result["scenarios"].items() if s["errors"]]
    if failed:
        _progress(f"scenarios with failed runs: {', '.join(failed)}")
    return 1 if failed else 0


def cmd_report(args: argparse.Namespace) -> int:
    """Rebuild tables, markdown and plot from a results.json's raw numbers (nothing is re-run)."""
    out = Path(args.dir)
    result = json.loads((out / "results.json").read_text(encoding="utf-8"))
    for name, scenario in result["scenarios"].items():
        scenario["tables"] = suite.summarise(name, scenario["raw"])
    finish(result, out)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    for s in suite.SCENARIOS.values():
        print(
            f"{s.name:12} {s.about} (default repeats {s.repeat}, limit {s.limit:.0f} s, "
            f"quick {s.quick_limit:.0f} s{', recorded for the plot' if s.record else ''})"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description="scrapy-openclaw side by side with plain Scrapy, in one run"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run scenarios and report")
    run.add_argument("scenarios", nargs="*", metavar="SCENARIO", help=f"any of: {', '.join(suite.SCENARIOS)}")
    run.add_argument(
        "--repeat", type=int, default=None, help="runs per scenario (default: each scenario's own, 3 for the fast ones)"
    )
    run.add_argument("--quick", action="store_true", help="small sizes, for the CI smoke run")
    run.add_argument("--out", default=str(DEFAULT_OUT), help=f"output directory (default {DEFAULT_OUT})")
    run.add_argument(
        "--profile",
        action="store_true",
        help="overhead: also profile one add-on crawl, top functions in DIR/profile-overhead.txt",
    )
    run.set_defaults(func=cmd_run)
    rep = sub.add_parser("report", help="re-render DIR/results.json (after changing the report code)")
    rep.add_argument("dir", nargs="?", default=str(DEFAULT_OUT))
    rep.set_defaults(func=cmd_report)
    sub.add_parser("list", help="list the scenarios").set_defaults(func=cmd_list)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
