"""The one rule for every path setting (scrapy_openclaw.paths): what a relative path is relative to,
from the project, a subfolder, a foreign directory with SCRAPY_SETTINGS_MODULE (cron), outside a
project; and ``pkg://`` package data read from a directory package and from a zipped egg."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

import pytest

from scrapy_openclaw.exceptions import OpenClawConfigError
from scrapy_openclaw.paths import (
    base_dir,
    describe,
    fill,
    is_package_path,
    job_id,
    project_root,
    read_bytes,
    resolve_path,
)

S = "OPENCLAW_CHECKPOINT_DIR"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project ``proj/`` (scrapy.cfg, package ``pathsproj``), importable; no settings module set."""
    root = tmp_path / "proj"
    (root / "pathsproj" / "spiders").mkdir(parents=True)
    (root / "scrapy.cfg").write_text("[settings]\ndefault = pathsproj.settings\n", encoding="utf-8")
    (root / "pathsproj" / "__init__.py").write_text("", encoding="utf-8")
    (root / "pathsproj" / "settings.py").write_text("BOT_NAME = 'pathsproj'\n", encoding="utf-8")
    (root / "pathsproj" / "policy.yaml").write_text("defaults: {}\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delenv("SCRAPY_SETTINGS_MODULE", raising=False)
    yield root
    for name in [m for m in sys.modules if m == "pathsproj" or m.startswith("pathsproj.")]:
        del sys.modules[name]


def test_relative_paths_are_relative_to_scrapy_cfg_from_the_root_and_any_subfolder(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for cwd in (project, project / "pathsproj", project / "pathsproj" / "spiders"):
        monkeypatch.chdir(cwd)
        assert project_root() == project
        assert resolve_path("state/cp", setting=S) == project / "state" / "cp"
        assert describe("state/cp", setting=S) == f"{project / 'state' / 'cp'} (relative to the project root {project})"


def test_a_foreign_directory_finds_the_project_through_the_settings_module(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "cron-home"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert project_root() is None and base_dir() == elsewhere
    monkeypatch.setenv("SCRAPY_SETTINGS_MODULE", "pathsproj.settings")
    assert project_root() == project  # found with find_spec before the module is imported
    __import__("pathsproj.settings")
    assert project_root() == project  # and from sys.modules once it is
    assert resolve_path("out/dl.jsonl", setting=S) == project / "out" / "dl.jsonl"


def test_outside_a_project_relative_paths_are_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SCRAPY_SETTINGS_MODULE", raising=False)
    monkeypatch.chdir(tmp_path)
    assert project_root() is None
    assert resolve_path("cp", setting=S) == tmp_path / "cp"
    assert (
        describe("cp", setting=S)
        == f"{tmp_path / 'cp'} (relative to the working directory {tmp_path} (no scrapy.cfg found))"
    )
    monkeypatch.setenv("SCRAPY_SETTINGS_MODULE", "no_such_module_anywhere.settings")
    assert project_root() is None and base_dir() == tmp_path


def test_absolute_and_home_paths_are_kept_and_package_paths_are_read_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert resolve_path(tmp_path / "abs", setting=S) == tmp_path / "abs"
    assert resolve_path("~/cp", setting=S) == tmp_path / "home" / "cp"
    assert describe(str(tmp_path / "abs"), setting=S) == str(tmp_path / "abs")
    assert is_package_path("pkg://x/y.yaml") and not is_package_path("x/y.yaml")
    with pytest.raises(OpenClawConfigError, match=r"setting OPENCLAW_CHECKPOINT_DIR='pkg://x/y': .*read-only"):
        resolve_path("pkg://x/y", setting=S)


def test_files_are_read_from_paths_and_from_package_data(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(project / "pathsproj")
    data, name = read_bytes("pathsproj/policy.yaml", setting="OPENCLAW_POLICY_FILE", kind="policy file", limit=100)
    assert (data, name) == (b"defaults: {}\n", str(project / "pathsproj" / "policy.yaml"))
    data, name = read_bytes("pkg://pathsproj/policy.yaml", setting="OPENCLAW_POLICY_FILE", kind="policy file", limit=3)
    assert (data, name) == (b"defa", "pkg://pathsproj/policy.yaml")  # at most limit + 1 bytes


def test_package_data_is_read_from_a_zipped_egg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As under scrapyd: the project is an egg (a zip on sys.path), the working directory is scrapyd's."""
    egg = tmp_path / "eggproj-1.0-py3.egg"
    with zipfile.ZipFile(egg, "w") as z:
        z.writestr("eggproj/__init__.py", "")
        z.writestr("eggproj/settings.py", "BOT_NAME = 'eggproj'\n")
        z.writestr("eggproj/conf/openclaw.yaml", "domains: {}\n")
    monkeypatch.syspath_prepend(str(egg))
    monkeypatch.setenv("SCRAPY_SETTINGS_MODULE", "eggproj.settings")
    monkeypatch.chdir(tmp_path)
    try:
        data, _ = read_bytes("pkg://eggproj/conf/openclaw.yaml", setting="OPENCLAW_POLICY_FILE", kind="f", limit=99)
        assert data == b"domains: {}\n"
        assert project_root() is None and base_dir() == tmp_path  # a settings module inside a zip: no project root
        with pytest.raises(OpenClawConfigError, match=r"no file 'conf/missing\.yaml' in package 'eggproj'"):
            read_bytes("pkg://eggproj/conf/missing.yaml", setting="OPENCLAW_POLICY_FILE", kind="f", limit=99)
    finally:
        for name in [m for m in sys.modules if m == "eggproj" or m.startswith("eggproj.")]:
            del sys.modules[name]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("pkg://pathsproj", r"expected pkg://PACKAGE/FILE"),
        ("pkg://pathsproj/../scrapy.cfg", r"expected pkg://PACKAGE/FILE"),
        ("pkg://not-a-name/x.yaml", r"expected pkg://PACKAGE/FILE"),
        ("pkg://no_such_pkg_here/x.yaml", r"no package 'no_such_pkg_here' can be imported"),
        ("pkg://pathsproj/missing.yaml", r"cannot read policy file pkg://pathsproj/missing\.yaml: .*package data"),
        ("pkg://pathsproj.settings/x.yaml", r"'pathsproj\.settings' is a module, not a package"),
        (
            "missing.yaml",
            r"setting OPENCLAW_POLICY_FILE: cannot read policy file .*missing\.yaml \(relative to the project",
        ),
    ],
)
def test_unreadable_files_are_config_errors_naming_the_setting_and_the_place(
    project: Path, monkeypatch: pytest.MonkeyPatch, value: str, message: str
) -> None:
    monkeypatch.chdir(project)
    with pytest.raises(OpenClawConfigError, match=message):
        read_bytes(value, setting="OPENCLAW_POLICY_FILE", kind="policy file", limit=100)


class _Spider:
    name = "demo"

    def __init__(self, **kwargs: str):
        self.__dict__.update(kwargs)  # as scrapy.Spider keeps its arguments (scrapyd's -a _job=ID)


def test_job_and_spider_names_fill_a_path_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SCRAPY_JOB", raising=False)
    assert job_id(_Spider()) is None
    assert job_id(_Spider(_job="6487ab12")) == "6487ab12"
    monkeypatch.setenv("SCRAPY_JOB", "from-env")  # older scrapyd, other runners
    assert job_id(_Spider()) == "from-env" and job_id(_Spider(_job="arg")) == "arg"
    assert fill("cp/%(name)s/%(job)s", setting=S, name="demo", job="j-1.2") == "cp/demo/j-1.2"
    assert fill("cp/%(name)s", setting=S, name="demo", job=None) == "cp/demo"
    assert fill("plain/100%", setting=S, name="demo", job=None) == "plain/100%"  # nothing to fill: kept as it is


@pytest.mark.parametrize(
    ("value", "job", "message"),
    [
        ("cp/%(job)s", None, r"%\(job\)s needs a job id; .* -a _job=ID"),
        ("cp/%(job)s", "../../etc", r"job id '\.\./\.\./etc' cannot name a file"),
        ("cp/%(job)s", ".hidden", r"cannot name a file"),
        ("cp/%(spider)s", "j", r"only %\(name\)s and %\(job\)s may be substituted"),
    ],
)
def test_a_path_setting_refuses_what_cannot_name_a_file(value: str, job: str | None, message: str) -> None:
    with pytest.raises(OpenClawConfigError, match=rf"setting {S}="):
        fill(value, setting=S, name="demo", job=job)
    with pytest.raises(OpenClawConfigError, match=message):
        fill(value, setting=S, name="demo", job=job)


def test_two_jobs_of_one_spider_get_their_own_checkpoint_directory(tmp_path: Path) -> None:
    """As scrapyd runs them: the job id (the ``_job`` spider argument) names each one's directory; one
    directory for both refuses the second with the setting to change."""
    from scrapy import Spider
    from scrapy.utils.misc import build_from_crawler
    from scrapy.utils.test import get_crawler

    from scrapy_openclaw.checkpoint import CheckpointExtension

    class JobSpider(Spider):
        name = "jobs"

    def extension(setting: str, job: str) -> CheckpointExtension:
        crawler = get_crawler(JobSpider, {"OPENCLAW_CHECKPOINT_DIR": setting})
        crawler.spider = JobSpider.from_crawler(crawler, _job=job)
        return build_from_crawler(CheckpointExtension, crawler)

    first = extension(str(tmp_path / "cp" / "%(name)s-%(job)s"), "a1")
    second = extension(str(tmp_path / "cp" / "%(name)s-%(job)s"), "b2")
    try:
        assert (first.dir, second.dir) == (tmp_path / "cp" / "jobs-a1", tmp_path / "cp" / "jobs-b2")
        shared = extension(str(tmp_path / "shared"), "a1")
        try:
            with pytest.raises(
                OpenClawConfigError, match=r"another running crawl .*name the job in the setting: %\(job\)s"
            ):
                extension(str(tmp_path / "shared"), "b2")
        finally:
            shared.writer.journal.close()
    finally:
        first.writer.journal.close()
        second.writer.journal.close()
