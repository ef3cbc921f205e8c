"""YAML configuration files that remember where each key was written.

Policy files and scheduler task files are validated against a schema after
loading; :class:`Where` turns a bad value's key path into an error naming the
file, the line and the key. Loading is bounded (size, depth, nodes after alias
expansion, time), so a hostile file is refused, never a traceback (docs/security.md).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError

from scrapy_openclaw.exceptions import OpenClawConfigError

#: Largest configuration file read, in bytes.
MAX_BYTES = 4 * 1024 * 1024
#: Deepest nesting of mappings and lists, aliases expanded.
MAX_DEPTH = 50
#: Most nodes (keys, values, list items) in the document, aliases expanded.
MAX_NODES = 200_000
#: Longest time spent parsing, in seconds.
MAX_SECONDS = 5.0
#: Largest integer accepted (|n| < 2**63): beyond it, a value is a typo or an attack.
MAX_INT = 2**63


@dataclass(frozen=True)
class Where:
    """Where a configuration value came from; ``fail`` raises naming file, line and key."""

    source: str
    lines: dict[tuple, int]

    def line(self, path: tuple) -> int | None:
        """The line of *path*, or of its nearest ancestor that has one."""
        for n in range(len(path), -1, -1):
            line = self.lines.get(tuple(path[:n]))
            if line is not None:
                return line
        return None

    def fail(self, path: tuple, message: str) -> None:
        line = self.line(path)
        key = ".".join(str(p) for p in path) or "(top level)"
        loc = f"{self.source}, line {line}" if line is not None else self.source
        raise OpenClawConfigError(f"{loc}: key {key}: {message}")


class _Limited(ComposerError):
    """A load limit was reached (reported like a YAML error, with its line)."""


def _too_deep(mark: Any) -> _Limited:
    return _Limited(None, None, f"nested deeper than {MAX_DEPTH} levels", mark)


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with a depth, node and time budget while composing."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0
        self._deadline = time.monotonic() + MAX_SECONDS

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        self._nodes += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _too_deep(self.peek_event().start_mark)
            if self._nodes > MAX_NODES:
                raise _Limited(None, None, f"more than {MAX_NODES} nodes", self.peek_event().start_mark)
            if self._nodes % 1024 == 0 and time.monotonic() > self._deadline:
                raise _Limited(None, None, f"took longer than {MAX_SECONDS}s to parse", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    # The scanner looks ahead for a simple key over every open flow level, so
    # 3000 nested brackets cost seconds of scanning before the first node is
    # composed: stop the scanner at the depth the composer would refuse anyway.
    def fetch_flow_collection_start(self, TokenClass: Any) -> None:
        if self.flow_level >= MAX_DEPTH:
            raise _too_deep(self.get_mark())
        super().fetch_flow_collection_start(TokenClass)

    def add_indent(self, column: int) -> bool:
        if self.indent < column and len(self.indents) >= MAX_DEPTH:
            raise _too_deep(self.get_mark())
        return super().add_indent(column)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        try:
            value = super().construct_yaml_int(node)
        except ValueError:  # beyond Python's int-str digit limit
            value = None
        if value is None or abs(value) >= MAX_INT:
            raise ConstructorError(None, None, f"integer too large: {str(node.value)[:40]}...", node.start_mark)
        return value


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)


def read_yaml(path: Path, kind: str = "configuration file", *, setting: str = "") -> tuple[Any, dict[tuple, int]]:
    """Parse YAML into plain data plus the line (1-based) of every key path.

    Errors name the file by its absolute path (the working directory resolves a
    relative one) and, when unreadable, the *setting* that names it.
    """
    path = Path(os.path.abspath(path))
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as exc:
        named = f"setting {setting}: " if setting else ""
        raise OpenClawConfigError(f"{named}cannot read {kind} {path}: {exc.strerror}") from None
    return load_yaml_bytes(raw, str(path), kind)


def load_yaml_bytes(raw: bytes, path: str, kind: str = "configuration file") -> tuple[Any, dict[tuple, int]]:
    """:func:`read_yaml` on the first ``MAX_BYTES + 1`` bytes of a file already read; errors name *path*."""
    if len(raw) > MAX_BYTES:
        raise OpenClawConfigError(f"{path}: {kind} is larger than {MAX_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise OpenClawConfigError(
            f"{path}, line {line}: {kind} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})"
        ) from None
    return load_yaml_text(text, path)


def load_yaml_text(text: str, source: str) -> tuple[Any, dict[tuple, int]]:
    """:func:`read_yaml` on text already read; errors name *source*."""
    try:
        loader = _BoundedLoader(text)
        try:
            node = loader.get_single_node()
            lines: dict[tuple, int] = {}
            if node is None:
                return None, lines
            _check_graph(node, source)
            _record_lines(loader, node, (), lines, source)
            data = loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = f", line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise OpenClawConfigError(f"{source}{line}: invalid YAML: {problem}") from None
    except RecursionError:  # pragma: no cover - the depth limit comes first
        raise OpenClawConfigError(f"{source}: invalid YAML: nested too deeply") from None
    return data, lines


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _check_graph(root: yaml.Node, source: str) -> None:
    """Refuse recursive aliases and documents too big or too deep once aliases are expanded.

    Iterative, and each node is measured once (shared by its aliases), so the
    check itself is linear in the file however much the aliases would expand.
    """
    measured: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded nodes, depth)
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        nid = id(node)
        if done:
            on_path.discard(nid)
            kids = [measured[id(k)] for k in _children(node)]
            size = 1 + sum(k[0] for k in kids)
            depth = 1 + max((k[1] for k in kids), default=0)
            where = f"{source}, line {node.start_mark.line + 1}"
            if size > MAX_NODES:
                raise OpenClawConfigError(
                    f"{where}: invalid YAML: aliases expand to more than {MAX_NODES} nodes (an alias bomb?)"
                )
            if depth > MAX_DEPTH:
                raise OpenClawConfigError(f"{where}: invalid YAML: aliases nest deeper than {MAX_DEPTH} levels")
            measured[nid] = (size, depth)
            continue
        if nid in measured:
            continue
        if nid in on_path:
            raise OpenClawConfigError(
                f"{source}, line {node.start_mark.line + 1}: invalid YAML: an alias refers to itself "
                "(recursive structures are not supported)"
            )
        on_path.add(nid)
        stack.append((node, True))
        stack.extend((k, False) for k in _children(node) if id(k) not in measured)


def _record_lines(loader: _BoundedLoader, node: yaml.Node, path: tuple, lines: dict[tuple, int], source: str) -> None:
    """Note the line of every key path; refuse complex and duplicate keys."""
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        merged: dict[tuple, int] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if not isinstance(key_node, yaml.ScalarNode):
                raise OpenClawConfigError(
                    f"{source}, line {line}: invalid YAML: a key must be a plain value, not a "
                    f"{'list' if isinstance(key_node, yaml.SequenceNode) else 'mapping'}"
                )
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: its keys yield to explicit ones
                _record_lines(loader, value_node, path, merged, source)
                continue
            key = loader.construct_object(key_node)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable scalar (a !!binary key, say)
                raise OpenClawConfigError(f"{source}, line {line}: invalid YAML: unusable key") from None
            kpath = (*path, key)
            if first is not None:
                shown = ".".join(str(p) for p in kpath)
                raise OpenClawConfigError(
                    f"{source}, line {line}: key {shown}: duplicate key (first set on line {first})"
                )
            seen[key] = line
            lines[kpath] = line
            _record_lines(loader, value_node, kpath, lines, source)
        for kpath, line in merged.items():
            lines.setdefault(kpath, line)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _record_lines(loader, item, (*path, index), lines, source)
