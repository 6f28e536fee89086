"""The store's errors are the only database errors callers catch: a driver's own exceptions are
caught only where that driver is driven, and PostgreSQL's code never names a `sqlite3` one
(worker/store/errors.py)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "worker"

# Where SQLite itself is driven and its errors become the store's (the connection and its
# cursors, the mapping), and the sandbox's own store, which is no part of depositd's.
SQLITE_MODULES = {"worker/store/sqlite.py", "worker/store/errors.py", "worker/dev/sandbox/store.py"}
# Where psycopg is driven and its errors become the store's.
POSTGRES_MODULES = {"worker/store/pg.py", "worker/store/errors.py"}


def _modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield str(path.relative_to(ROOT)), ast.parse(path.read_text(), str(path))


def _names(node: ast.expr | None) -> Iterator[str]:
    """The dotted names an exception expression mentions (`except (a.B, C)`)."""
    if node is None:
        return
    for part in node.elts if isinstance(node, ast.Tuple) else [node]:
        yield ast.unparse(part)


def _caught(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(line, name) of every exception an `except` or `contextlib.suppress(...)` catches."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ExceptHandler):
            for name in _names(node.type):
                yield node.lineno, name
        elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith("suppress"):
            for arg in node.args:
                for name in _names(arg):
                    yield node.lineno, name


def _catching(driver: str, allowed: set[str]) -> list[str]:
    return [
        f"{module}:{line}: catches {name}"
        for module, tree in _modules()
        if module not in allowed
        for line, name in _caught(tree)
        if name == driver or name.startswith(f"{driver}.")
    ]


def test_only_the_sqlite_modules_catch_sqlite3_errors() -> None:
    """Callers catch the store's errors (`worker.store.errors`), whatever the engine."""
    assert _catching("sqlite3", SQLITE_MODULES) == []


def test_only_the_postgresql_modules_catch_psycopg_errors() -> None:
    """psycopg's errors become the store's where psycopg is driven, nowhere else."""
    assert _catching("psycopg", POSTGRES_MODULES) == []


def test_postgresql_code_names_no_sqlite3_exception() -> None:
    """No `sqlite3` exception is raised, caught or built by the PostgreSQL modules."""
    named = [
        f"{module}:{node.lineno}: {ast.unparse(node)}"
        for module, tree in _modules()
        if module in {"worker/store/pg.py", "worker/store/pgstore.py"}
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and ast.unparse(node.value) == "sqlite3"
    ]
    assert named == []
