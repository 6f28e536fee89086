"""The command line loads what a command needs when it runs: `--help` and `status` start without
the web stack, the provider client, the rule engine or the writer (what made them slow)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import sqlite_utils

from worker.commands.cli import COMMANDS, build_parser, command
from worker.store.sqlitestore import migrate

ROOT = Path(__file__).resolve().parents[2]
# Loaded by none of the quick commands: the web server and client, the provider client, the
# rule engine and tracker models, the writer's sqlite-utils, PostgreSQL's driver, structlog.
HEAVY = (
    "aiohttp",
    "worker.provider.client",
    "worker.rules",
    "worker.track.tracker",
    "sqlite_utils",
    "psycopg",
    "structlog",
)
PROBE = """
import json, sys
from worker.commands.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def _loaded(*argv: str) -> tuple[int, set[str], str]:
    """Run the command line in a fresh interpreter: its exit status, the modules it loaded and
    its standard output."""
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    report = json.loads(result.stderr.strip().splitlines()[-1])
    return report["code"], set(report["modules"]), result.stdout


def test_every_command_names_a_function_that_exists() -> None:
    """Each command of the table resolves to a function, and the parser has every command."""
    parser_commands = set(build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    assert parser_commands == set(COMMANDS)
    for name, target in COMMANDS.items():
        module, _, function = target.partition(":")
        assert callable(getattr(importlib.import_module(module), function)), name
        assert command(name) is getattr(importlib.import_module(module), function)


def test_help_loads_no_command(tmp_path: Path) -> None:
    """`depositd --help` prints every command without importing any of them."""
    code, modules, out = _loaded("--help")
    assert code == 0 and "status" in out and "sandbox" in out
    assert [m for m in HEAVY if m in modules] == []
    assert "pydantic" not in modules and "yaml" not in modules
    assert not any(m.startswith("worker.commands.") and m != "worker.commands.cli" for m in modules)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """A sandbox setup (`init --sandbox`) with its database created."""
    subprocess.run(
        [sys.executable, "-m", "worker", "init", "--sandbox", str(tmp_path / "s")],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=60,
    )
    db = sqlite_utils.Database(tmp_path / "s" / "depositd.db")
    migrate(db)
    db.close()
    return tmp_path / "s" / "depositd.yaml"


def test_status_loads_neither_the_web_stack_nor_the_writer(config: Path) -> None:
    """`depositd status` reads the database with the settings and the table modules alone."""
    code, modules, out = _loaded("status", "--config", str(config))
    assert code == 0, out
    assert json.loads(out)["running"] is False
    assert [m for m in HEAVY if m in modules] == []


def test_a_command_that_logs_still_logs_to_stderr(config: Path) -> None:
    """Logging set up late (when the first module that logs loads) still sends log lines to
    stderr at warning: `check` loads structlog and prints only its verdict on stdout."""
    result = subprocess.run(
        [sys.executable, "-m", "worker", "check", "--config", str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok: ")
    code, modules, _ = _loaded("check", "--config", str(config))
    assert code == 0 and "structlog" in modules
