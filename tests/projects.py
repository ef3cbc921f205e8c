"""Scrapy projects on disk and the commands run in them, for the tests that start ``scrapy``.

A test that runs a project copies the checkout's sample project (or writes one) and runs a
command in it as a child process with this checkout on its path; the helpers here are the
one way to do both.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from scrapy_openclaw.testing.servers import subprocess_env

ROOT = Path(__file__).resolve().parents[1]


def copy_sample_project(tmp_path: Path) -> Path:
    """A fresh copy of the checkout's ``sample_project`` (no caches, no earlier output)."""
    project = tmp_path / "sample_project"
    shutil.copytree(ROOT / "sample_project", project, ignore=shutil.ignore_patterns("__pycache__", "output"))
    return project


def run_python(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` in *cwd* with this checkout importable; output captured, never raises."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=env if env is not None else subprocess_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
