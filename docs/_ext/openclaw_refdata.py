"""The reference tables of the docs, read from the code (no Sphinx here: tests/test_docs.py uses it too).

Settings and policy knobs are described by the comments next to their
defaults, so those are read from the source with :mod:`tokenize`; command
options come from each command's own argument parser, metrics from a real
registry, and stats keys from the calls that count them.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import importlib
import io
import logging
import math
import re
import sys
import tokenize
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "scrapy_openclaw"
_HEADER = re.compile(r"^---\s*(.*?)\s*---$")


# ------------------------------------------------------------------ comments


def _comments(source: str) -> dict[int, tuple[str, bool]]:
    """Line -> (comment text, whether the comment is alone on its line)."""
    found: dict[int, tuple[str, bool]] = {}
    code_lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            text = tok.string.lstrip("#").strip()
            found[tok.start[0]] = (text, tok.start[0] not in code_lines)
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            code_lines.update(range(tok.start[0], tok.end[0] + 1))
    return found


def _join(parts: list[str]) -> str:
    return re.sub(r"\s+", " ", " ".join(p for p in parts if p)).strip()


@dataclass
class Described:
    """A name from the code, with the comments around it."""

    name: str
    lead: str  # comment lines just above it (not a ``--- section ---`` header)
    trailing: str  # the comment at the end of its line(s)
    section: str  # the last ``# --- section ---`` header above it

    @property
    def description(self) -> str:
        return _join([self.lead, self.trailing])


def _described(source: str, spans: list[tuple[str, int, int]], floor: int) -> list[Described]:
    """Comments of each (name, first line, last line) span; *floor* is the line before the first span."""
    comments = _comments(source)
    out: list[Described] = []
    section = ""
    previous_end = floor
    for name, first, last in spans:
        lead: list[str] = []
        for line in range(previous_end + 1, first):
            text, alone = comments.get(line, ("", False))
            header = _HEADER.match(text)
            if header:
                section, lead = header.group(1), []
            elif alone and text:
                lead.append(text)
        trailing = [comments[line][0] for line in range(first, last + 1) if line in comments]
        if not comments.get(last, ("", True))[1] and last in comments:
            trailing = [comments[last][0]]
        out.append(Described(name, _join(lead), _join(trailing), section))
        previous_end = last
    return out


# ------------------------------------------------------------------ settings


@dataclass
class Setting:
    name: str
    default: Any
    kind: str
    range: str
    description: str
    section: str
    group: str  # a note shared by the settings that follow it (a lead comment above a self-described one)


def settings() -> list[Setting]:
    """Every ``OPENCLAW_*`` setting, in the order of ``settings.DEFAULTS``."""
    from scrapy_openclaw import settings as module

    source = Path(module.__file__).read_text(encoding="utf-8")
    table = next(
        node.value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "DEFAULTS"
    )
    assert isinstance(table, ast.Dict)
    spans = [(ast.literal_eval(k), k.lineno, v.end_lineno or v.lineno) for k, v in zip(table.keys, table.values)]
    result: list[Setting] = []
    group = ""
    for item in _described(source, spans, table.lineno):
        lead, description = item.lead, item.description
        if lead and item.trailing:  # a note about a group, then a setting described on its own line
            group, description = lead, item.trailing
        elif lead or item.section != (result[-1].section if result else ""):
            group = ""
        default = module.DEFAULTS[item.name]
        kind = getattr(module, "_TYPES", {}).get(item.name, type(default))
        bounds = getattr(module, "_RANGES", {}).get(item.name)
        result.append(
            Setting(
                name=item.name,
                default=default,
                kind="text" if default is None and kind is type(None) else kind.__name__,
                range=f"{_number(bounds[0])} – {_number(bounds[1])}" if bounds else "",
                description=description,
                section=item.section or "general",
                group=group,
            )
        )
    return result


def _number(value: float | None) -> str:
    if value is None:
        return "∞"
    if value >= 10**6 and math.log10(value).is_integer():
        return f"10^{int(math.log10(value))}"
    return repr(value)


# ------------------------------------------------------------------ policy


@dataclass
class Knob:
    key: str  # "health.burst", "retry.network.max_attempts"
    default: str
    range: str
    description: str


def _class_comments(cls: type) -> dict[str, str]:
    module = sys.modules[cls.__module__]
    source = Path(module.__file__ or "").read_text(encoding="utf-8")
    node = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    body = [s for s in node.body if isinstance(s, ast.AnnAssign)]
    spans = [(getattr(s.target, "id", ""), s.lineno, s.end_lineno or s.lineno) for s in body]
    floor = node.body[0].end_lineno if node.body and isinstance(node.body[0], ast.Expr) else node.lineno
    return {d.name: d.description for d in _described(source, spans, floor or node.lineno)}


def _allowed(hint: Any, f: dataclasses.Field) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is bool:
        return "true / false"
    if origin is typing.Literal:
        return " / ".join(map(str, args))
    if origin is tuple:
        return "a list of up to 100 strings"
    if origin is dict:
        return "a mapping of name: seconds (>= 0)"
    lo, hi = f.metadata.get("range", (None, None))
    text = f"{_number(lo) if lo is not None else '-∞'} – {_number(hi)}"
    if lo is None and hi is None:
        text = "any number"
    base = next((a for a in args if a is not type(None)), hint) if args else hint
    if base is int:
        text += ", whole"
    if type(None) in args:
        text += ", or null"
    return text


def _default(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return "[]" if not value else repr(list(value))
    return repr(value)


def policy() -> list[Knob]:
    """Every policy key, from the dataclasses of ``scrapy_openclaw.policy``: the schema."""
    from scrapy_openclaw import policy as module

    sections = (("health", module.HealthPolicy), ("retry", module.RetryPolicy), ("deadline", module.DeadlinePolicy))
    retry_class = typing.get_type_hints(module.RetryPolicy)["network"]
    class_comments = _class_comments(retry_class)
    knobs: list[Knob] = []
    for section, cls in sections:
        hints, comments, instance = typing.get_type_hints(cls), _class_comments(cls), cls()
        for f in dataclasses.fields(cls):
            value = getattr(instance, f.name)
            if dataclasses.is_dataclass(value):  # a retry class: its own keys follow
                text = ", ".join(f"{sub.name}: {_default(getattr(value, sub.name))}" for sub in dataclasses.fields(value))
                knobs.append(Knob(f"{section}.{f.name}", text, "a mapping (below)", comments.get(f.name, "")))
                continue
            knobs.append(Knob(f"{section}.{f.name}", _default(value), _allowed(hints[f.name], f), comments[f.name]))
    hints, instance = typing.get_type_hints(retry_class), retry_class()
    for f in dataclasses.fields(retry_class):
        knobs.append(
            Knob(
                f"retry.<class>.{f.name}",
                _default(getattr(instance, f.name)),
                _allowed(hints[f.name], f),
                class_comments.get(f.name, ""),
            )
        )
    return knobs


# ------------------------------------------------------------------ commands


@dataclass
class Option:
    flags: str
    metavar: str
    default: str
    help: str


@dataclass
class CommandDoc:
    name: str
    syntax: str
    short: str
    long: str
    options: list[Option]


def command_classes() -> dict[str, type]:
    """``scrapy openclaw-*`` commands, from the ``scrapy.commands`` entry points in pyproject.toml."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        from importlib.metadata import entry_points

        points = {e.name: e.value for e in entry_points(group="scrapy.commands")}
    else:
        data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
        points = data["project"]["entry-points"]["scrapy.commands"]
    classes: dict[str, type] = {}
    for name, target in sorted(points.items()):
        module, _, attr = target.partition(":")
        classes[name] = getattr(importlib.import_module(module), attr)
    return classes


