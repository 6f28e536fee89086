"""What a function does is said by its arguments: no module of depositd keeps a `ContextVar`
(a value set by a caller up the stack that changes a call below without appearing in it). The
booking travels as an argument (worker/act/kinds/book.py), and a poll's provider calls go
through the client's polls' view (worker/provider/transport.py, `for_polls`)."""

from __future__ import annotations

import ast
from pathlib import Path

WORKER = Path(__file__).resolve().parents[2] / "worker"


def _imports_contextvars(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import) and any(a.name == "contextvars" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "contextvars":
            return True
    return False


def test_no_module_keeps_a_context_variable() -> None:
    with_them = sorted(
        str(path.relative_to(WORKER)) for path in WORKER.rglob("*.py") if _imports_contextvars(path)
    )
    assert with_them == []
