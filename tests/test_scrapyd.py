"""The sample project under a real scrapyd: deployed as an egg by ``scrapyd-deploy``, two jobs at once.

scrapyd runs each job as ``python -m scrapyd.runner crawl SPIDER -a _job=ID`` from its own working
directory, with the project activated from the egg: no ``scrapy.cfg`` and no project directory, so
the policy file travels as package data (``pkg://demo_project/openclaw.yaml``) and the add-on's
relative paths resolve against scrapyd's working directory. Both jobs crawl a test-owned chaos site
(one host each) and are checked against the site's record: items, dead letters, per-job checkpoint
directories (``%(job)s``), clean logs, and nothing written anywhere else.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from scrapy.settings import Settings

from scrapy_openclaw.dlq import JsonlStore
from scrapy_openclaw.serialization import signing
from scrapy_openclaw.settings import OpenClawSettings
from scrapy_openclaw.testing.servers import free_port, stop_process, subprocess_env
from tests.projects import ROOT, copy_sample_project, run_python

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.crawl

PROJECT = "demo_project"
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
SITE = {
    "hosts": [
        {"address": "127.0.0.2", "pages": 24, "links_per_page": 3, "not_found": [5]},
        {"address": "127.0.0.3", "pages": 24, "links_per_page": 3, "not_found": [7, 11]},
    ],
    "seed": 31,
}


class Scrapyd:
    """``scrapyd`` on a free loopback port, every directory of it in *home* (its working directory)."""

    def __init__(self, home: Path, dirs: Path):
        self.home, self.dirs = home, dirs
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Scrapyd:
        self.home.mkdir(parents=True)
        (self.home / "scrapyd.conf").write_text(
            "[scrapyd]\n"
            f"bind_address = 127.0.0.1\nhttp_port = {self.port}\n"
            f"eggs_dir = {self.dirs / 'eggs'}\nlogs_dir = {self.dirs / 'logs'}\n"
            f"items_dir = {self.dirs / 'items'}\ndbs_dir = {self.dirs / 'dbs'}\n"
            "max_proc = 2\npoll_interval = 0.2\n",
            encoding="utf-8",
        )
        env = subprocess_env()
        env["HOME"] = str(self.home)  # (no ~/.scrapyd.conf of the machine's user)
        # as in a deployment: the store key is the project's generated key file, not the test session's
        env.pop("OPENCLAW_STORE_KEY", None)
        # the add-on from this checkout, and not the project from the repository: only the egg
        env["PYTHONPATH"] = str(ROOT)
        with open(self.dirs / "scrapyd.out", "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "scrapyd", "--pidfile=", "--logfile=-"],
                cwd=self.home,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        for _ in range(300):  # bounded: 30 s
            if self.proc.poll() is not None:
                raise RuntimeError(f"scrapyd exited: {self.output()}")
            try:
                if self.get("daemonstatus.json")["status"] == "ok":
                    return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"scrapyd did not answer on {self.url}: {self.output()}")

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None

    def output(self) -> str:
        return (self.dirs / "scrapyd.out").read_text(encoding="utf-8", errors="replace")[-4000:]

    def get(self, endpoint: str, **params: str) -> dict[str, Any]:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with _OPENER.open(self.url + endpoint + query, timeout=10) as response:
            return json.loads(response.read())

    def post(self, endpoint: str, fields: list[tuple[str, str]]) -> dict[str, Any]:
        body = urllib.parse.urlencode(fields).encode()
        with _OPENER.open(urllib.request.Request(self.url + endpoint, data=body), timeout=30) as response:
            return json.loads(response.read())


@pytest.fixture
def scrapyd(tmp_path: Path) -> Iterator[Scrapyd]:
    (tmp_path / "scrapyd-dirs").mkdir()
    server = Scrapyd(tmp_path / "scrapyd-home", tmp_path / "scrapyd-dirs")
    try:
        yield server.start()
    finally:
        server.stop()


def deploy(scrapyd: Scrapyd, tmp_path: Path) -> Path:
    """``scrapyd-deploy`` from a copy of the sample project (its setup.py builds the egg)."""
    project = copy_sample_project(tmp_path)
    with open(project / "scrapy.cfg", "a", encoding="utf-8") as cfg:
        cfg.write(f"\n[deploy]\nurl = {scrapyd.url}\nproject = {PROJECT}\n")
    env = subprocess_env()
    env["PYTHONPATH"] = str(ROOT)
    run = run_python("-c", "from scrapyd_client.deploy import main; main()", "--version", "1", cwd=project, env=env)
    assert run.returncode == 0 and '"status": "ok"' in run.stdout, run.stdout[-2000:] + run.stderr[-2000:]
    return project


def wait_finished(scrapyd: Scrapyd, jobs: list[str], timeout: float = 90.0) -> dict[str, Any]:
    """Poll ``listjobs.json`` (bounded) until every job is finished; the finished entries by id."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listed = scrapyd.get("listjobs.json", project=PROJECT)
        finished = {job["id"]: job for job in listed["finished"]}
        if set(jobs) <= set(finished):
            return finished
        time.sleep(0.3)
    raise AssertionError(f"jobs not finished within {timeout:.0f} s: {listed}\n{scrapyd.output()}")


