"""Sphinx configuration: MyST Markdown pages, reference tables generated from the code (docs/_ext)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE / "_ext"), str(HERE.parent)]  # the extension, and this tree's scrapy_openclaw

import scrapy_openclaw  # noqa: E402

project = "scrapy-openclaw"
author = "the scrapy-openclaw authors"
copyright = "2026, the scrapy-openclaw authors"
release = scrapy_openclaw.__version__  # this tree's (sys.path above), not whatever is installed
version = ".".join(release.split(".")[:2])

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.extlinks",
    "sphinx.ext.intersphinx",
    "openclaw_reference",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
# benchmark-results.md is generated (python -m benchmarks) and read through benchmarks.md's include
exclude_patterns = ["_build", "benchmark-results.md", "examples/**"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
highlight_language = "text"  # an unlabelled block is a terminal or a log

html_theme = "furo"
html_title = f"scrapy-openclaw {release}"
html_static_path: list[str] = []

autodoc_member_order = "bysource"
autodoc_typehints = "description"

# Scrapy's and Twisted's pages as plain URLs: these links work with no inventory, so the build
# (CI has no network) never fetches and -W stays quiet.
extlinks = {
    "scrapy": ("https://docs.scrapy.org/en/latest/%s", None),
    "scrapy-setting": ("https://docs.scrapy.org/en/latest/topics/settings.html#std-setting-%s", "%s"),
    "twisted": ("https://docs.twisted.org/en/stable/%s", None),
}
# Intersphinx (Python objects of Scrapy and Twisted, e.g. {py:class}`scrapy.Spider`) needs their
# inventories, fetched over the network: only where the build has one (Read the Docs sets
# READTHEDOCS; OPENCLAW_DOCS_ONLINE=1 elsewhere). Offline the same roles render as plain code.
intersphinx_mapping: dict[str, tuple[str, None]] = {}
if os.environ.get("READTHEDOCS") or os.environ.get("OPENCLAW_DOCS_ONLINE"):
    intersphinx_mapping = {
        "python": ("https://docs.python.org/3", None),
        "scrapy": ("https://docs.scrapy.org/en/latest", None),
        "twisted": ("https://docs.twisted.org/en/stable/api", None),
    }
intersphinx_timeout = 10