def commands() -> list[CommandDoc]:
    from scrapy.commands import ScrapyCommand
    from scrapy.settings import Settings

    class _Plain(ScrapyCommand):  # Scrapy's own options, which every command has
        def short_desc(self) -> str:
            return ""

        def run(self, args: list[str], opts: argparse.Namespace) -> None:
            pass

    base = argparse.ArgumentParser(add_help=False)
    plain = _Plain()
    plain.settings = Settings()
    plain.add_options(base)
    scrapy_dests = {a.dest for a in base._actions}
    docs = []
    for name, cls in command_classes().items():
        cmd = cls()
        cmd.settings = Settings()  # as scrapy.cmdline sets it, before add_options
        parser = argparse.ArgumentParser(prog=f"scrapy {name}", add_help=False)
        cmd.add_options(parser)
        options = [
            Option(
                flags=", ".join(a.option_strings),
                metavar="" if a.nargs == 0 else str(a.metavar or a.dest.upper()),
                default="" if a.default in (None, False, argparse.SUPPRESS) or a.nargs == 0 else repr(a.default),
                help=(a.help or "").replace("%%", "%"),
            )
            for a in parser._actions
            if a.dest not in scrapy_dests
        ]
        long = cmd.long_desc() if type(cmd).long_desc is not ScrapyCommand.long_desc else ""
        docs.append(CommandDoc(name, cmd.syntax(), cmd.short_desc(), long, options))
    return docs


# ------------------------------------------------------------------ metrics


@dataclass
class Metric:
    name: str  # as exposed: counters with _total
    type: str
    help: str
    labels: tuple[str, ...]
    source: str


