"""A configuration error a user can fix: ``scrapy crawl`` prints one line and exits 1, no traceback.

Real ``scrapy crawl`` / ``runspider`` processes in a fresh ``startproject``
project, on the Scrapy this Python has (CI runs the file on the newest and on
the lowest supported Scrapy).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.first_hour_project import SPIDER, add_settings, scrapy, start_project

#: The whole output of ``scrapy crawl -L ERROR`` with a bad setting: this one line.
ONE_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[scrapy_openclaw\.startup\] ERROR: Crawl not started: (.+)$")


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return start_project(tmp_path_factory.mktemp("first-hour"))


def refused(run_args: tuple[str, ...], cwd: Path) -> str:
    """Run scrapy at ERROR level; assert exit status 1 and a one-line output; return the message."""
    run = scrapy(cwd, *run_args, "-L", "ERROR")
    assert run.returncode == 1, run.output
    assert len(run.lines) == 1, run.output
    match = ONE_LINE.match(run.lines[0])
    assert match, run.output
    return match.group(1)


def test_unknown_setting_in_settings_py(tmp_path: Path) -> None:
    root = start_project(tmp_path)
    add_settings(root, 'OPENCLAW_CHECKPIONT_DIR = "checkpoint"')
    message = refused(("crawl", "plain"), root)
    assert message == (
        "setting OPENCLAW_CHECKPIONT_DIR: unknown scrapy-openclaw setting (did you mean OPENCLAW_CHECKPOINT_DIR?)"
    )


def test_default_log_level_has_one_error_line_and_no_traceback(project: Path) -> None:
    run = scrapy(project, "crawl", "plain", "-s", "OPENCLAW_METRICS_PORT=70000")
    assert run.returncode == 1, run.output
    assert "Traceback" not in run.output and "never retrieved" not in run.output, run.output
    errors = [line for line in run.lines if " ERROR: " in line or " CRITICAL: " in line]
    assert len(errors) == 1, run.output
    assert errors[0].endswith("Crawl not started: setting OPENCLAW_METRICS_PORT: 70000 is out of range [0, 65535]")
    assert "Spider opened" not in run.output


def test_policy_key_typo_suggests_the_key(project: Path) -> None:
    policy = project / "typo.yaml"
    policy.write_text("defaults:\n  health:\n    brust: 4\n", encoding="utf-8")
    message = refused(("crawl", "plain", "-s", "OPENCLAW_POLICY_FILE=typo.yaml"), project)
    assert message == f"{policy}, line 3: key defaults.health.brust: unknown key (did you mean burst?)"


def test_missing_policy_file_shows_the_absolute_path(project: Path) -> None:
    message = refused(("crawl", "plain", "-s", "OPENCLAW_POLICY_FILE=missing.yaml"), project)
    assert message == (
        f"setting OPENCLAW_POLICY_FILE: cannot read policy file {project / 'missing.yaml'} "
        f"(relative to the project root {project}): No such file or directory"
    )


def test_checkpoint_dir_under_a_file(project: Path) -> None:
    (project / "afile").write_text("", encoding="utf-8")
    message = refused(("crawl", "plain", "-s", "OPENCLAW_CHECKPOINT_DIR=afile/checkpoint"), project)
    assert message == (
        f"setting OPENCLAW_CHECKPOINT_DIR: cannot use {project / 'afile' / 'checkpoint'} as "
        "the checkpoint directory (Not a directory): point it at a directory this user can create and write"
    )


def test_checkpoint_dir_not_permitted(project: Path, tmp_path: Path) -> None:
    if os.geteuid() == 0:  # root may write anywhere on disk; sysfs still refuses a new directory
        if not Path("/sys/kernel").is_dir():
            pytest.skip("needs /sys (running as root)")
        target = "/sys/openclaw-first-hour"
        reason = "Operation not permitted"
    else:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        target = str(locked / "checkpoint")
        reason = "Permission denied"
    message = refused(("crawl", "plain", "-s", f"OPENCLAW_CHECKPOINT_DIR={target}"), project)
    assert message == (
        f"setting OPENCLAW_CHECKPOINT_DIR: cannot use {target} as the checkpoint directory "
        f"({reason}): point it at a directory this user can create and write"
    )


def test_component_enabled_by_class_path_without_the_addon(tmp_path: Path) -> None:
    root = start_project(tmp_path, addon=False)
    add_settings(
        root,
        'EXTENSIONS = {"scrapy_openclaw.checkpoint.CheckpointExtension": 10}\nOPENCLAW_CHECKPOINT_DIR = 5',
    )
    message = refused(("crawl", "plain"), root)
    assert message == "setting OPENCLAW_CHECKPOINT_DIR: expected a string, got 5"


def test_runspider_outside_a_project(tmp_path: Path) -> None:
    (tmp_path / "plain.py").write_text(SPIDER, encoding="utf-8")
    args = ("runspider", "plain.py", "-s", 'ADDONS={"scrapy_openclaw.Addon": 100}', "-s", "OPENCLAW_DLQ_URII=x")
    message = refused(args, tmp_path)
    assert message == "setting OPENCLAW_DLQ_URII: unknown scrapy-openclaw setting (did you mean OPENCLAW_DLQ_URI?)"
