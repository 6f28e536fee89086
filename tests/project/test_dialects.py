"""Each statement is written in the SQL of the engine that runs it: nothing in the store rewrites
SQL text at run time but the placeholders (`worker.store.pg.placeholders`, `?` -> `%s`)."""

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
