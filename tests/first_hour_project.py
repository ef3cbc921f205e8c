"""A fresh ``scrapy startproject`` project with the add-on line, and ``scrapy`` run in it, for the first-hour tests."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from scrapy_openclaw.testing.servers import subprocess_env

ADDON_LINE = 'ADDONS = {"scrapy_openclaw.Addon": 100}'
SPIDER = """import scrapy


class PlainSpider(scrapy.Spider):
    name = "plain"
    start_urls = ["http://127.0.0.1:9/"]

    def parse(self, response):
        yield {"url": response.url}
"""


@dataclass
class Run:
    returncode: int
    output: str

    @property
    def lines(self) -> list[str]:
        return self.output.splitlines()


def start_project(parent: Path, name: str = "proj", *, addon: bool = True) -> Path:
    """``scrapy startproject NAME`` in *parent*; its ``ADDONS = {}`` replaced by ours unless *addon* is False."""
    subprocess.run(
        [sys.executable, "-m", "scrapy", "startproject", name],
        cwd=parent,
        env=subprocess_env(),
        check=True,
        capture_output=True,
        timeout=120,
    )
    root = parent / name
    settings = root / name / "settings.py"
    text = settings.read_text(encoding="utf-8")
    assert "\nADDONS = {}\n" in text  # the template line a user replaces
    if addon:
        text = text.replace("\nADDONS = {}\n", f"\n{ADDON_LINE}\n")
    settings.write_text(text + "\nTELNETCONSOLE_ENABLED = False\n", encoding="utf-8")
    (root / name / "spiders" / "plain.py").write_text(SPIDER, encoding="utf-8")
    return root


def add_settings(root: Path, text: str) -> None:
    """Append *text* to the project's ``settings.py``."""
    settings = next(root.glob("*/settings.py"))
    settings.write_text(settings.read_text(encoding="utf-8") + "\n" + text + "\n", encoding="utf-8")


def scrapy(cwd: Path, *args: str, timeout: float = 120) -> Run:
    """Run ``python -m scrapy ARGS`` in *cwd*; stdout and stderr together."""
    proc = subprocess.run(
        [sys.executable, "-m", "scrapy", *args],
        cwd=cwd,
        env=subprocess_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=timeout,
    )
    return Run(proc.returncode, proc.stdout.decode("utf-8", "replace"))
