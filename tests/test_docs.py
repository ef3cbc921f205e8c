"""The docs document everything the code has: every setting, policy key, command option, stat and metric.

The reference pages are generated from the code (``docs/_ext/openclaw_refdata.py``); these tests
fail when a name has no meaning to show there, when the built site leaves one out, and when a page
names a setting or stats key the code does not have.
"""

from __future__ import annotations

import functools
import html
import re
import subprocess
import sys
from pathlib import Path

import pytest

import scrapy_openclaw
from scrapy_openclaw.settings import DEFAULTS

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text(encoding="utf-8")
sys.path.insert(0, str(DOCS / "_ext"))

import openclaw_refdata as refdata  # noqa: E402

PAGES = {p: p.read_text(encoding="utf-8") for p in sorted(DOCS.rglob("*.md")) if "_build" not in p.parts}


def _pages_text() -> str:
    return "\n".join(PAGES.values())


# ------------------------------------------------------------------ the code tables have meanings


@pytest.mark.parametrize("setting", refdata.settings(), ids=lambda s: s.name)
def test_every_setting_has_a_meaning_in_the_code_table(setting):
    assert setting.description.strip(), f"{setting.name}: no comment beside its default in settings.py"


def test_the_settings_reference_lists_every_default():
    assert [s.name for s in refdata.settings()] == list(DEFAULTS)


@pytest.mark.parametrize("knob", refdata.policy(), ids=lambda k: k.key)
def test_every_policy_key_has_a_meaning_in_the_schema(knob):
    assert knob.description.strip(), f"{knob.key}: no comment beside its field in policy/policies.py"


def _options():
    for command in refdata.commands():
        for option in command.options:
            yield pytest.param(option, id=f"{command.name} {option.flags}")


@pytest.mark.parametrize("option", list(_options()))
def test_every_command_option_has_help(option):
    assert option.help.strip(), f"{option.flags}: no help= in its add_argument call"


def test_every_command_has_a_description():
    commands = refdata.commands()
    assert {c.name for c in commands} == {
        "openclaw-checkpoint",
        "openclaw-ctl",
        "openclaw-dlq",
        "openclaw-report",
        "openclaw-schedule",
        "openclaw-sites",
    }
    assert all(c.short.strip() for c in commands)


@pytest.mark.parametrize("metric", refdata.metrics(), ids=lambda m: m.name)
def test_every_metric_has_help(metric):
    assert metric.help.strip()


@functools.cache
def _documented_stats() -> frozenset[str]:
    """Every stats key the pages name (ours and Scrapy's own), dynamic parts made alike."""
    found = re.findall(r"(?:openclaw|retry|scheduler)/[\w/<>.*-]+", _pages_text())
    return frozenset(refdata.stat_pattern(k.rstrip(".,:;)")) for k in found)


def _matches(counted: str, documented: frozenset[str]) -> bool:
    """A counted key with a dynamic part (``openclaw/delay/<stat>``) is documented by its concrete keys."""
    pattern = refdata.stat_pattern(counted)
    if pattern in documented:
        return True
    regex = re.compile(re.escape(pattern).replace(re.escape("<*>"), r"[^/]+") + "$")
    return any(regex.match(key) for key in documented)


@pytest.mark.parametrize("stat", refdata.stats(), ids=lambda s: s.key)
def test_every_stats_key_is_explained_on_a_page(stat):
    assert _matches(stat.key, _documented_stats()), f"{stat.key} (counted in {stat.modules}) is on no docs page"


# ------------------------------------------------------------------ pages name only what exists

# names that look like settings but are environment variables or a deliberate typo in an example
_NOT_SETTINGS = {"OPENCLAW_DOCS_ONLINE", "OPENCLAW_POLICY_FIEL", "OPENCLAW_CHECKPIONT_DIR"}  # (typos the pages show)


