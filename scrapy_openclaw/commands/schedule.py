"""``scrapy openclaw-schedule TASKS.yaml`` (foreground scheduler) and ``... status``."""

from __future__ import annotations

from typing import Any

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError


class Command(ScrapyCommand):
    requires_project = False
    default_settings = {"LOG_ENABLED": True}

    def syntax(self) -> str:
        return "TASKS.yaml | status [TASKS.yaml]"

    def short_desc(self) -> str:
        return "Run scheduled crawls from a tasks file (foreground), or show run history"

    def run(self, args: list[str], opts: Any) -> None:
        raise UsageError("openclaw-schedule: not implemented yet", print_help=False)
