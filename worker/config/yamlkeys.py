"""YAML checks shared by the rule and profile loaders: duplicate keys, lists of known names."""

from __future__ import annotations

import difflib
from collections.abc import Collection

from worker.config.yamlsrc import YamlSource


def known(values: Collection[str]) -> str:
    """`(known: a, b, c)`."""
    return f"(known: {', '.join(values)})"


def suggest(word: str, values: Collection[str]) -> str:
    """`; did you mean 'x'?` for the known value closest to `word` (case aside), or nothing."""
    same = [value for value in values if value.lower() == word.lower()]
    close = same or difflib.get_close_matches(word, list(values), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def duplicate_keys(src: YamlSource) -> list[str]:
    """`file:line` problems for keys given twice in one mapping (plain YAML keeps the last).

    Keys compare as the data holds them, so `1001:` and `0x3E9:`, or `on:` and `"on":` in a
    rules file, are the same key given twice.
    """
    return [f"{src.path}:{line}: {message}" for line, message in sorted(src.duplicates)]
