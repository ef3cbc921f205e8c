"""Every relative link in the README and the docs pages points at a file that exists, and at a heading in it.

``sphinx -W`` already fails on a broken cross-reference inside the site; these are the plain
Markdown links (``[text](page.md#heading)``), which GitHub renders too and Sphinx only warns about
for pages it knows. No network: links to other sites are not followed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts)]
_FENCE = re.compile(r"^ *(```|~~~).*?^ *\1", re.M | re.S)
_LINK = re.compile(r"!?\[(?:[^\]\n]|\n(?!\n))*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)
_DEPTH = 3  # docs/conf.py: myst_heading_anchors


def _prose(text: str) -> str:
    """The page without its fenced blocks (code is not a link) and inline code spans."""
    return re.sub(r"`[^`\n]*`", "", _FENCE.sub("", text))


def slug(heading: str) -> str:
    """The anchor GitHub and MyST give a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = re.sub(r"[`*_]{1,2}(?=\S)|(?<=\S)[`*_]{1,2}", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for hashes, title in _HEADING.findall(_FENCE.sub("", page.read_text(encoding="utf-8"))):
        base = slug(title)
        count = seen.get(base, 0)
        seen[base] = count + 1
        if len(hashes) <= _DEPTH or page.name == "README.md":
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def _links():
    for page in PAGES:
        for target in _LINK.findall(_prose(page.read_text(encoding="utf-8"))):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
                continue
            yield pytest.param(page, target, id=f"{page.relative_to(ROOT)} -> {target}")


@pytest.mark.parametrize(("page", "target"), list(_links()))
def test_relative_link_resolves(page, target):
    path, _, anchor = target.partition("#")
    resolved = (page.parent / path).resolve() if path else page
    assert resolved.exists(), f"{page.relative_to(ROOT)}: {target}: no such file"
    if anchor:
        assert resolved.suffix == ".md", f"{target}: an anchor into a file that is not a page"
        assert anchor in anchors(resolved), f"{page.relative_to(ROOT)}: {target}: no such heading"


def test_there_are_links_to_check():
    assert len(list(_links())) > 50


@pytest.mark.parametrize(
    ("heading", "expected"),
    [
        ("Scrapy's retry settings", "scrapys-retry-settings"),
        ("Heap freeze — `HeapFreeze`", "heap-freeze--heapfreeze"),
        ("Prometheus metrics", "prometheus-metrics"),
        ("`mixed`", "mixed"),
    ],
)
def test_slug_is_githubs(heading, expected):
    assert slug(heading) == expected


def test_a_broken_link_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[ok](#title) [gone](nowhere.md) [bad](#nope)\n", encoding="utf-8")
    targets = _LINK.findall(_prose(page.read_text(encoding="utf-8")))
    assert targets == ["#title", "nowhere.md", "#nope"]
    assert "title" in anchors(page) and "nope" not in anchors(page)
    assert not (page.parent / "nowhere.md").exists()
