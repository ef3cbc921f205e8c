"""The scenario registry and the runner: repeats, time limits, medians.

Each scenario's ``run(quick)`` runs in its own child process (its own
process group): a scenario that hangs is killed with everything it started
(chaos servers, crawls, redis) when its time limit passes, and one scenario's
reactor, imports or memory cannot leak into the next. Every ``run()`` already
crawls all of its configurations once (A B C), so repeating it interleaves
them (A B C, A B C, ...): slow drift of a shared machine hits every
configuration alike. The report shows, per configuration and metric, the
median over repeats, and ratios as the median of the per-repeat ratios to the
baseline (paired: same repeat, same machine weather).

All traffic stays on loopback: the scenarios crawl the chaos site
(127.0.0.x) and talk to a local redis-server only.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import recorder
from benchmarks.adapters import Table, adapt

RECORD_DIR_ENV = "BENCH_RECORD_DIR"
OUT_DIR_ENV = "BENCH_OUT_DIR"  # the suite's output directory, for evidence a scenario keeps (worker logs)
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Scenario:
    name: str
    module: str
    about: str
    repeat: int = 1  # default repeats (``--repeat`` overrides): fast scenarios get 3
    limit: float = 600.0  # seconds per run() at default size, then it is killed
    quick_limit: float = 180.0  # the same with --quick
    record: bool = False  # enable the recorder in its crawls (for the plot)


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "overhead",
            "benchmarks.overhead",
            "pages/s and peak memory on a fault-free fast site (one host, 5,000 pages), add-on on defaults",
            repeat=3,
            limit=300,
            quick_limit=120,
        ),
        Scenario(
            "bench",
            "benchmarks.bench",
            "scrapy bench with and without the add-on, alternating (pages/min from its log)",
            limit=600,
            quick_limit=120,
        ),
        Scenario(
            "flaky",
            "benchmarks.flaky",
            "success rate on a flaky 4-host site (503 windows, drops, hangs)",
            limit=900,
            quick_limit=300,
            record=True,
        ),
        Scenario(
            "ratelimit",
            "benchmarks.ratelimit",
            "429 share and achieved rate on a rate-limited 3-host site",
            limit=900,
            quick_limit=300,
            record=True,
        ),
        Scenario(
            "hol",
            "benchmarks.hol",
            "head-of-line blocking: wall time vs lower bound, fast-host finish",
            limit=600,
            quick_limit=240,
        ),
        Scenario(
            "queue",
            "benchmarks.queue_ops",
            "push/pop rate for 1,000,000 pending requests, memory per request",
            limit=600,
            quick_limit=240,
        ),
        Scenario(
            "broad",
            "benchmarks.broad",
            "100,000 domains x 10 pages: pop cost at 1k/10k/100k domains, memory per request and per domain, "
            "registry eviction and snapshot size, a 5,000-slot crawl; vs Scrapy's queues",
            limit=900,
            quick_limit=120,
        ),
        Scenario(
            "killresume",
            "benchmarks.killresume",
            "lost/duplicated requests after up to 3 kill -9, vs JOBDIR",
            limit=900,
            quick_limit=300,
        ),
        Scenario(
            "mixed",
            "benchmarks.mixed",
            "pages broken for good (every 5th page 503, a few 404) on a healthy 2-host site",
            limit=600,
            quick_limit=180,
        ),
        Scenario(
            "sweep",
            "benchmarks.sweep",
            "hosts limited at 3-150 req/s: 2xx rate / limit and 429 share per host",
            repeat=3,  # one run moves a host's figure by 0.05-0.25: the target reads the median
            limit=600,
            quick_limit=180,
        ),
        Scenario(
            "smallbucket",
            "benchmarks.smallbucket",
            "the sweep's hosts at 12-150 req/s with a bucket of 2 (nginx limit_req with a small burst)",
            repeat=3,
            limit=600,
            quick_limit=180,
        ),
        Scenario(
            "queueing",
            "benchmarks.queueing",
            "a server that queues instead of refusing (2 workers, ~36 pages/s): throughput and its line",
            repeat=3,
            limit=600,
            quick_limit=180,
        ),
        Scenario(
            "moving",
            "benchmarks.moving",
            "a limit that moves (40 -> 8 req/s from 15 s -> 40 from 30 s): per-phase 2xx rate / limit, 429 share",
            limit=600,
            quick_limit=360,
        ),
        Scenario(
            "declared",
            "benchmarks.declared",
            "the moving limit (40 -> 8 -> 40 req/s) said in RateLimit headers (IETF draft) and in X-RateLimit-*",
            limit=900,
            quick_limit=480,
        ),
        Scenario(
            "rising",
            "benchmarks.rising",
            "a limit that rises (10 -> 30 req/s from 15 s): how soon the new limit is found",
            limit=480,
            quick_limit=300,
        ),
        Scenario(
            "falling",
            "benchmarks.falling",
            "a limit that falls and stays down from 15 s (a bucket of 3): 30 -> 5 req/s with and without Retry-After, and 40 -> 30 with it",
            limit=900,
            quick_limit=480,
        ),
        Scenario(
            "manyhosts",
            "benchmarks.manyhosts",
            "a limit of 30/5/30 req/s on one host among twelve healthy ones: per-phase figures",
            limit=600,
            quick_limit=360,
        ),
        Scenario(
            "limiters",
            "benchmarks.limiters",
            "429 without Retry-After (20 req/s) and a 503 + Retry-After: 2 limiter (10 req/s; pages for 20 s, then 90 s)",
            limit=900,
            quick_limit=360,
        ),
        Scenario(
            "blocks",
            "benchmarks.blocks",
            "a 15-s block (nothing answered, 429 with and without Retry-After) in a 30 req/s limit, and 100 requests per fixed 10-s window",
            limit=1200,
            quick_limit=600,
        ),
        Scenario(
            "every3rd",
            "benchmarks.every3rd",
            "every third request refused whatever the pace (400 pages, 1 s answers): time vs plain Scrapy",
            limit=1500,
            quick_limit=500,
        ),
        Scenario(
            "hetero",
            "benchmarks.hetero",
            "18 different sites (healthy, slow, limited four ways, every-3rd 429, flaky, broken pages, a blackhole)",
            limit=600,
            quick_limit=360,
        ),
        Scenario(
            "busy",
            "benchmarks.busy",
            "the sweep, the rate-limited site and a stalling spider, quiet vs beside two CPU hogs",
            limit=900,
            quick_limit=420,
        ),
        Scenario(
            "repeat",
            "benchmarks.repeat",
            "the same rate-limited sites crawled twice, site memory on vs off: 429s per host, time over the bound",
            limit=1200,
            quick_limit=600,
        ),
        Scenario(
            "deadhosts",
            "benchmarks.deadhosts",
            "2 healthy hosts + 40 URLs on a refused and 40 on an unresolvable host",
            limit=600,
            quick_limit=180,
        ),
        Scenario(
            "distributed",
            "benchmarks.distributed",
            "1-3 workers scaling, worker kill (3 rounds), combined per-domain rate, vs scrapy-redis",
            limit=900,
            quick_limit=300,
        ),
        Scenario(
            "rediscost",
            "benchmarks.rediscost",
            "Redis commands and CPU per crawled page, 1-3 workers, one Redis vs a 3-master Redis Cluster",
            limit=900,
            quick_limit=400,
        ),
        Scenario(
            "redisbytes",
            "benchmarks.redisbytes",
            "Redis memory per pending request at 1,000,000 pending (10,000 hosts), vs scrapy-redis",
            limit=1500,
            quick_limit=300,
        ),
        Scenario(
            "workermemory",
            "benchmarks.workermemory",
            "a distributed worker's RSS after 1,000 vs 100,000 domains, with and without the idle sweep",
            limit=1500,
            quick_limit=400,
        ),
    )
}


# --------------------------------------------------------------------------- recorder


def recorder_settings(path: str | os.PathLike[str], interval: float = recorder.DEFAULT_INTERVAL) -> dict[str, Any]:
    """Settings that enable :class:`benchmarks.recorder.BenchRecorder`, writing JSONL to ``path``.

    Merge the ``EXTENSIONS`` entry into a crawl's own (or use :func:`with_recorder`, which does).
    """
    return {
        "EXTENSIONS": {recorder.EXTENSION_PATH: recorder.EXTENSION_ORDER},
        recorder.PATH_SETTING: str(path),
        recorder.INTERVAL_SETTING: interval,
    }


@dataclass
class SiteCrawl:
    """One crawl of a chaos site: what Scrapy returned and what the server saw."""

    result: Any  # scrapy_openclaw.testing.crawl.CrawlResult
    reachable: set[str]
    truth: dict[str, Any]
    seconds: float
    failing: set[str] = field(default_factory=set)  # reachable URLs that fail for good (ground truth)


def crawl_site(
    site: Any,
    name: str,
    settings: dict[str, Any],
    out: Path,
    *,
    limit: float,
    requests: bool = False,
    extra_start_urls: list[str] | tuple[str, ...] = (),
    grace: float = 60.0,
) -> SiteCrawl:
    """Serve *site*, crawl it with ChaosSpider under *settings* (recorded, bounded by
    *limit* seconds) and stop the server; raises ``CrawlTimeout`` if the crawl is still
    running *grace* seconds after that (closing waits for the requests in the download slots).

    The start URLs are every host's root plus *extra_start_urls* (dead hosts).
    Dead letters of add-on runs go to *out* (read them with :func:`dead_letters`).
    """
    from scrapy_openclaw.testing.crawl import run_crawl
    from scrapy_openclaw.testing.servers import ChaosServer

    server = ChaosServer(site).start()
    try:
        reach = server.reachable()
        started = time.monotonic()
        dlq = {"OPENCLAW_DLQ_URI": str(out / name / "deadletters.jsonl")} if "ADDONS" in settings else {}
        merged = with_recorder({"CLOSESPIDER_TIMEOUT": limit, **dlq, **settings}, name)
        result = run_crawl(
            "scrapy_openclaw.testing.spiders.ChaosSpider",
            settings=merged,
            spider_args={"start_urls": [*server.start_urls, *extra_start_urls]},
            timeout=limit + grace,
            out_dir=out / name,
        )
        seconds = time.monotonic() - started
        truth = server.truth(include_requests=requests)
    finally:
        server.stop()
    return SiteCrawl(result, set(reach.ok), truth, seconds, set(reach.failing))


def dead_letters(crawl: SiteCrawl) -> Counter[str] | None:
    """URL -> number of dead-letter records of an add-on crawl; None when it kept none (plain Scrapy)."""
    from scrapy_openclaw.dlq.stores import JsonlStore

    path = crawl.result.out_dir / "deadletters.jsonl"
    if not path.exists():
        return Counter() if any(k.startswith("openclaw/") for k in crawl.result.stats) else None
    return Counter(record.url for record in JsonlStore(path).iter())


def with_recorder(settings: dict[str, Any], config: str) -> dict[str, Any]:
    """``settings`` plus the recorder when the suite asked for recordings, else unchanged.

    The suite sets ``BENCH_RECORD_DIR`` for scenarios it plots; the recording
    of configuration ``config`` lands in ``$BENCH_RECORD_DIR/<config>.jsonl``.
    Calling it twice is harmless. Scenario modules call it on each
    configuration's settings::

        from benchmarks.suite import with_recorder
        merged = with_recorder({**COMMON, **settings}, name)
    """
    directory = os.environ.get(RECORD_DIR_ENV)
    if not directory:
        return settings
    extra = recorder_settings(Path(directory) / f"{config}.jsonl")
    merged = {**settings, **{k: v for k, v in extra.items() if k != "EXTENSIONS"}}
    merged["EXTENSIONS"] = {**dict(settings.get("EXTENSIONS") or {}), **extra["EXTENSIONS"]}
    return merged


# --------------------------------------------------------------------------- one run in a child


def _child(name: str, quick: bool, result_path: str) -> int:
    """``python -m benchmarks.suite NAME quick|full RESULT``: run one scenario once, dump its dict."""
    from scrapy_openclaw.testing.runcrawl import json_safe

    scenario = SCENARIOS[name]
    result = importlib.import_module(scenario.module).run(quick)
    Path(result_path).write_text(json.dumps(json_safe(result), indent=1), encoding="utf-8")
    return 0


@dataclass
class RunOutcome:
    raw: dict[str, Any] | None
    seconds: float
    error: str | None = None
    peak_rss_mb: float | None = None  # the scenario's own process (not its crawls)


def run_once(
    scenario: Scenario, quick: bool, work: Path, record_dir: Path | None, out: Path | None = None
) -> RunOutcome:
    """One ``run(quick)`` in a child process group, killed (whole group) after the scenario's limit."""
    from scrapy_openclaw.testing.servers import subprocess_env

    work.mkdir(parents=True, exist_ok=True)
    result_path = work / "result.json"
    log_path = work / "scenario.log"
    env = subprocess_env()
    if out is not None:
        env[OUT_DIR_ENV] = str(out.resolve())
    if record_dir is not None:
        record_dir.mkdir(parents=True, exist_ok=True)
        env[RECORD_DIR_ENV] = str(record_dir)
    limit = scenario.quick_limit if quick else scenario.limit
    started = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.suite", scenario.name, "quick" if quick else "full", str(result_path)],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: a timeout kills everything it started
        )
    error = None
    try:
        _, status, usage = _wait4(proc, limit)
        if status is None:
            error = f"killed after its time limit of {limit:.0f} s"
        elif status != 0:
            error = f"exited with status {status}"
    except BaseException:
        _kill_group(proc)
        raise
    finally:
        _kill_group(proc)  # whatever it left behind (servers, crawls): nothing outlives a scenario
    seconds = time.monotonic() - started
    raw = None
    if error is None:
        try:
            raw = json.loads(result_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            error = f"no readable result: {exc}"
    if error is not None:
        tail = log_path.read_text(encoding="utf-8", errors="replace")[-3000:] if log_path.exists() else ""
        error = f"{error}; output tail:\n{tail}"
    return RunOutcome(raw, round(seconds, 1), error, round(usage.ru_maxrss / 1024, 1) if usage else None)


def _wait4(proc: subprocess.Popen[bytes], timeout: float) -> tuple[int, int | None, Any]:
    """Reap ``proc`` with its own rusage; ``status`` None when it had to be killed."""
    deadline = time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return pid, proc.returncode, usage
        if time.monotonic() > deadline:
            _kill_group(proc)
            pid, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            return pid, None, usage
        time.sleep(0.2)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child's process group (it leads its own session, so that is only what it started)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if proc.returncode is None:
        try:
            _, status, _ = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
        except ChildProcessError:
            pass


# --------------------------------------------------------------------------- repeats and medians


def summarise(scenario: str, raws: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Adapt every repeat, then per table/configuration/metric: the median and the paired ratio."""
    per_run: list[list[Table]] = [adapt(scenario, raw) for raw in raws]
    if not per_run:
        return []
    out = []
    for index, table in enumerate(per_run[0]):
        runs = [tables[index] for tables in per_run if index < len(tables)]
        configs = list(dict.fromkeys(c for t in runs for c in t.rows))
        rows: dict[str, Any] = {}
        for config in configs:
            cells = {}
            for metric in table.metrics:
                values = [t.rows.get(config, {}).get(metric.key) for t in runs]
                ratios = []
                if table.baseline and metric.ratio and config != table.baseline:
                    for t, value in zip(runs, values):
                        base = t.rows.get(table.baseline, {}).get(metric.key)
                        if value is not None and base:
                            ratios.append(value / base)
                present = [v for v in values if v is not None]
                cells[metric.key] = {
                    "median": statistics.median(present) if present else None,
                    "values": values,
                    "ratio": statistics.median(ratios) if ratios else None,
                    "ratios": [round(r, 4) for r in ratios],
                }
            rows[config] = cells
        headlines = []
        for h in table.headlines:
            cell = rows.get(h.ours, {}).get(h.metric, {})
            base = rows.get(table.baseline or "", {}).get(h.metric, {})
            headlines.append(
                {
                    "metric": h.metric,
                    "ours": h.ours,
                    "target": h.target,
                    "value": cell.get("median"),
                    "ratio": cell.get("ratio"),
                    "baseline_value": base.get("median"),
                    "met": h.check(cell.get("median"), cell.get("ratio")),
                }
            )
        out.append(
            {
                "title": table.title,
                "baseline": table.baseline,
                "metrics": [asdict(m) for m in table.metrics],
                "rows": rows,
                "headlines": headlines,
            }
        )
    return out


def run_scenario(scenario: Scenario, quick: bool, repeat: int, out: Path, progress: Any = None) -> dict[str, Any]:
    """``repeat`` interleaved runs of one scenario; raw results, errors, timings and the tables."""
    runs = []
    for i in range(repeat):
        record_dir = out / "recordings" / scenario.name / f"run{i + 1}" if scenario.record else None
        if record_dir is not None and record_dir.exists():
            shutil.rmtree(record_dir)  # the recorder appends: an earlier suite run's lines must go
        with tempfile.TemporaryDirectory(prefix=f"openclaw-bench-{scenario.name}-") as tmp:
            outcome = run_once(scenario, quick, Path(tmp), record_dir, out)
        runs.append(outcome)
        if progress:
            state = "ok" if outcome.error is None else "FAILED: " + outcome.error.splitlines()[0]
            progress(f"  {scenario.name} run {i + 1}/{repeat}: {outcome.seconds:.0f} s, {state}")
    raws = [r.raw for r in runs if r.raw is not None]
    return {
        "about": scenario.about,
        "module": scenario.module,
        "repeat": repeat,
        "seconds": [r.seconds for r in runs],
        "scenario_process_peak_rss_mb": [r.peak_rss_mb for r in runs],
        "errors": [r.error for r in runs if r.error],
        "raw": raws,
        "tables": summarise(scenario.name, raws),
        "recordings": str(out / "recordings" / scenario.name) if scenario.record else None,
    }


def run_suite(names: list[str], *, quick: bool, repeat: int | None, out: Path, progress: Any = None) -> dict[str, Any]:
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise SystemExit(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    results: dict[str, Any] = {}
    started = time.monotonic()
    for name in names:
        scenario = SCENARIOS[name]
        n = repeat if repeat is not None else scenario.repeat
        if progress:
            progress(f"{name}: {scenario.about} ({n} run{'s' if n > 1 else ''}{', quick' if quick else ''})")
        results[name] = run_scenario(scenario, quick, n, out, progress)
    return {"scenarios": results, "total_seconds": round(time.monotonic() - started, 1)}


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[2] not in ("quick", "full"):
        raise SystemExit(
            "internal: python -m benchmarks.suite SCENARIO quick|full RESULT_JSON (use python -m benchmarks run)"
        )
    sys.exit(_child(sys.argv[1], sys.argv[2] == "quick", sys.argv[3]))


def run_module(run: Any) -> None:
    """``python -m benchmarks.<scenario> [--quick]``: one scenario's ``run(quick)``, printed as JSON."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    print(json.dumps(run(parser.parse_args().quick), indent=1))
