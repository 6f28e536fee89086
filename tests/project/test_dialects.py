"""Each statement is written in the SQL of the engine that runs it: nothing in the store rewrites
SQL text at run time but the placeholders (`worker.store.pg.placeholders`, `?` -> `$n`)."""

from __future__ import annotations

import ast
from pathlib import Path

STORE = Path(__file__).resolve().parents[2] / "worker" / "store"


def _imports(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_store_rewrites_no_sql_with_regular_expressions() -> None:
    """No module of the store imports `re` (the store's text is SQL and names), and the
    PostgreSQL adapter has no translator left."""
    with_re = sorted(
        str(path.relative_to(STORE))
        for path in STORE.rglob("*.py")
        if "re" in _imports(ast.parse(path.read_text()))
    )
    assert with_re == []
    pg = ast.parse((STORE / "pg.py").read_text())
    defined = {n.name for n in ast.walk(pg) if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    assert "translate" not in defined


# SQLite before 3.39 (Ubuntu 22.04 has 3.37) has no `IS [NOT] DISTINCT FROM`; the supported
# systems are in deploy/README.md. RETURNING (3.35) and ON CONFLICT (3.24) they have.
_NEWER_SQLITE = ("DISTINCT FROM",)


def _postgres_only(tree: ast.Module) -> set[int]:
    """The ids of the string constants that are the PostgreSQL half of a per-engine pair, or a
    docstring."""
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "postgres":
                    ids.update(id(n) for n in ast.walk(value))
    return ids


def test_sqlite_statements_run_on_the_oldest_supported_sqlite() -> None:
    """No statement SQLite runs uses what SQLite 3.37 lacks: such text is only in the
    PostgreSQL half of a pair."""
    found = []
    for path in sorted(STORE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        skip = _postgres_only(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in skip
                and any(word in node.value for word in _NEWER_SQLITE)
            ):
                found.append(f"{path.name}:{node.lineno}")
    assert found == []
