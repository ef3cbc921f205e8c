"""The sample project crawled the ways people start crawls: ``scrapy crawl`` from a subfolder of the
project, and from cron (another directory, a bare environment, ``SCRAPY_SETTINGS_MODULE`` and
``PYTHONPATH``). Every file the add-on reads or writes resolves to the project root
(:mod:`scrapy_openclaw.paths`), and nothing lands in the working directory."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from scrapy_openclaw.testing.servers import subprocess_env
from tests.projects import ROOT, copy_sample_project, run_python

pytestmark = pytest.mark.crawl

SITE = {"hosts": [{"address": "127.0.0.2", "pages": 16, "links_per_page": 3, "not_found": [4]}], "seed": 5}
QUIET = ["-s", "TELNETCONSOLE_ENABLED=False", "-s", "REMOTE_CONTROL_ENABLED=False", "-s", "LOG_LEVEL=INFO"]


def feed(items: Path) -> str:
    """The crawl's feed, in place of the project's relative one (which Scrapy writes relative to the
    working directory: its rule for feeds, not ours; ``-O`` would add to it, not replace it)."""
    return "FEEDS=" + json.dumps({str(items): {"format": "jsonlines"}})


def files(directory: Path) -> set[str]:
    return {str(p.relative_to(directory)) for p in directory.rglob("*") if "__pycache__" not in p.parts}


def crawl(cwd: Path, env: dict[str, str], *args: str) -> str:
    run = run_python("-m", "scrapy", "crawl", "demo", *args, *QUIET, cwd=cwd, env=env)
    assert run.returncode == 0 and "'finish_reason': 'finished'" in run.stderr, run.stderr[-3000:]
    assert "Traceback" not in run.stderr and "] ERROR:" not in run.stderr, run.stderr[-3000:]
    return run.stderr


def check_project_files(project: Path, before: set[str], site: Any, items: Path, log: str) -> None:
    """The crawl's items, and the add-on's files at the project root's documented places."""
    reachable = site.reachable()
    urls = [json.loads(line)["url"] for line in items.read_text(encoding="utf-8").splitlines()]
    assert len(urls) == len(set(urls)) and set(urls) == reachable.ok
    new = files(project) - before
    assert {"output/deadletters.jsonl", "openclaw-data/store.key", "openclaw-data/demo/report.json"} <= new
    assert {p.split("/")[0] for p in new} == {"output", "checkpoints", "openclaw-data"}, sorted(new)
    assert any(p.startswith("output/snapshots/") for p in new)  # the 404's error snapshot
    assert any(p.startswith("checkpoints/demo/snapshot-") for p in new)
    assert f"Checkpoint {project / 'checkpoints' / 'demo'}: final snapshot written" in log
    assert f"dead letter(s) written to {project / 'output' / 'deadletters.jsonl'}" in log


def test_a_crawl_from_a_subfolder_of_the_project_uses_the_project_root(chaos_server: Any, tmp_path: Path) -> None:
    site = chaos_server(SITE)
    project = copy_sample_project(tmp_path)
    subfolder = project / "demo_project"
    before = files(project)
    env = subprocess_env()
    env.pop("OPENCLAW_STORE_KEY", None)  # the project's generated key file, as for a user
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)])  # the project is found through scrapy.cfg
    items = tmp_path / "items.jsonl"
    log = crawl(
        subfolder,
        env,
        "-a",
        f"url={site.start_urls[0]}",
        "-s",
        feed(items),
        # relative to the project root, not to demo_project/ where the crawl runs (the failure)
        "-s",
        "OPENCLAW_POLICY_FILE=demo_project/openclaw.yaml",
        "-s",
        "OPENCLAW_CHECKPOINT_DIR=checkpoints/%(name)s",
    )
    check_project_files(project, before, site, items, log)
    assert not [p for p in files(project) - before if p.startswith("demo_project/")]


def test_a_cron_job_in_another_directory_uses_the_project_root(chaos_server: Any, tmp_path: Path) -> None:
    site = chaos_server(SITE)
    project = copy_sample_project(tmp_path)
    before = files(project)
    cron_home = tmp_path / "cron-home"
    cron_home.mkdir()
    env = {  # what cron gives a job (env -i PATH=... HOME=...), plus the two lines a crontab adds
        "PATH": os.environ["PATH"],
        "HOME": str(cron_home),
        "SCRAPY_SETTINGS_MODULE": "demo_project.settings",
        "PYTHONPATH": os.pathsep.join([str(project), str(ROOT)]),
    }
    items = tmp_path / "items.jsonl"
    log = crawl(
        cron_home,
        env,
        "-a",
        f"url={site.start_urls[0]}",
        "-s",
        feed(items),
        "-s",
        "OPENCLAW_CHECKPOINT_DIR=checkpoints/%(name)s",
    )
    check_project_files(project, before, site, items, log)
    assert files(cron_home) == set()  # nothing in the working directory (nor in the HOME it is)