@pytest.mark.parametrize("page", [*PAGES, ROOT / "README.md"], ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_name_only_settings_that_exist(page):
    text = page.read_text(encoding="utf-8")
    unknown = set(re.findall(r"\bOPENCLAW_[A-Z0-9_]*[A-Z0-9]\b", text)) - set(DEFAULTS) - _NOT_SETTINGS
    assert not unknown


@functools.cache
def _counted_patterns() -> list[str]:
    return [refdata.stat_pattern(s.key) for s in refdata.stats()]


@pytest.mark.parametrize("page", list(PAGES), ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_name_only_stats_keys_that_exist(page):
    counted = _counted_patterns()
    regexes = [re.compile(re.escape(p).replace(re.escape("<*>"), r"[^/]+") + "$") for p in counted]
    keys = {k.rstrip(".,:;)") for k in re.findall(r"`(openclaw/[\w/<>.*-]+)`", PAGES[page])}
    unknown = {
        k
        for k in keys
        if refdata.stat_pattern(k) not in counted
        and not any(r.match(k) for r in regexes)
        and not any(c.startswith(k.rstrip("/.") + "/") for c in counted)  # a prefix: `openclaw/queue/...`
    }
    assert not unknown


# ------------------------------------------------------------------ the built reference shows them


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """The site built as docutils XML (every table cell whole), warnings as errors as .ci/run builds it."""
    out = tmp_path_factory.mktemp("docs-xml")
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "xml", str(DOCS), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


_PLAIN_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'})


def _page(built: Path, name: str) -> str:
    """A page's text: tags dropped, entities decoded, whitespace made single."""
    text = re.sub(r"<[^>]+>", "", (built / f"{name}.xml").read_text(encoding="utf-8"))
    text = html.unescape(text).translate(_PLAIN_QUOTES)  # undo docutils' smart quotes
    return re.sub(r"\s+", " ", text)


def test_the_built_settings_reference_shows_every_setting_and_its_meaning(built):
    page = _page(built, "reference/settings")
    for setting in refdata.settings():
        assert setting.name in page
        assert setting.description.replace("`", "")[:40] in page.replace("`", ""), setting.name


def test_the_built_policy_reference_shows_every_key(built):
    page = _page(built, "reference/policy")
    for knob in refdata.policy():
        assert knob.key in page


def test_the_built_commands_reference_shows_every_option(built):
    page = _page(built, "reference/commands")
    for command in refdata.commands():
        assert f"scrapy {command.name}" in page
        for option in command.options:
            assert option.flags in page, (command.name, option.flags)


def test_the_built_stats_reference_shows_every_stat_and_metric(built):
    page = _page(built, "reference/stats")
    for stat in refdata.stats():
        assert stat.key in page
    for metric in refdata.metrics():
        assert metric.name in page


# ------------------------------------------------------------------ README, CI, version


def test_the_two_setup_commands_open_the_readme():
    head = README.split("\n## ", 1)[0]
    assert "pip install -e . && cd sample_project && scrapy crawl demo" in head
    assert 'pip install -e ".[test]" && python -m pytest -q -n 4\n' in head


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "python3 -m pytest -q -n 4\n" in ci


def test_the_readme_stays_short():
    assert len(README.splitlines()) <= 250


def test_the_newest_release_notes_are_for_this_version():
    top = re.search(r"^## scrapy-openclaw (\S+)", (DOCS / "news.md").read_text(encoding="utf-8"), re.M)
    assert top is not None
    assert top.group(1) == scrapy_openclaw.__version__


def test_the_version_has_one_source():
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert 'dynamic = ["version"]' in pyproject
    assert 'version = { attr = "scrapy_openclaw.__version__" }' in pyproject
    assert re.fullmatch(r"\d+\.\d+\.\d+", scrapy_openclaw.__version__)


# ------------------------------------------------------------------ pictures


def test_every_picture_is_shown_on_a_page():
    shown = {Path(m).name for text in PAGES.values() for m in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", text)}
    assert {p.name for p in DOCS.glob("*.png")} <= shown


def test_benchmarks_page_has_the_generated_results_and_the_plot():
    page = PAGES[DOCS / "benchmarks.md"]
    assert "```{include} benchmark-results.md" in page
    assert "](benchmark-health.png)" in page


def test_operating_pages_show_the_real_terminals():
    assert "](ctl.png)" in PAGES[DOCS / "operating.md"]
    assert "](logtable.png)" in PAGES[DOCS / "monitoring.md"]
