"""YAML loading that remembers where each key sits, so errors can name file and line.

Two departures from `yaml.safe_load`, both so a config file cannot crash the worker:

- Unquoted dates stay text. The only dates depositd reads are payer birthdays, which the
  provider takes as `yyyy-MM-dd` strings and the payer checks validate as such; YAML 1.1
  would turn `1990-02-28` into a `date` and make `1990-02-30` a construction crash instead
  of a "not a real date" problem on the field.
- A value YAML parses but cannot build (`!!int abc`, a sexagesimal float too large for a
  float) is a `ConfigError` naming file, line and key, never a `ValueError` from inside
  PyYAML. The message never repeats the value: profiles hold personal data.

PyYAML has no public API for either: dropping one implicit resolver means a copy of
`yaml_implicit_resolvers` without it (PyYAML's own `add_implicit_resolver` can only add), and
going on after a failed node means resetting the constructor's bookkeeping
(`constructed_objects`, `recursive_objects`, `deep_construct`). Both have been the same since
PyYAML 3; pyproject.toml bounds PyYAML below 7 and the locks pin it, so a change there shows in
the rule and profile loader tests before it ships.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

import yaml

from worker.errors import ConfigError

Loc = tuple[str | int, ...]
Key = Any  # a mapping key as the loaded data holds it: str, int, float, bool, None, bytes

_TAG = "tag:yaml.org,2002:"
_KINDS = {"int": "an integer", "float": "a number", "bool": "a boolean", "timestamp": "a date"}


def dotted(loc: Sequence[Key]) -> str:
    """`('rules', 0, 'on')` -> `rules[0].on`."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


class _Loader(yaml.SafeLoader):
    """`SafeLoader` without implicit dates that records values it cannot build instead of raising.

    Construction is always deep, so an exception belongs to the innermost node being built;
    that node becomes None and the load goes on, so one file reports all its bad values.
    """

    yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != f"{_TAG}timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.unbuilt: list[yaml.Node] = []

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        deep_before = self.deep_construct
        try:
            return super().construct_object(node, deep=True)
        except yaml.YAMLError:
            raise
        except Exception:
            # PyYAML left its bookkeeping mid-node; put it back as if the node were None.
            self.recursive_objects.pop(node, None)
            self.deep_construct = deep_before
            self.constructed_objects[node] = None
            self.unbuilt.append(node)
            return None


class YamlSource:
    """A parsed YAML document plus the line of every mapping key and sequence item."""

    def __init__(
        self,
        path: Path,
        data: Any,
        lines: dict[Loc, int],
        duplicates: list[tuple[int, str]] | None = None,
    ) -> None:
        self.path = path
        self.data = data
        self.lines = lines
        # (line, message) for keys that read as a key already in the same mapping.
        self.duplicates = duplicates or []

    def line(self, loc: Sequence[Key]) -> int:
        """The line of the deepest known prefix of `loc` (1-based; 1 when nothing matches)."""
        key: Loc = tuple(loc)
        while key:
            if key in self.lines:
                return self.lines[key]
            key = key[:-1]
        return self.lines.get((), 1)

    def where(self, loc: Sequence[Key]) -> str:
        """`file:line` for a location in the document."""
        return f"{self.path}:{self.line(loc)}"


