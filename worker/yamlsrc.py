"""YAML loading that remembers where each key sits, so errors can name file and line."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

Loc = tuple[str | int, ...]


class YamlSource:
    """A parsed YAML document plus the line of every mapping key and sequence item."""

    def __init__(self, path: Path, data: Any, lines: dict[Loc, int]) -> None:
        self.path = path
        self.data = data
        self.lines = lines

    def line(self, loc: Sequence[str | int]) -> int:
        """The line of the deepest known prefix of `loc` (1-based; 1 when nothing matches)."""
        key: Loc = tuple(loc)
        while key:
            if key in self.lines:
                return self.lines[key]
            key = key[:-1]
        return self.lines.get((), 1)

    def where(self, loc: Sequence[str | int]) -> str:
        """`file:line` for a location in the document."""
        return f"{self.path}:{self.line(loc)}"


def _walk(node: yaml.Node, loc: Loc, lines: dict[Loc, int]) -> None:
    lines.setdefault(loc, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key: str | int = key_node.value
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag.endswith(":int"):
                # YAML ints include 0x.., 0o.., 1_000 and 1:30; read them as safe_load does.
                key = int(yaml.SafeLoader("").construct_yaml_int(key_node))
            lines[(*loc, key)] = key_node.start_mark.line + 1
            _walk(value_node, (*loc, key), lines)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            lines[(*loc, index)] = item.start_mark.line + 1
            _walk(item, (*loc, index), lines)


def load(path: Path) -> YamlSource:
    """Read and parse a YAML file; `yaml.YAMLError` and `OSError` propagate."""
    text = path.read_text(encoding="utf-8")
    return loads(text, path)


def loads(text: str, path: Path) -> YamlSource:
    """Parse YAML text that came from `path`."""
    node = yaml.compose(text, Loader=yaml.SafeLoader)
    lines: dict[Loc, int] = {}
    if node is not None:
        _walk(node, (), lines)
    data = yaml.safe_load(text)
    return YamlSource(path, data, lines)


def yaml_error(path: Path, exc: yaml.YAMLError) -> str:
    """A one-line message for a YAML syntax error, with file and line."""
    mark = getattr(exc, "problem_mark", None)
    line = mark.line + 1 if mark is not None else 1
    problem = getattr(exc, "problem", None) or str(exc)
    return f"{path}:{line}: invalid YAML: {problem}"
