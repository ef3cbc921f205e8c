"""One place to look (issue 22): a spider's dead letters from a plain crawl, a
checkpointed crawl and a scheduled run land in one default store, listed by
one ``scrapy openclaw-dlq list SPIDER``; ``openclaw-checkpoint inspect`` names
the spider of a crawl killed before its first snapshot."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from scrapy_openclaw.dlq import JsonlStore
from scrapy_openclaw.schedule.history import JsonlHistory
from scrapy_openclaw.testing.servers import stop_process, subprocess_env
from tests.test_dlq_crawl import require_cli
from tests.test_schedule_run import SchedulerProcess, successes, wait_for, write_tasks


def make_project(root: Path) -> Path:
    """A project with nothing but the add-on line: no OPENCLAW_DLQ_URI."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "scrapy.cfg").write_text("[settings]\ndefault = whereproj_settings\n", encoding="utf-8")
    (root / "whereproj_settings.py").write_text(
        textwrap.dedent("""
        BOT_NAME = "whereproj"
        SPIDER_MODULES = ["scrapy_openclaw.testing.spiders"]
        ADDONS = {"scrapy_openclaw.Addon": 100}
        TELNETCONSOLE_ENABLED = False
        LOG_LEVEL = "INFO"
        OPENCLAW_CHECKPOINT_FLUSH = 0.2
        OPENCLAW_CHECKPOINT_SNAPSHOT_INTERVAL = 1.0
    """),
        encoding="utf-8",
    )
    return root


def scrapy(cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "scrapy", *args],
        cwd=cwd,
        env={**subprocess_env(), "PYTHONPATH": str(cwd)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_plain_checkpointed_and_scheduled_dead_letters_are_listed_together(chaos_server: Any, tmp_path: Path) -> None:
    require_cli()
    hosts = [{"address": f"127.0.0.{n}", "pages": 3, "links_per_page": "all", "not_found": [2]} for n in (2, 3, 4)]
    server = chaos_server({"hosts": hosts})
    plain, checkpointed, scheduled = (server.urls[f"127.0.0.{n}"] for n in (2, 3, 4))
    project = make_project(tmp_path / "proj")
    (project / "sub").mkdir()

    first = scrapy(project, "crawl", "chaos", "-a", f"start_urls={plain}")
    assert first.returncode == 0, first.stderr[-3000:]
    # a checkpointed crawl, started from another directory of the project
    second = scrapy(
        project / "sub",
        "crawl",
        "chaos",
        "-a",
        f"start_urls={checkpointed}",
        "-s",
        f"OPENCLAW_CHECKPOINT_DIR={tmp_path / 'ckpt'}",
    )
    assert second.returncode == 0, second.stderr[-3000:]
    tasks = write_tasks(
        project / "tasks.yaml",
        f"""
        tasks:
          every3:
            spider: chaos
            interval: 3
            args: {{start_urls: "{scheduled}"}}
    """,
    )
    history = JsonlHistory(project / "openclaw-schedule" / "history.jsonl")
    sched = SchedulerProcess(project, tasks)
    try:
        wait_for(lambda: successes(history.runs(), "every3"), 90, "a scheduled run", lambda: sched.log)
    finally:
        assert sched.stop() == 0

    store_path = project / "openclaw-data" / "chaos" / "deadletters.jsonl"
    urls = {r.url for r in JsonlStore(store_path).iter()}
    assert {f"{plain}page/2", f"{checkpointed}page/2", f"{scheduled}page/2"} <= urls
    listed = scrapy(project, "openclaw-dlq", "list", "chaos")
    assert listed.returncode == 0, listed.stderr[-3000:]
    for base in (plain, checkpointed, scheduled):
        assert f"{base}page/2" in listed.stdout
    assert f"dead letter(s) in {store_path}" in listed.stdout  # the real path, no template
    assert "%(name)s" not in listed.stdout + listed.stderr
    assert "Scrapy" not in listed.stdout + listed.stderr  # no start banner
    every = scrapy(project / "sub", "openclaw-dlq", "list")  # all spiders, from anywhere in the project
    assert every.returncode == 0 and f"in {store_path}" in every.stdout, every.stderr[-3000:]
    assert "%(name)s" not in every.stdout
    bad = scrapy(project, "openclaw-dlq", "list", "chaos", "extra")
    assert bad.returncode != 0


def test_inspect_names_the_spider_after_a_crash(chaos_server: Any, tmp_path: Path) -> None:
    require_cli()
    server = chaos_server({"hosts": [{"address": "127.0.0.2", "pages": 400, "links_per_page": 3, "latency": 0.2}]})
    project = make_project(tmp_path / "proj")
    ckpt = tmp_path / "ckpt"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "scrapy",
            "crawl",
            "chaos",
            "-a",
            f"start_urls={server.urls['127.0.0.2']}",
            "-s",
            f"OPENCLAW_CHECKPOINT_DIR={ckpt}",
            "-s",
            "OPENCLAW_CHECKPOINT_SNAPSHOT_INTERVAL=600",
        ],
        cwd=project,
        env=subprocess_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(
            lambda: (
                any(ckpt.glob("journal-*")) and sum(len(r["requests"]) for r in server.truth()["hosts"].values()) >= 5
            ),
            60,
            "a crawl under way",
        )
    finally:
        proc.kill()  # SIGKILL: no snapshot, no clean close
        stop_process(proc, timeout=10)
    out = scrapy(project, "openclaw-checkpoint", "inspect", str(ckpt), "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    info = json.loads(out.stdout)
    assert info["spider"] == "chaos" and not info["finished"]
    assert "Scrapy" not in out.stderr
