"""A warning when a project sets ``OPENCLAW_*`` settings but nothing of ours is switched on.

Scrapy's ``startproject`` template ends its settings with ``ADDONS = {}``: an
``ADDONS`` line pasted above it is silently replaced, the crawl runs as plain
Scrapy and no component of ours runs to notice. What does run is the loading
of our ``scrapy.commands`` entry points, which Scrapy does for every ``scrapy``
command, so the check is made there, once, for ``scrapy crawl`` and
``scrapy runspider``. It sees ``settings.py``, not ``-s`` options.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

logger = logging.getLogger(__name__)

ADDON = "scrapy_openclaw.Addon"
_COMPONENT_SETTINGS = ("ADDONS", "DOWNLOADER_MIDDLEWARES", "SPIDER_MIDDLEWARES", "ITEM_PIPELINES", "EXTENSIONS")
_CRAWL_COMMANDS = ("crawl", "runspider")
_checked = False


def addon_off_message(settings: BaseSettings) -> str | None:
    """What to tell the user when *settings* set ``OPENCLAW_*`` names but enable nothing of ours, else None."""
    ours = sorted(name for name in settings.attributes if name.startswith("OPENCLAW_"))
    if not ours:
        return None
    for name in _COMPONENT_SETTINGS:
        for key, order in settings.getdict(name).items():
            path = key if isinstance(key, str) else f"{key.__module__}.{key.__qualname__}"
            if path.startswith("scrapy_openclaw") and order is not None:
                return None
    more = f" and {len(ours) - 1} more" if len(ours) > 1 else ""
    return (
        f"scrapy-openclaw is off: the settings set {ours[0]}{more}, but neither ADDONS nor any component "
        f"setting enables it, so the crawl runs as plain Scrapy. Put {ADDON!r}: 100 inside the project's "
        "ADDONS dict (a later `ADDONS = {}`, as in Scrapy's startproject template, replaces an earlier line)"
    )


def check_crawl_command() -> None:
    """Log :func:`addon_off_message` for the project's settings when this process is ``scrapy crawl/runspider``."""
    global _checked
    if _checked or len(sys.argv) < 2 or sys.argv[1] not in _CRAWL_COMMANDS:
        return
    _checked = True
    from scrapy.utils.project import get_project_settings, inside_project

    if not inside_project():
        return
    message = addon_off_message(get_project_settings())
    if message:
        logger.warning(message)
