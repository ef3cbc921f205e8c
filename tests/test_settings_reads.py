"""OPENCLAW_* settings are read in settings.py only (the CI check, run here so a new read fails the tests)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CHECK = Path(__file__).resolve().parent.parent / ".ci" / "check-settings-reads"


def test_no_new_openclaw_setting_read_outside_settings_py() -> None:
    result = subprocess.run([sys.executable, str(CHECK)], capture_output=True, text=True, timeout=60, check=False)
    assert (result.returncode, result.stdout) == (0, ""), result.stdout + result.stderr


def test_the_check_names_a_read_it_does_not_allow(tmp_path: Path) -> None:
    package = tmp_path / "scrapy_openclaw"
    package.mkdir()
    (tmp_path / ".ci").mkdir()
    (tmp_path / ".ci" / "check-settings-reads").write_text(CHECK.read_text(encoding="utf-8"), encoding="utf-8")
    (package / "settings.py").write_text('X = settings.get("OPENCLAW_CRAWL_ID")\n', encoding="utf-8")
    (package / "spider.py").write_text('crawl_id = crawler.settings.get("OPENCLAW_CRAWL_ID")\n', encoding="utf-8")
    result = subprocess.run(
        [sys.executable, str(tmp_path / ".ci" / "check-settings-reads")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert result.stdout == 'scrapy_openclaw/spider.py:1: crawl_id = crawler.settings.get("OPENCLAW_CRAWL_ID")\n'
