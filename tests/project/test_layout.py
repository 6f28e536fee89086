"""The package layout: stages import only their own stage or a lower one, with no cycle."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "worker"

# The stages, lowest first: a module may import from its own stage or a lower one.
STAGES: list[tuple[str, ...]] = [
    # 0 foundation: what every stage may use
    (
        "worker",
        "worker.errors",
        "worker.clock",
        "worker.aio",
        "worker.logs",
        "worker.urls",
        "worker.provider",
        "worker.config",
    ),
    ("worker.store", "worker.notify", "worker.metrics"),  # 1
    ("worker.ingest",),  # 2
    ("worker.track",),  # 3
    ("worker.rules",),  # 4 pure: foundation only (see RULES_MAY_IMPORT)
    ("worker.act",),  # 5
    # 6 the polls: what the provider lists and details, read as facts for the tracker
    ("worker.poll",),
    # 7 reconciliation: the ledger against the provider's daily report, and the abnormal funds
    # (their poll backs off as the other polls do: worker.poll.backoff)
    ("worker.reconcile",),
    # 8 the scheduler: the leader's lease and when each job runs; the runs are the work of the
    # stages below (the polls, the reconciliation, the deadline check of act, the journal's
    # verification in the store)
    ("worker.schedule",),
    # 9 the service runs the scheduler on every instance (its supervisor keeps the leader's
    # loop, known to the scheduler as a Keeper); the console asks the service
    ("worker.service", "worker.console"),
    ("worker.commands",),  # 10 (register-address's flow among them)
    ("worker.dev",),  # 11
    # 12 the top of the program: the command line imports every command, dev ones included
    ("worker.commands.cli", "worker.__main__"),
]
RULES_STAGE = STAGES.index(("worker.rules",))
RULES_MAY_IMPORT = {0}

# Imports that break the stage order on purpose: none.
ALLOWED_UPWARD: set[tuple[str, str]] = set()


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _target(name: str) -> str | None:
    """The module of worker/ an imported name resolves to (a module, else its package)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path) -> Iterator[tuple[str, int]]:
    """(imported module of worker/, line) for every import, at module level or in a body."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{alias.name}" for alias in node.names] or [base]
            names = [name if _target(name) == name else base for name in names]
        else:
            continue
        for name in names:
            target = _target(name) if name.startswith("worker") else None
            if target is not None and target != module:
                yield target, node.lineno


GRAPH = {module: dict(_imports(module, path)) for module, path in MODULES.items()}


def _stage(module: str) -> int:
    """The highest stage whose prefix names `module` most closely."""
    best, stage = "", -1
    for number, prefixes in enumerate(STAGES):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best):
                best, stage = prefix, number
    assert stage >= 0, f"{module}: no stage in STAGES holds it; add its package there"
    return stage


def _cycles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in GRAPH[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(GRAPH):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles() -> None:
    """No modules of worker/ import each other in a circle (imports inside functions count)."""
    assert _cycles() == []


def test_no_stage_imports_a_higher_one() -> None:
    """Each module imports only its own stage or a lower one (the rules: the foundation only)."""
    offending = []
    for module, imports in sorted(GRAPH.items()):
        stage = _stage(module)
        for target, line in sorted(imports.items()):
            other = _stage(target)
            upward = other > stage or (
                stage == RULES_STAGE and other != RULES_STAGE and other not in RULES_MAY_IMPORT
            )
            if upward and (module, target) not in ALLOWED_UPWARD:
                offending.append(f"{MODULES[module].relative_to(ROOT)}:{line}: imports {target}")
    assert offending == []


def test_core_does_not_import_commands_or_dev() -> None:
    """Nothing outside the command line and the development tools imports either of them."""
    outside = ("worker.commands", "worker.dev", "worker.__main__")
    offending = [
        f"{MODULES[module].relative_to(ROOT)}:{line}: imports {target}"
        for module, imports in sorted(GRAPH.items())
        if not module.startswith(outside)
        for target, line in sorted(imports.items())
        if target.startswith(("worker.commands", "worker.dev"))
    ]
    assert offending == []


# A string constant that starts with one of these is an SQL statement.
SQL_STATEMENT = re.compile(
    r"\s*(SELECT|INSERT|UPDATE|DELETE|CREATE|PRAGMA|BEGIN|SAVEPOINT|ROLLBACK|RELEASE)\b"
)
# Where SQL belongs: the store package, and the sandbox (a provider double with its own storage).
SQL_HOMES = ("worker/store/", "worker/dev/sandbox/")


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
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        if name.startswith(SQL_HOMES):
            continue
        outside += [f"{name}:{line}: {text[:60]!r}" for line, text in sql_statements(path)]
    assert outside == []
    # The check finds statements where they are.
    assert any(sql_statements(ROOT / "worker" / "store" / "events.py"))
