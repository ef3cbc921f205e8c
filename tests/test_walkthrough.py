"""docs/walkthrough.md runs as written: its script (included into the page piece by piece) is run
in an empty folder with real processes: the practice site, startproject, a crawl, /metrics, replay."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from scrapy_openclaw.testing.servers import subprocess_env

DOCS = Path(__file__).resolve().parents[1] / "docs"
SCRIPT = DOCS / "examples" / "walkthrough" / "walkthrough.sh"


def free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


def test_the_walkthrough_runs_as_written(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"  # `python` and `scrapy` of this environment, as a user's shell has them
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    (bin_dir / "scrapy").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m scrapy "$@"\n')
    (bin_dir / "scrapy").chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    env = subprocess_env()
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PRACTICE_PORT"] = str(free_port("127.0.0.2"))
    env["METRICS_PORT"] = str(free_port("127.0.0.1"))
    proc = subprocess.run(["bash", str(SCRIPT)], cwd=work, env=env, capture_output=True, text=True, timeout=500)
    out = proc.stdout
    (tmp_path / "walkthrough.out").write_text(out)
    assert proc.returncode == 0, (out[-3000:], proc.stderr[-3000:])
    assert "Practice site running" in out
    assert 'ADDONS = {"scrapy_openclaw.Addon": 100}' in out
    assert "scrapy_openclaw_downloader_requests_total{" in out
    assert "OpenClaw domains (top 3 of 3, whole crawl)" in out
    assert "replayed" in out and "1 recovered" in out, out[-3000:]
    recovered = [json.loads(line) for line in (work / "shop" / "recovered.jsonl").read_text().splitlines()]
    # the recovered page, and the pages its links led to (the replay runs the spider's callback)
    assert recovered[0]["url"].endswith("/page/11"), recovered[:3]
    crawled = (work / "shop" / "items.jsonl").read_text().splitlines()
    assert len(crawled) >= 80  # the three hosts' pages, the ones that failed for good aside


def test_the_page_includes_every_step_of_the_script() -> None:
    page = (DOCS / "walkthrough.md").read_text(encoding="utf-8")
    steps = [line[3:-1] for line in SCRIPT.read_text().splitlines() if line.startswith("# [") and "/" not in line]
    assert steps, "no steps marked in the script"
    for step in steps:
        assert f':start-after: "# [{step}]"' in page, step
    assert "examples/walkthrough/pages.py" in page
