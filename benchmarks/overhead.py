"""Benchmark: what scrapy-openclaw costs on a site that needs none of it.

A fault-free, zero-latency chaos site (``presets.fast_site``: one host, 5,000
pages, all linked from its root) is crawled once per configuration, in the
same run, each on a freshly started site:

* ``scrapy``: plain Scrapy defaults;
* ``openclaw``: the add-on exactly as a new user gets it (``ADDONS`` only).
  The target is >= 0.95 x plain Scrapy's pages/s, as the median
  of the paired per-run ratios (the suite repeats this scenario);
* ``openclaw_no_gc_freeze``: the add-on with ``OPENCLAW_GC_FREEZE`` off,
  so the garbage collector does the same work as in plain Scrapy: the
  ratio of this row is the cost of the add-on's components alone (the
  default row also has the heap freeze, which saves ~15% of the CPU per
  page, plain Scrapy's included; see ``scrapy_openclaw/heap.py``).

Pages/s comes from the server's ground truth (pages served with 200 over the
span from the first to the last request), so process start-up and shutdown
do not blur it; ``wall_s`` is the whole crawl subprocess, start to exit. A
crawl that is still running after ``CAP`` seconds is closed
(``CLOSESPIDER_TIMEOUT``): its pages/s still counts, ``complete`` says 0.
Peak memory is the crawl process's own maximum RSS (``os.wait4``'s rusage
for exactly that child). Correctness is checked too: every reachable page
must be scraped exactly once.

With ``--profile`` (or ``BENCH_PROFILE=1``, which ``python -m benchmarks run
--profile`` sets) one more add-on crawl runs under cProfile, unmeasured, and
``profile-overhead.txt`` (the top 20 scrapy_openclaw functions by cumulative
and by own time, and their share of the crawl) lands in the suite's output
directory (``benchmarks/results`` when run alone), next to the raw stats.

    python -m benchmarks.overhead [--quick] [--profile]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pstats
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from scrapy_openclaw.testing.crawl import DEFAULT_SPIDER, read_result, start_crawl
from scrapy_openclaw.testing.presets import fast_site
from scrapy_openclaw.testing.servers import ChaosServer

HOSTS = 1
PAGES = 5000  # a dozen seconds at full speed
QUICK_PAGES = 500
CAP, QUICK_CAP = 60.0, 20.0  # CLOSESPIDER_TIMEOUT per crawl
TIMEOUT = 240.0  # per crawl process, then it is killed
PROFILE_ENV = "BENCH_PROFILE"
PROFILE_FILE = "profile-overhead.txt"
PROFILE_TOP = 20
OURS = r"scrapy_openclaw/(?!testing/)"  # the add-on's code, not the chaos spider

COMMON: dict[str, Any] = {"LOG_LEVEL": "INFO"}
CONFIGS: dict[str, dict[str, Any]] = {
    "scrapy": {},
    "openclaw": {"ADDONS": {"scrapy_openclaw.Addon": 100}},
    "openclaw_no_gc_freeze": {"ADDONS": {"scrapy_openclaw.Addon": 100}, "OPENCLAW_GC_FREEZE": False},
}
BASELINE = "scrapy"


def wait_with_rusage(proc: subprocess.Popen[bytes], timeout: float) -> tuple[int, int, bool]:
    """Reap ``proc`` ourselves to read its own rusage: ``(returncode, max RSS in KiB, timed_out)``.

    ``RUSAGE_CHILDREN`` would mix in every other child of this process (the
    chaos server, earlier crawls); ``wait4`` on the pid gives exactly this one.
    """
    deadline = time.monotonic() + timeout
    timed_out = False
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline:
            timed_out = True
            proc.kill()
            pid, status, usage = os.wait4(proc.pid, 0)
            break
        time.sleep(0.05)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_maxrss, timed_out


def crawl_once(
    name: str, settings: dict[str, Any], pages: int, work: Path, cap: float = CAP, profile: Path | None = None
) -> dict[str, Any]:
    """One crawl of a fresh fault-free site; numbers from the server and Scrapy's stats."""
    out = work / name
    merged = {**COMMON, "CLOSESPIDER_TIMEOUT": cap, **settings}
    if "ADDONS" in settings:  # dead letters (there should be none) stay in the scratch directory
        merged["OPENCLAW_DLQ_URI"] = str(out / "deadletters.jsonl")
    with ChaosServer(fast_site(pages=pages)) as server:
        reachable = server.reachable().ok
        started = time.monotonic()
        proc = start_crawl(DEFAULT_SPIDER, merged, {"start_urls": server.start_urls}, out_dir=out, profile=profile)
        returncode, max_rss_kib, timed_out = wait_with_rusage(proc, TIMEOUT)
        wall = time.monotonic() - started
        truth = server.truth()
    result = read_result(out, returncode)
    times = [r["t"] for h in truth["hosts"].values() for r in h["requests"]]
    ok_served = sum(1 for h in truth["hosts"].values() for r in h["requests"] if r["status"] == 200)
    span = (max(times) - min(times)) if len(times) > 1 else 0.0
    scraped = [item["url"] for item in result.items]
    row: dict[str, Any] = {
        "pages_per_s": round(ok_served / span, 1) if span > 0 else None,
        "wall_s": round(wall, 2),
        "crawl_span_s": round(span, 3),
        "peak_rss_mb": round(max_rss_kib / 1024, 1),
        "reachable": len(reachable),
        "scraped": len(set(scraped) & reachable),
        "duplicates": len(scraped) - len(set(scraped)),
        "requests_at_server": len(times),
        "scrapy_elapsed_s": result.stats.get("elapsed_time_seconds"),
        "finish_reason": result.stats.get("finish_reason"),
        "complete": int(result.stats.get("finish_reason") == "finished"),
        "returncode": returncode,
    }
    capped = row["finish_reason"] == "closespider_timeout"  # stopped by the cap: its pages/s still counts
    if timed_out or returncode != 0 or (not capped and row["scraped"] != len(reachable)):
        row["error"] = "timed out" if timed_out else f"exit {returncode}, scraped {row['scraped']}/{len(reachable)}"
        row["log_tail"] = result.log[-1500:]
    return row