@functools.cache
def metrics() -> list[Metric]:
    """Every Prometheus metric, collected from the registries the code builds (the crawl's and the scheduler's)."""
    from scrapy import Spider
    from scrapy.utils.misc import build_from_crawler
    from scrapy.utils.test import get_crawler

    from scrapy_openclaw.metrics import MetricsExtension
    from scrapy_openclaw.schedule.metrics import ScheduleMetrics

    class _Spider(Spider):
        name = "docs"

    scrapy_logger = logging.getLogger("scrapy")
    level = scrapy_logger.level
    scrapy_logger.setLevel(logging.WARNING)  # the crawler's start-up INFO lines are no part of a docs build
    try:
        crawler = get_crawler(_Spider, {"OPENCLAW_LOG_DOMAINS": 1, "LOG_ENABLED": False})
    finally:
        scrapy_logger.setLevel(level)
    crawler.stats.set_value("openclaw/retry/delay_count", 1)  # the retry-delay histogram appears with it
    extension = build_from_crawler(MetricsExtension, crawler)
    scheduler = ScheduleMetrics()
    found: list[Metric] = []
    for owner, source in ((extension, "crawl"), (scheduler, "openclaw-schedule")):
        wrappers = {w._name: w for w in vars(owner).values() if hasattr(w, "_labelnames") and hasattr(w, "_name")}
        for family in owner.registry.collect():
            labels = getattr(family, "_labelnames", None)
            if labels is None:
                labels = wrappers[family.name]._labelnames if family.name in wrappers else ()
            name = family.name + ("_total" if family.type == "counter" else "")
            found.append(Metric(name, family.type, family.documentation, tuple(labels), source))
    return found


# ------------------------------------------------------------------ stats

_STATS_CALLS = {"inc_value", "set_value", "max_value", "min_value"}


def _module_constants(path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """Module-level string constants, and names imported from our package (name -> module)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    constants: dict[str, str] = {}
    imports: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    constants[target.id] = node.value.value
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("scrapy_openclaw"):
            for alias in node.names:
                imports[alias.asname or alias.name] = node.module or ""
    return constants, imports


def _resolve(name: str, path: Path, depth: int = 0) -> str | None:
    constants, imports = _module_constants(path)
    if name in constants:
        return constants[name]
    if name in imports and depth < 3:
        module = PACKAGE.parent / Path(*imports[name].split("."))
        target = module / "__init__.py" if module.is_dir() else module.with_suffix(".py")
        return _resolve(name, target, depth + 1) if target.exists() else None
    return None


def _placeholder(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Call):
        return "bucket" if "bucket" in ast.unparse(node.func) else ast.unparse(node.func).split(".")[-1]
    return ast.unparse(node).split(".")[-1]


def _key(node: ast.expr, path: Path) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return _resolve(node.id, path)
    if not isinstance(node, ast.JoinedStr):
        return None
    parts = []
    for value in node.values:
        if isinstance(value, ast.Constant):
            parts.append(str(value.value))
            continue
        inner = value.value if isinstance(value, ast.FormattedValue) else value
        resolved = _resolve(inner.id, path) if isinstance(inner, ast.Name) else None
        parts.append(resolved if resolved is not None else f"<{_placeholder(inner)}>")
    return "".join(parts)


@dataclass
class Stat:
    key: str  # dynamic parts as <name>
    modules: tuple[str, ...]


def stats() -> list[Stat]:
    """Every stats key the package counts, read from its ``stats.inc_value/set_value/max_value`` calls."""
    found: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "testing" in path.relative_to(PACKAGE).parts:
            continue
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args):
                continue
            if node.func.attr not in _STATS_CALLS or "stats" not in ast.unparse(node.func.value):
                continue
            key = _key(node.args[0], path)
            if key is not None:
                found.setdefault(key, set()).add(module)
    return [Stat(key, tuple(sorted(mods))) for key, mods in sorted(found.items())]


def stat_pattern(key: str) -> str:
    """A key with its dynamic parts made alike, to compare a documented key with a counted one."""
    return re.sub(r"<[^>]*>", "<*>", key)


# ------------------------------------------------------------------ components


@dataclass
class Component:
    path: str
    setting: str
    order: int | None
    summary: str


def components() -> list[Component]:
    """What the add-on wires, from the tables in ``scrapy_openclaw.addon``."""
    from scrapy.utils.misc import load_object

    from scrapy_openclaw import addon

    rows = []
    for setting in ("DOWNLOADER_MIDDLEWARES", "SPIDER_MIDDLEWARES", "ITEM_PIPELINES", "EXTENSIONS"):
        for path, order in sorted(getattr(addon, setting).items(), key=lambda kv: kv[1]):
            rows.append(Component(path, setting, order, _summary(load_object(path))))
    rows.append(Component(addon.PRIORITY_QUEUE, "SCHEDULER_PRIORITY_QUEUE", None, _summary(load_object(addon.PRIORITY_QUEUE))))
    return rows


def _summary(obj: Any) -> str:
    return (obj.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ").strip()
