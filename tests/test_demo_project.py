"""The sample project's demo, run twice as a newcomer would: its close summary shows the log
table's figures, and each run's dead-letter count is the file's letters of that run."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from scrapy_openclaw.testing.servers import subprocess_env

SAMPLE = Path(__file__).resolve().parents[1] / "sample_project"
ROW = re.compile(r"^(127\.0\.0\.\d)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+\S+\s+\w+$")
DEAD = re.compile(r"^dead letters: (\d+) from this crawl \(crawl id (\w+)\) in (.+)$", re.M)
TABLE = ("domain", "pages/min", "health", "rate/s", "retries", "circuit", "held", "done", "pending", "failed", "dead")


def demo(project: Path, port: int) -> str:
    env = subprocess_env()
    env["PYTHONPATH"] = f"{project}:{env['PYTHONPATH']}"
    proc = subprocess.run(
        [sys.executable, "-m", "scrapy", "crawl", "demo", "-a", f"port={port}"],
        cwd=project,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def close_table(log: str) -> dict[str, dict[str, int]]:
    lines = log[log.index(", whole crawl):") :].splitlines()[2:]
    rows = {}
    for line in lines:
        cells = line.split()
        if not cells or not cells[0].startswith("127."):
            break
        rows[cells[0]] = {
            name: int(cells[i]) for i, name in enumerate(TABLE) if name in ("retries", "done", "failed", "dead")
        }
    return rows


def test_demo_summary_reads_the_figures_and_counts_this_runs_letters(tmp_path: Path) -> None:
    project = tmp_path / "sample"
    shutil.copytree(SAMPLE, project, ignore=shutil.ignore_patterns("output", "openclaw-data", "__pycache__"))
    with socket.socket() as s:
        s.bind(("127.0.0.2", 0))
        port = s.getsockname()[1]
    letters_before = 0
    for run in range(2):
        log = demo(project, port)
        summary = log[log.index("scrapy-openclaw demo finished") :]
        matches = [ROW.match(line) for line in summary.splitlines()]
        rows = {m.group(1): m.groups()[1:] for m in matches if m}
        table = close_table(log)
        assert set(rows) == set(table) == {"127.0.0.2", "127.0.0.3", "127.0.0.4"}
        for domain, (done, _requests, retries, failed, dead) in rows.items():
            assert (int(done), int(retries), int(failed), int(dead)) == tuple(
                table[domain][k] for k in ("done", "retries", "failed", "dead")
            ), (domain, summary)
        count, crawl, path = DEAD.search(summary).groups()  # type: ignore[union-attr]
        assert int(count) == sum(table[d]["dead"] for d in table)
        letters = [json.loads(line) for line in Path(path).read_text().splitlines()]
        assert sum(1 for letter in letters if letter["crawl_id"] == crawl) == int(count)
        assert f"{count} dead letter(s) written" in log
        earlier = len(letters) - int(count)
        assert earlier == letters_before
        assert (f"and {earlier} from earlier runs" in summary) == bool(earlier), summary
        assert "cannot be replayed" not in summary  # served on the port asked for: replayable
        letters_before = len(letters)