def write_profile(stats_path: Path, target: Path, about: str) -> Path:
    """The top scrapy_openclaw functions of a cProfile dump, as text, next to the raw dump."""
    stats = pstats.Stats(str(stats_path))
    entries = stats.stats.items()  # type: ignore[attr-defined]
    ours = sum(own for (file, _, _), (_, _, own, _, _) in entries if re.search(OURS, file))
    text = io.StringIO()
    text.write(
        f"{about}\n\nTotal {stats.total_tt:.2f} s profiled; own time in scrapy_openclaw functions "
        f"(the test spider excluded) {ours:.2f} s ({ours / stats.total_tt:.1%}).\n\n"
    )
    for order, label in (("cumulative", "cumulative time"), ("tottime", "own time")):
        text.write(f"=== top {PROFILE_TOP} scrapy_openclaw functions by {label} ===\n")
        stats.stream = text  # type: ignore[attr-defined]
        stats.sort_stats(order).print_stats(OURS, PROFILE_TOP)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text.getvalue(), encoding="utf-8")
    (target.parent / (target.stem + ".pstats")).write_bytes(stats_path.read_bytes())
    return target


def profile_dir() -> Path:
    return Path(os.environ.get("BENCH_OUT_DIR") or Path(__file__).resolve().parent / "results")


def run(quick: bool = False, profile: bool | None = None) -> dict[str, Any]:
    """Crawl the fast site once per configuration (in ``CONFIGS`` order); with ``profile`` (default:
    ``$BENCH_PROFILE``) also one unmeasured add-on crawl under cProfile."""
    pages = QUICK_PAGES if quick else PAGES
    cap = QUICK_CAP if quick else CAP
    if profile is None:
        profile = os.environ.get(PROFILE_ENV, "") not in ("", "0")
    report: dict[str, Any] = {
        "hosts": HOSTS,
        "pages_per_host": pages,
        "cap_s": cap,
        "baseline": BASELINE,
        "configs": {},
    }
    with tempfile.TemporaryDirectory(prefix="openclaw-bench-overhead-") as tmp:
        for name, settings in CONFIGS.items():
            report["configs"][name] = crawl_once(name, settings, pages, Path(tmp), cap)
        if profile:
            dump = Path(tmp) / "openclaw.pstats"
            row = crawl_once("openclaw_profiled", CONFIGS["openclaw"], pages, Path(tmp), cap, profile=dump)
            about = (
                f"cProfile of the add-on on defaults, fast site ({pages} pages, one host): "
                f"{row.get('scraped')} pages in {row.get('crawl_span_s')} s at the server, "
                f"finish reason {row.get('finish_reason')}"
            )
            written = write_profile(dump, profile_dir() / PROFILE_FILE, about) if dump.exists() else None
            report["profile"] = str(written) if written else None
    base = report["configs"][BASELINE].get("pages_per_s")
    ours = report["configs"]["openclaw"].get("pages_per_s")
    report["ratio_pages_per_s"] = round(ours / base, 3) if base and ours else None
    alone = report["configs"]["openclaw_no_gc_freeze"].get("pages_per_s")
    report["ratio_components_alone"] = round(alone / base, 3) if base and alone else None
    report["target_met"] = {
        "openclaw >= 0.95 x scrapy pages/s": bool(
            report["ratio_pages_per_s"] is not None and report["ratio_pages_per_s"] >= 0.95
        )
    }
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--profile", action="store_true", help=f"also profile an add-on crawl ({PROFILE_FILE})")
    args = parser.parse_args()
    print(json.dumps(run(args.quick, profile=args.profile or None), indent=1))


if __name__ == "__main__":
    main()
