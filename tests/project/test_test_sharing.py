"""The tests share code only through tests/support and the conftest files: no module under
tests/ imports a test module or another helper module beside it, and pytest needs no
`pythonpath` entries to find what is shared (docs/testing.md, "Shared test code")."""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
SUPPORT = TESTS / "support"


def imported(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(line, module) of every import in a module, at the top or inside a function; a relative
    import as its dots and name."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            yield node.lineno, "." * node.level + (node.module or "")


def local_names() -> set[str]:
    """What a module under tests/ could import another one by, outside tests/support: the
    names of the modules and folders there (pytest puts each test module's folder on
    `sys.path`)."""
    names = set()
    for path in TESTS.rglob("*.py"):
        if SUPPORT in path.parents or path.name in ("__init__.py", "conftest.py"):
            continue
        names.add(path.stem)
    names.update(p.name for p in TESTS.iterdir() if p.is_dir() and p != SUPPORT)
    return names - {"__pycache__"}


def crossings(path: Path, names: set[str]) -> list[str]:
    """The imports of one module that reach past tests/support, as "LINE: imports MODULE"."""
    found = []
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for line, module in imported(tree):
        head = module.split(".")[0]
        shared = module == "tests.support" or module.startswith("tests.support.")
        if module.startswith(".") or head in names or (head == "tests" and not shared):
            found.append(f"{line}: imports {module}")
    return found


def test_modules_under_tests_share_code_only_through_tests_support() -> None:
    """Every module under tests/ (test modules, conftest files, tests/support itself) imports
    from tests/ only what tests/support holds."""
    names = local_names()
    found = [
        f"{path.relative_to(ROOT)}:{crossing}"
        for path in sorted(TESTS.rglob("*.py"))
        for crossing in crossings(path, names)
    ]
    assert found == [], "move what is shared into tests/support:\n" + "\n".join(found)


def test_the_check_sees_an_import_of_a_test_module(tmp_path: Path) -> None:
    """The check above finds an import of a test module by its bare name (as the folders on
    `sys.path` allowed), by its package path, and relative to the importing module."""
    module = tmp_path / "test_example.py"
    module.write_text(
        "import test_ops\n"
        "from tests.commands.test_ops import cli\n"
        "from .test_ingress import deposit_event\n"
        "from tests.support.configs import make_config\n"
        "def later():\n"
        "    from livestack import LiveStack\n"
    )
    assert crossings(module, {"test_ops", "test_ingress", "livestack"}) == [
        "1: imports test_ops",
        "2: imports tests.commands.test_ops",
        "3: imports .test_ingress",
        "6: imports livestack",
    ]


def test_pytest_has_no_pythonpath_entries() -> None:
    """pytest finds tests/support through the `tests` package alone: pyproject.toml gives it no
    `pythonpath` (which let test modules import each other by bare name)."""
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "pythonpath" not in options
