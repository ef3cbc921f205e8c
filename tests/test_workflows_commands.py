"""Scrapy's own commands with the add-on on: they print what plain Scrapy prints and write nothing
into the project (real ``scrapy`` processes in a project directory, against the chaos site)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from scrapy_openclaw.testing.servers import subprocess_env

pytestmark = pytest.mark.crawl

SETTINGS = """
BOT_NAME = "wfproj"
SPIDER_MODULES = ["wfproj_spiders"]
ROBOTSTXT_OBEY = True  # as in a project made by scrapy startproject
TELNETCONSOLE_ENABLED = False
REMOTE_CONTROL_ENABLED = False
ADDONS = {"scrapy_openclaw.Addon": 100}
"""

SPIDERS = '''
import scrapy


class PagesSpider(scrapy.Spider):
    name = "pages"
    start_urls = ["{base}page/0"]

    def parse(self, response):
        """Scrape a chaos page.

        @url {base}page/1
        @returns items 1 1
        @scrapes title
        """
        yield {{"title": response.css("h1#title::text").get()}}
'''


def make_project(root: Path, base: str, settings: str = "") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "scrapy.cfg").write_text("[settings]\ndefault = wfproj_settings\n", encoding="utf-8")
    (root / "wfproj_settings.py").write_text(SETTINGS + textwrap.dedent(settings), encoding="utf-8")
    (root / "wfproj_spiders.py").write_text(SPIDERS.format(base=base), encoding="utf-8")
    return root


def scrapy(project: Path, *args: str, addon: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``scrapy ARGS`` in *project*, with the add-on (its settings' line) or without it."""
    env = subprocess_env()
    env["PYTHONPATH"] = f"{project}{':' if env.get('PYTHONPATH') else ''}{env.get('PYTHONPATH', '')}"
    extra = [] if addon else ["-s", "ADDONS={}"]
    return subprocess.run(
        [sys.executable, "-m", "scrapy", *args, *extra],
        cwd=project,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def written(project: Path) -> list[str]:
    """What a command left in the project besides its own files (and Python's caches)."""
    own = {"scrapy.cfg", "wfproj_settings.py", "wfproj_spiders.py", "__pycache__"}
    return sorted(
        str(p.relative_to(project))
        for p in project.rglob("*")
        if p.parts[-1] not in own and "__pycache__" not in p.parts
    )


@pytest.fixture
def site(chaos_server: Any) -> Any:
    # page 2 answers 404; robots.txt answers 404 too (the chaos site serves none)
    return chaos_server({"hosts": [{"address": "127.0.0.2", "pages": 3, "links_per_page": "all", "not_found": [2]}]})


def test_fetch_prints_a_4xx_page_as_plain_scrapy_does(site: Any, tmp_path: Path) -> None:
    base = site.urls["127.0.0.2"]
    project = make_project(tmp_path / "proj", base)
    ours = scrapy(project, "fetch", "--nolog", f"{base}page/2")
    plain = scrapy(project, "fetch", "--nolog", f"{base}page/2", addon=False)
    assert plain.returncode == 0 and "Error 404" in plain.stdout, plain.stderr[-2000:]
    assert ours.returncode == 0, ours.stderr[-3000:]
    assert ours.stdout == plain.stdout, ours.stderr[-3000:]
    assert "Traceback" not in ours.stderr
    assert written(project) == []


def test_shell_command_on_a_4xx_page_as_plain_scrapy_does(site: Any, tmp_path: Path) -> None:
    base = site.urls["127.0.0.2"]
    project = make_project(tmp_path / "proj", base)
    code = "print(response.status, response.text)"
    ours = scrapy(project, "shell", "--nolog", "-c", code, f"{base}page/2")
    plain = scrapy(project, "shell", "--nolog", "-c", code, f"{base}page/2", addon=False)
    assert plain.stdout.startswith("404 "), plain.stderr[-2000:]
    assert ours.returncode == 0, ours.stderr[-3000:]
    assert ours.stdout == plain.stdout, ours.stderr[-3000:]
    assert written(project) == []


def test_parse_and_check_write_nothing_into_the_project(site: Any, tmp_path: Path) -> None:
    base = site.urls["127.0.0.2"]
    project = make_project(tmp_path / "proj", base)
    parsed = scrapy(project, "parse", "--nolog", "--spider", "pages", "-c", "parse", f"{base}page/1")
    plain = scrapy(project, "parse", "--nolog", "--spider", "pages", "-c", "parse", f"{base}page/1", addon=False)
    assert parsed.returncode == 0, parsed.stderr[-3000:]
    assert parsed.stdout == plain.stdout and "Scraped Items" in parsed.stdout, parsed.stderr[-3000:]
    checked = scrapy(project, "check", "pages")
    assert checked.returncode == 0, checked.stdout + checked.stderr[-3000:]
    assert "OK" in checked.stderr, checked.stderr[-3000:]
    assert written(project) == []
    counts = site.truth()["hosts"]["127.0.0.2"]["counts"]
    assert counts["/robots.txt"] >= 2 and counts["/page/1"] >= 2  # (its 404 robots.txt wrote nothing either)


def test_scrapys_commands_in_a_distributed_project_stay_in_their_process(
    site: Any, redis_server: Any, tmp_path: Path
) -> None:
    """A project with ``OPENCLAW_DISTRIBUTED = True`` (and scrapy-redis's item pipeline): ``fetch``,
    ``shell``, ``parse --pipelines`` and ``check`` answer as they do without the add-on, and put
    nothing in the crawl's Redis queue. Their requests' callbacks are the commands' closures: the
    Redis queue refused them (``fetch`` printed nothing, ``parse`` found no response) or ``shell``
    waited for ever, until distributed mode was switched off for these commands."""
    import redis

    base = site.urls["127.0.0.2"]
    settings = f"""
    OPENCLAW_DISTRIBUTED = True
    OPENCLAW_STORE_KEY = "workflows-shared-store-key"
    REDIS_URL = "{redis_server.url}"
    ITEM_PIPELINES = {{"scrapy_redis.pipelines.RedisPipeline": 300}}
    """
    project = make_project(tmp_path / "proj", base, settings)
    commands = [
        ("fetch", "--nolog", f"{base}page/1"),
        ("shell", "--nolog", "-c", "print(response.status, response.css('h1::text').get())", f"{base}page/1"),
        ("parse", "--nolog", "--pipelines", "--spider", "pages", "-c", "parse", f"{base}page/1"),
    ]
    conn = redis.Redis.from_url(redis_server.url)
    for args in commands:
        ours = scrapy(project, *args)
        plain = scrapy(project, *args, addon=False)
        assert ours.returncode == 0 and plain.returncode == 0, ours.stderr[-3000:]
        assert ours.stdout == plain.stdout and ours.stdout.strip(), (args[0], ours.stderr[-3000:])
        assert not [k for k in conn.keys("*") if not k.startswith(b"pages:items")], (args[0], conn.keys("*"))
    # parse --pipelines wrote its item with scrapy-redis's pipeline, once for each run
    assert conn.llen("pages:items") == 2
    checked = scrapy(project, "check", "pages")
    assert checked.returncode == 0 and "OK" in checked.stderr, checked.stderr[-3000:]
