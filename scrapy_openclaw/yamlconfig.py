"""YAML configuration files that remember where each key was written.

Policy files and scheduler task files are validated against a schema after
loading; when a value is wrong, :class:`Where` turns its key path into an
error that names the file, the line and the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from scrapy_openclaw.errors import OpenClawConfigError


@dataclass(frozen=True)
class Where:
    """Where a configuration value came from; ``fail`` raises naming file, line and key."""

    source: str
    lines: dict[tuple, int]

    def fail(self, path: tuple, message: str) -> None:
        line = None
        for n in range(len(path), -1, -1):
            line = self.lines.get(tuple(path[:n]))
            if line is not None:
                break
        key = ".".join(str(p) for p in path) or "(top level)"
        loc = f"{self.source}, line {line}" if line is not None else self.source
        raise OpenClawConfigError(f"{loc}: key {key}: {message}")


def read_yaml(path: Path, kind: str = "configuration file") -> tuple[Any, dict[tuple, int]]:
    """Parse YAML into plain data plus the line (1-based) of every key path."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise OpenClawConfigError(f"{path}: cannot read {kind}: {exc.strerror}") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = f", line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise OpenClawConfigError(f"{path}{line}: invalid YAML: {problem}") from None
    lines: dict[tuple, int] = {}
    if node is None:
        return None, lines
    _record_lines(node, (), lines)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:  # pragma: no cover - compose already parsed it
        raise OpenClawConfigError(f"{path}: invalid YAML: {exc}") from None
    return data, lines


def _record_lines(node: yaml.Node, path: tuple, lines: dict[tuple, int]) -> None:
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value
            lines[(*path, key)] = key_node.start_mark.line + 1
            _record_lines(value_node, (*path, key), lines)