class _Walk:
    """One pass over the composed tree: lines, duplicate keys, and where each node sits."""

    def __init__(self, loader: _Loader, bool_keys_as_text: bool) -> None:
        self.loader = loader
        self.bool_keys_as_text = bool_keys_as_text
        self.lines: dict[Loc, int] = {}
        self.duplicates: list[tuple[int, str]] = []
        self.locs: dict[yaml.Node, Loc] = {}
        self.open: set[yaml.Node] = set()  # the nodes above this one: an alias may loop back

    def key(self, node: yaml.ScalarNode) -> tuple[Key, bool]:
        """The key as the data will hold it, and whether it is a real key (built, not merge)."""
        if node.tag == f"{_TAG}merge":
            return node.value, False
        if self.bool_keys_as_text and node.tag == f"{_TAG}bool":
            node.tag = f"{_TAG}str"  # the key keeps its text: `on:` is "on", `On:` is "On"
        failed = len(self.loader.unbuilt)
        key = self.loader.construct_object(node, deep=True)
        if len(self.loader.unbuilt) > failed or not isinstance(key, Hashable):
            return node.value, False
        return key, True

    def walk(self, node: yaml.Node, loc: Loc) -> None:
        self.locs.setdefault(node, loc)
        self.lines.setdefault(loc, node.start_mark.line + 1)
        if node in self.open:
            return  # construction refuses the loop with its line
        self.open.add(node)
        if isinstance(node, yaml.MappingNode):
            seen: dict[Key, tuple[int, str]] = {}
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    continue  # a list or mapping as a key: construction refuses it with its line
                line = key_node.start_mark.line + 1
                self.locs.setdefault(key_node, (*loc, key_node.value))
                key, real = self.key(key_node)
                if real and key in seen:
                    first, text = seen[key]
                    also = f" as {text!r}" if text != key_node.value else ""
                    message = f"key {key_node.value!r} is given twice (first at line {first}{also})"
                    self.duplicates.append((line, message))
                elif real:
                    seen[key] = (line, key_node.value)
                self.lines[(*loc, key)] = line
                self.walk(value_node, (*loc, key))
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                self.lines[(*loc, index)] = item.start_mark.line + 1
                self.walk(item, (*loc, index))
        self.open.discard(node)


def load(path: Path, *, bool_keys_as_text: bool = False) -> YamlSource:
    """Read and parse a YAML file; `yaml.YAMLError`, `OSError` and `ConfigError` propagate."""
    text = path.read_text(encoding="utf-8")
    return loads(text, path, bool_keys_as_text=bool_keys_as_text)


def loads(text: str, path: Path, *, bool_keys_as_text: bool = False) -> YamlSource:
    """Parse YAML text that came from `path`.

    A syntax error raises `yaml.YAMLError`; values that cannot be built raise `ConfigError`
    with one `file:line: key: ...` problem each. `bool_keys_as_text` keeps mapping keys YAML 1.1
    reads as booleans (`on`, `yes`, `Off`) as the text written, for files whose keys are names.
    """
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        walk = _Walk(loader, bool_keys_as_text)
        data = None
        if node is not None:
            walk.walk(node, ())
            data = loader.construct_document(node)
    finally:
        loader.dispose()
    if loader.unbuilt:
        problems = []
        for bad in sorted(loader.unbuilt, key=lambda n: n.start_mark.index):
            kind = _KINDS.get(bad.tag.removeprefix(_TAG), bad.tag)
            where = f"{path}:{bad.start_mark.line + 1}: {dotted(walk.locs.get(bad, ()))}"
            problems.append(f"{where}: invalid YAML: the value cannot be read as {kind}")
        raise ConfigError(problems)
    return YamlSource(path, data, walk.lines, walk.duplicates)


# PyYAML's words for a syntax error -> what the writer most likely did and how to fix it.
_PLAIN = (
    (
        "mapping values are not allowed",
        "a `key: value` where none can start: indent this line like the keys next to it,"
        ' or quote a value that holds ": "',
    ),
    (
        "could not find expected ':'",
        "a line that is not `key: value`: add the colon, or indent it like the keys next to it",
    ),
    (
        "expected <block end>",
        "this line's indentation matches no line above: indent it like the keys next to it",
    ),
    ("cannot start any token", "a tab or a reserved character (@, `): indent with spaces"),
    ("found unexpected end of stream", "a quote or bracket opened and never closed"),
    ("did not find expected key", "a line indented unlike the keys next to it"),
    ("found duplicate anchor", "an anchor (&name) defined twice"),
    ("found undefined alias", "an alias (*name) with no anchor (&name) before it"),
)


def yaml_error(path: Path, exc: yaml.YAMLError) -> str:
    """A one-line message for a YAML syntax error: file, line, column and plain words."""
    mark = getattr(exc, "problem_mark", None)
    line = mark.line + 1 if mark is not None else 1
    column = f" (column {mark.column + 1})" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc)
    words = next((plain for known, plain in _PLAIN if known in problem), problem)
    return f"{path}:{line}: invalid YAML{column}: {words}"