def read_dead_letters(path: Path, data: Path) -> list[Any]:
    """The records of a dead-letter file, checked with the key the jobs generated (not the session's)."""
    saved = signing._spec, signing._key
    try:
        key = (data / "store.key").read_text(encoding="ascii").strip()
        OpenClawSettings.from_settings(Settings({"OPENCLAW_STORE_KEY": key}))
        store = JsonlStore(path)
        records = list(store.iter())
        assert not store.skipped
        return records
    finally:
        signing._spec, signing._key = saved


def snapshot(directory: Path) -> set[str]:
    return {str(p.relative_to(directory)) for p in directory.rglob("*")}


def test_two_concurrent_scrapyd_jobs_of_the_sample_project(scrapyd: Scrapyd, chaos_server: Any, tmp_path: Path) -> None:
    site = chaos_server(SITE)
    repo_files = snapshot(ROOT / "sample_project")
    project = deploy(scrapyd, tmp_path)
    source_files = snapshot(project)
    assert [p.name for p in (scrapyd.dirs / "eggs" / PROJECT).iterdir()] == ["1.egg"]
    home_before = snapshot(scrapyd.home)

    jobs = {}
    for address in ("127.0.0.2", "127.0.0.3"):
        job = uuid.uuid4().hex
        answer = scrapyd.post(
            "schedule.json",
            [
                ("project", PROJECT),
                ("spider", "demo"),
                ("jobid", job),
                ("url", site.urls[address]),
                ("setting", "OPENCLAW_CHECKPOINT_DIR=checkpoints/%(job)s"),
                ("setting", "OPENCLAW_REPORT_PATH=reports/%(name)s-%(job)s.json"),
                ("setting", "TELNETCONSOLE_ENABLED=False"),
                ("setting", "REMOTE_CONTROL_ENABLED=False"),
            ],
        )
        assert answer["status"] == "ok", answer
        jobs[job] = address
    # a policy file named by a plain path: beside scrapy.cfg, which a scrapyd job has not got
    unpacked = scrapyd.post(
        "schedule.json",
        [("project", PROJECT), ("spider", "demo"), ("setting", "OPENCLAW_POLICY_FILE=demo_project/openclaw.yaml")],
    )["jobid"]
    finished = wait_finished(scrapyd, [*jobs, unpacked])
    refused = (scrapyd.dirs / "logs" / PROJECT / "demo" / f"{unpacked}.log").read_text(encoding="utf-8")
    assert (
        "ERROR: Crawl not started: setting OPENCLAW_POLICY_FILE: cannot read policy file "
        f"{scrapyd.home / 'demo_project' / 'openclaw.yaml'} (relative to the working directory {scrapyd.home} "
        "(no scrapy.cfg found))" in refused
    ), refused[-3000:]

    # the two ran at once: each started before the other finished
    (a, b) = (finished[j] for j in jobs)
    assert a["start_time"] < b["end_time"] and b["start_time"] < a["end_time"], (a, b)

    truth = site.truth()
    records = read_dead_letters(scrapyd.home / "output" / "deadletters.jsonl", scrapyd.home / "openclaw-data")
    for job, address in jobs.items():
        log = (scrapyd.dirs / "logs" / PROJECT / "demo" / f"{job}.log").read_text(encoding="utf-8")
        assert "Traceback" not in log and "] ERROR:" not in log, log[-3000:]
        assert "'finish_reason': 'finished'" in log, log[-3000:]
        # items: every page the host served with 200, once (the feed scrapyd gives the job)
        served = {
            site.urls[address].rstrip("/") + r["path"]
            for r in truth["hosts"][address]["requests"]
            if r["status"] == 200
        }
        reachable = site.reachable([site.urls[address]])
        items = [
            json.loads(line)
            for line in (scrapyd.dirs / "items" / PROJECT / "demo" / f"{job}.jl").read_text().splitlines()
        ]
        urls = [item["url"] for item in items]
        assert len(urls) == len(set(urls)) and set(urls) == reachable.ok
        assert set(urls) <= served | {site.urls[address]}
        # dead letters: the host's 404 pages, in the one store of the spider, both jobs' intact
        mine = {r.url for r in records if urllib.parse.urlsplit(r.url).hostname == address}
        assert mine == set(reachable.failing) and reachable.failing
        # the checkpoint: a directory per job, where the setting says (relative: scrapyd's directory)
        checkpoint = scrapyd.home / "checkpoints" / job
        assert checkpoint.is_dir() and any(checkpoint.iterdir()), snapshot(scrapyd.home)
        assert f"Checkpoint {checkpoint}: final snapshot written (finished, 0 requests pending)" in log
        # the politeness report: one per job too
        report = json.loads((scrapyd.home / "reports" / f"demo-{job}.json").read_text(encoding="utf-8"))
        assert set(report["domains"]) == {address}

    # nothing beside the documented files in scrapyd's directory, nothing in the project or the egg store
    written = snapshot(scrapyd.home) - home_before
    documented = {"output", "checkpoints", "reports", "openclaw-data"}
    assert {p.split("/")[0] for p in written} == documented, sorted(written)
    assert {p.split("/")[1] for p in written if p.startswith("checkpoints/")} == set(jobs)
    # the store key and the site memory (one per project, shared by its jobs: written atomically)
    assert {p for p in written if p.startswith("openclaw-data")} == {
        "openclaw-data",
        "openclaw-data/store.key",
        "openclaw-data/sites.json",
    }
    assert snapshot(project) == source_files
    assert [p.name for p in (scrapyd.dirs / "eggs" / PROJECT).iterdir()] == ["1.egg"]
    assert snapshot(ROOT / "sample_project") == repo_files


