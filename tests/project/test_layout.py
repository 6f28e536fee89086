"""The package layout: the stages keep to their places."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "worker"

# A string constant that starts with one of these is an SQL statement.
SQL_STATEMENT = re.compile(
    r"\s*(SELECT|INSERT|UPDATE|DELETE|CREATE|PRAGMA|BEGIN|SAVEPOINT|ROLLBACK|RELEASE)\b"
)
# Where SQL belongs: the store package, and the sandbox (a provider double with its own storage).
SQL_HOMES = ("worker/store/", "worker/dev/sandbox/")
# TEMPORARY: removed when the act package's statements move
SQL_NOT_YET_MOVED = ("worker/act/",)


def sql_statements(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of each string constant (or f-string's leading text) in the module that
    starts with an SQL statement's keyword."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        text = None
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        elif (
            isinstance(node, ast.JoinedStr)
            and node.values
            and isinstance(node.values[0], ast.Constant)
            and isinstance(node.values[0].value, str)
        ):
            text = node.values[0].value
        if text is not None and SQL_STATEMENT.match(text):
            yield node.lineno, text


def test_sql_lives_in_the_store() -> None:
    """Every SQL statement of the program is in the store package (the sandbox aside), so a
    table's statements are found, and could be served by another database, in one place."""
    outside = []
    for path in sorted(WORKER.rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        if name.startswith(SQL_HOMES + SQL_NOT_YET_MOVED):
            continue
        outside += [f"{name}:{line}: {text[:60]!r}" for line, text in sql_statements(path)]
    assert outside == []
    # The check finds statements where they are.
    assert any(sql_statements(WORKER / "store" / "events.py"))
