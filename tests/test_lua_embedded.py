"""The embedded copy of the Redis scripts (used when the .lua files did not travel, e.g. a
vendored egg) must match the .lua files: a change to one without regenerating fails here."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import scrapy_openclaw
import scrapy_openclaw.distributed.lua as lua


def test_the_embedded_scripts_match_the_lua_files() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "scrapy_openclaw.distributed.lua", "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


VENDORED = """
import sys
sys.path.insert(0, sys.argv[1])
import scrapy_openclaw.distributed.lua as lua
assert lua.__file__.startswith(sys.argv[1]), lua.__file__
from importlib import resources
assert not resources.files(lua.__name__).joinpath("pop.lua").is_file()  # the egg has no .lua files
import hashlib
print(hashlib.sha256("".join(v for k, v in sorted(vars(lua).items()) if k.isupper()).encode()).hexdigest())
"""


def test_an_egg_without_the_lua_files_runs_the_same_scripts(tmp_path: Path) -> None:
    """The add-on vendored into a project's egg by a setup.py that lists no package data (scrapyd-deploy's
    generated one): a zip of its Python files alone. The scripts come from the embedded copy, unchanged."""
    import scrapy_openclaw.distributed.lua as lua

    package = Path(scrapy_openclaw.__file__).parent
    egg = tmp_path / "project-1.0-py3.egg"
    with zipfile.ZipFile(egg, "w") as z:
        for path in package.rglob("*.py"):
            if "__pycache__" not in path.parts:
                z.write(path, Path("scrapy_openclaw") / path.relative_to(package))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-c", VENDORED, str(egg)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    scripts = "".join(v for k, v in sorted(vars(lua).items()) if k.isupper())
    assert result.stdout.strip() == hashlib.sha256(scripts.encode()).hexdigest()


def test_every_constant_the_scripts_read_is_sent_from_the_tuning_table() -> None:
    """The Lua port reads ``p.k_name``; each is a ``_NAME`` of tuning.py (one declaration, written
    into the health prelude's ``K``), or one of the two the Redis registry's policy JSON adds (the
    poll interval and the record's TTL)."""
    import re

    from scrapy_openclaw.health.registry import tuning

    lua_dir = Path(scrapy_openclaw.__file__).parent / "distributed" / "lua"
    read = {name for path in lua_dir.glob("*.lua") for name in re.findall(r"\bp\.(k_[a-z_]+)", path.read_text())}
    assert len(read) > 30
    assert read - set(tuning.lua_constants()) == {"k_retry_poll", "k_key_ttl"}
    assert tuning.lua_constants()["k_probe_growth"] == tuning._PROBE_GROWTH
    assert f"k_probe_growth = {tuning._PROBE_GROWTH!r}" in lua.HEALTH.split("\n", 1)[0]
