"""Sphinx directives that render the reference tables from the code (see openclaw_refdata), and a toctree
whose missing pages are left out instead of failing the build."""

from __future__ import annotations

import posixpath
import re
from typing import Any

from docutils import nodes
from sphinx.directives.other import TocTree
from sphinx.util.docutils import SphinxDirective

import openclaw_refdata as data

_CODE = re.compile(r"`([^`]+)`")


def _inline(text: str) -> list[nodes.Node]:
    """Text with `code` spans as literals."""
    parts: list[nodes.Node] = []
    for i, piece in enumerate(_CODE.split(text)):
        if piece:
            parts.append(nodes.literal(piece, piece) if i % 2 else nodes.Text(piece))
    return parts


def _cell(content: Any) -> nodes.entry:
    entry = nodes.entry()
    if isinstance(content, nodes.Node):
        entry += content
    else:
        entry += nodes.paragraph("", "", *_inline(str(content)))
    return entry


def _code(text: str) -> nodes.paragraph:
    return nodes.paragraph("", "", nodes.literal(text, text)) if text else nodes.paragraph()


def _table(headers: list[str], rows: list[list[Any]], widths: list[int]) -> nodes.table:
    table = nodes.table(classes=["openclaw-reference"])
    group = nodes.tgroup(cols=len(headers))
    table += group
    group.extend(nodes.colspec(colwidth=w) for w in widths)
    head = nodes.thead()
    head += nodes.row("", *(_cell(h) for h in headers))
    group += head
    body = nodes.tbody()
    body.extend(nodes.row("", *(_cell(c) for c in row)) for row in rows)
    group += body
    return table


def _section_title(text: str) -> nodes.rubric:
    return nodes.rubric(text, "", *_inline(text))


class SettingsReference(SphinxDirective):
    """Every ``OPENCLAW_*`` setting: default, type, range and the comment beside its default."""

    def run(self) -> list[nodes.Node]:
        std = self.env.get_domain("std")
        out: list[nodes.Node] = []
        by_section: dict[str, list[data.Setting]] = {}
        for setting in data.settings():
            by_section.setdefault(setting.section, []).append(setting)
        for section, items in by_section.items():
            out.append(_section_title(section[:1].upper() + section[1:]))
            rows = []
            for s in items:
                node_id = f"setting-{s.name}"
                name = nodes.paragraph("", "", nodes.target("", "", ids=[node_id]), nodes.literal(s.name, s.name))
                std.note_object("setting", s.name, node_id, location=self.get_location())
                meaning = f"{s.group}: {s.description}" if s.group else s.description
                rows.append([name, _code(repr(s.default)), s.kind, s.range or "–", meaning])
            out.append(_table(["setting", "default", "type", "range", "meaning"], rows, [30, 14, 6, 12, 38]))
        return out


class PolicyReference(SphinxDirective):
    """Every policy key from the schema (the policy dataclasses)."""

    def run(self) -> list[nodes.Node]:
        rows = [[_code(k.key), _code(k.default), k.range, k.description] for k in data.policy()]
        return [_table(["key", "default", "allowed", "meaning (from the schema)"], rows, [24, 18, 18, 40])]


class CommandsReference(SphinxDirective):
    """Each ``scrapy openclaw-*`` command: syntax, description and its own options (Scrapy's global ones omitted)."""

    def run(self) -> list[nodes.Node]:
        out: list[nodes.Node] = []
        for cmd in data.commands():
            section = nodes.section(ids=[f"command-{cmd.name}"])
            section += nodes.title("", "", nodes.literal(f"scrapy {cmd.name}", f"scrapy {cmd.name}"))
            section += nodes.paragraph(text=cmd.short + ".")
            syntax = f"scrapy {cmd.name} {cmd.syntax}"
            section += nodes.literal_block(syntax, syntax, language="text")
            if cmd.long:
                section += nodes.paragraph("", "", *_inline(cmd.long))
            rows = [[_code(o.flags + (f" {o.metavar}" if o.metavar else "")), o.default or "–", o.help] for o in cmd.options]
            if rows:
                section += _table(["option", "default", "meaning"], rows, [28, 10, 62])
            self.env.get_domain("std").note_object("command", cmd.name, section["ids"][0], location=self.get_location())
            out.append(section)
        return out


class MetricsReference(SphinxDirective):
    """Every Prometheus metric, with its type, labels and help text, from a registry the code built."""

    def run(self) -> list[nodes.Node]:
        out: list[nodes.Node] = []
        for source, title in (("crawl", "A crawl's /metrics"), ("openclaw-schedule", "The scheduler's /metrics")):
            rows = [
                [_code(m.name), m.type, ", ".join(m.labels), m.help] for m in data.metrics() if m.source == source
            ]
            out += [_section_title(title), _table(["metric", "type", "labels", "help"], rows, [38, 9, 17, 36])]
        return out


class StatsReference(SphinxDirective):
    """Every stats key the package counts, found in its ``stats.inc_value/set_value`` calls."""

    def run(self) -> list[nodes.Node]:
        rows = [[_code(s.key), ", ".join(f"`{m}`" for m in s.modules)] for s in data.stats()]
        return [_table(["stats key", "counted in"], rows, [50, 50])]


class ComponentsReference(SphinxDirective):
    """What the add-on wires: each component, its setting and order, from ``scrapy_openclaw.addon``."""

    def run(self) -> list[nodes.Node]:
        rows = [
            [_code(c.path), _code(c.setting), "" if c.order is None else str(c.order), c.summary.replace("``", "`")]
            for c in data.components()
        ]
        return [_table(["component", "setting", "order", "what it does"], rows, [30, 20, 6, 44])]


class OptionalTocTree(TocTree):
    """A toctree whose entries may name pages that do not exist (yet): those are left out."""

    def run(self) -> list[nodes.Node]:
        here = posixpath.dirname(self.env.docname)
        kept = [
            line
            for line in self.content
            if not line.strip()
            or line.strip().startswith(":")
            or posixpath.normpath(posixpath.join(here, line.strip())) in self.env.found_docs
        ]
        if not any(line.strip() and not line.strip().startswith(":") for line in kept):
            return []
        self.content.data[:] = kept
        self.content.items[:] = self.content.items[: len(kept)]
        return super().run()


def setup(app: Any) -> dict[str, Any]:
    app.add_crossref_type("setting", "setting", indextemplate="pair: %s; setting")
    app.add_crossref_type("command", "command", indextemplate="pair: %s; command")
    for name, directive in (
        ("openclaw-settings", SettingsReference),
        ("openclaw-policy", PolicyReference),
        ("openclaw-commands", CommandsReference),
        ("openclaw-metrics", MetricsReference),
        ("openclaw-stats", StatsReference),
        ("openclaw-components", ComponentsReference),
        ("optional-toctree", OptionalTocTree),
    ):
        app.add_directive(name, directive)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
