"""YAML checks shared by the rule and profile loaders: key paths, duplicate keys, `on:` keys."""

from __future__ import annotations

import difflib
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import yaml

from worker.yamlsrc import Loc, YamlSource


def dotted(loc: Sequence[str | int]) -> str:
    """`('rules', 0, 'on')` -> `rules[0].on`."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def known(values: Collection[str]) -> str:
    """`(known: a, b, c)`."""
    return f"(known: {', '.join(values)})"


def suggest(word: str, values: Collection[str]) -> str:
    close = difflib.get_close_matches(word, list(values), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def duplicate_keys(text: str, path: Path) -> list[str]:
    """`file:line` problems for mapping keys given twice (plain YAML keeps the last silently)."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return []  # the parse itself reports it
    found: list[tuple[int, str]] = []
    todo: list[yaml.Node] = [root] if root is not None else []
    while todo:
        node = todo.pop()
        if isinstance(node, yaml.MappingNode):
            seen: dict[str, int] = {}
            for key_node, value_node in node.value:
                line = key_node.start_mark.line + 1
                if isinstance(key_node, yaml.ScalarNode):
                    if key_node.value in seen:
                        first = seen[key_node.value]
                        found.append(
                            (line, f"key {key_node.value!r} is given twice (first at line {first})")
                        )
                    else:
                        seen[key_node.value] = line
                todo.append(value_node)
        elif isinstance(node, yaml.SequenceNode):
            todo.extend(node.value)
    return [f"{path}:{line}: {message}" for line, message in sorted(found)]


_BOOL_WORDS = {True: ("on", "yes", "y", "true"), False: ("off", "no", "n", "false")}


def restore_bool_keys(data: Any, src: YamlSource, loc: Loc = ()) -> Any:
    """Give back the text of keys YAML 1.1 read as booleans: `on:` (SPEC's trigger key) is True.

    The key's own text comes from the line index, which keeps every key as written.
    """
    if isinstance(data, list):
        return [restore_bool_keys(item, src, (*loc, i)) for i, item in enumerate(data)]
    if not isinstance(data, dict):
        return data
    out: dict[Any, Any] = {}
    for key, value in data.items():
        name = key
        if isinstance(key, bool):
            texts = [
                k[-1]
                for k in src.lines
                if len(k) == len(loc) + 1
                and k[: len(loc)] == loc
                and isinstance(k[-1], str)
                and k[-1].lower() in _BOOL_WORDS[key]
            ]
            name = texts[0] if texts else key
        out[name] = restore_bool_keys(value, src, (*loc, name))
    return out
