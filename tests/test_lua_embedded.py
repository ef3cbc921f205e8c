"""The embedded copy of the Redis scripts (used when the .lua files did not travel, e.g. a
vendored egg) must match the .lua files: a change to one without regenerating fails here."""

from __future__ import annotations

import subprocess
import sys


def test_the_embedded_scripts_match_the_lua_files() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "scrapy_openclaw.distributed.lua", "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
