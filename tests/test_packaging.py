"""What the released archives hold: ``python -m build`` (sdist, then the wheel built from that sdist)
into a temporary directory, and the contents checked file by file.

The build runs on a copy of the checkout's files (tracked and new, not
ignored): setuptools writes ``scrapy_openclaw.egg-info`` into the tree it
builds, and a stale ``SOURCES.txt`` there would bring files into the sdist
that the configuration no longer names. ``.ci/package-smoke`` goes on from
here: it installs the wheel into a fresh virtual environment and runs crawls
from it; this test is the part that needs no install: files and metadata.
"""

from __future__ import annotations

import email.parser
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest

from scrapy_openclaw.testing.servers import subprocess_env

pytestmark = pytest.mark.crawl  # a build in an isolated environment: ~20-40 s

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "scrapy_openclaw"


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("dist")
    source = tmp_path_factory.mktemp("source")
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():  # (a file deleted but not yet staged is still listed)
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    run = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(source)],
        env=subprocess_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (wheel,) = out.glob("*.whl")
    (sdist,) = out.glob("*.tar.gz")
    with zipfile.ZipFile(wheel) as z:
        wheel_names = z.namelist()
        metadata = next(n for n in wheel_names if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(z.read(metadata).decode())
    with tarfile.open(sdist) as t:
        top = t.getnames()[0].split("/")[0]
        sdist_names = [n.removeprefix(top + "/") for n in t.getnames() if n != top]
    return {"wheel": wheel_names, "sdist": sdist_names, "meta": meta, "log": run.stdout + run.stderr}


def package_files(pattern: str) -> list[str]:
    """The repository's files under the package matching *pattern*, as paths inside an archive."""
    found = sorted(str(p.relative_to(ROOT)) for p in PACKAGE.glob(pattern) if "__pycache__" not in p.parts)
    assert found, f"no {pattern} in the package: the test looks in the wrong place"
    return found


def test_the_wheel_carries_the_package_data_and_nothing_else(dist: dict[str, Any]) -> None:
    wheel = set(dist["wheel"])
    data = package_files("**/*.lua") + package_files("dashboards/*.json") + package_files("dashboards/*.yml")
    assert not [f for f in data if f not in wheel]
    assert "scrapy_openclaw/py.typed" in wheel
    assert not [f for f in package_files("**/*.py") if f not in wheel]
    tops = {n.split("/")[0] for n in wheel if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"scrapy_openclaw"}  # no tests, benchmarks or sample project beside it
    assert [n for n in wheel if n.endswith(".dist-info/licenses/LICENSE")]


def test_the_wheel_metadata_names_licence_urls_and_pythons(dist: dict[str, Any]) -> None:
    meta = dist["meta"]
    assert meta["License-Expression"] == "BSD-3-Clause"
    assert meta.get_all("License-File") == ["LICENSE"]
    assert meta["Requires-Python"] == ">=3.10"
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or [])
    assert {"Homepage", "Documentation", "Source", "Issues"} <= set(urls)
    assert "Programming Language :: Python :: 3.10" in (meta.get_all("Classifier") or [])
    assert "Framework :: Scrapy" in (meta.get_all("Classifier") or [])
    assert meta["Author"] or meta["Author-email"]
    # (a licence given as a TOML table, or licence classifiers beside the SPDX string, would warn)
    assert "SetuptoolsDeprecationWarning" not in dist["log"], dist["log"][-3000:]


def test_the_sdist_ships_the_sources_without_tests_it_cannot_run(dist: dict[str, Any]) -> None:
    sdist = set(dist["sdist"])
    assert {"LICENSE", "README.md", "pyproject.toml", "MANIFEST.in"} <= sdist
    data = package_files("**/*.lua") + package_files("dashboards/*.json") + package_files("dashboards/*.yml")
    assert not [f for f in data + package_files("**/*.py") if f not in sdist]
    # The tests need tests/conftest.py, their helpers and benchmarks/: the sdist ships none of them
    assert not [n for n in sdist if n.split("/")[0] in ("tests", "benchmarks", "sample_project", "docs", ".ci")]