GENERATE_KEY = """
import os, sys, time
slow = float(sys.argv[1])
import secrets
if slow:  # this crawl stalls while it makes its new key (a busy machine): the file is being written
    real_token_hex = secrets.token_hex
    secrets.token_hex = lambda n: (time.sleep(slow), real_token_hex(n))[1]
from scrapy_openclaw.serialization import signing
try:
    print(signing.resolve().secret.decode())
except Exception as exc:
    print(f"{type(exc).__name__}: {exc}")
"""


def test_two_jobs_starting_at_once_agree_on_the_generated_store_key(tmp_path: Path) -> None:
    """The first crawl in scrapyd's directory generates ``openclaw-data/store.key``; another job
    starting while it writes the file must read the same key, never a half-written file."""
    env = subprocess_env()
    env.pop("OPENCLAW_STORE_KEY", None)
    env["HOME"] = str(tmp_path)
    env.pop("SCRAPY_SETTINGS_MODULE", None)

    def start(slow: float) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-c", GENERATE_KEY, str(slow)],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    first = start(3.0)
    key_dir = tmp_path / "openclaw-data"
    for _ in range(200):  # bounded: until the first one is inside its write (its file or temp file exists)
        if key_dir.is_dir() and any(key_dir.iterdir()):
            break
        time.sleep(0.05)
    second = start(0.0)
    answers = [p.communicate(timeout=60)[0].strip() for p in (second, first)]
    assert answers[0] == answers[1] and len(answers[0]) == 64, answers
    assert (key_dir / "store.key").read_text(encoding="ascii").strip() == answers[0]
    assert [p.name for p in key_dir.iterdir()] == ["store.key"]  # no temporary file left behind
