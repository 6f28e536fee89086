"""The `processes` fixture's owner: what a test started is gone once it ended, failed or not."""

from __future__ import annotations

import ast
import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT
from tests.support.processes import Processes, ServeProcess, children, cli

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


class Silent(ServeProcess):
    """A "serve" that never answers /healthz (a sleeper), given up on after half a second."""

    async def spawn(self) -> asyncio.subprocess.Process:
        self.log.touch()
        self.proc = await asyncio.create_subprocess_exec(*SLEEPER)
        return self.proc

    async def start(self, timeout_s: float = 0.5) -> None:
        await super().start(timeout_s)


async def test_what_a_failing_test_started_is_killed_and_reaped(tmp_path: Path) -> None:
    """A test that fails with a command, a Popen, a serve and a process it waits for still
    running: the teardown kills and reaps the running ones, closes the Popen's pipes and leaves
    the finished one alone."""
    owned = Processes()
    command = owned.own(await asyncio.create_subprocess_exec(*SLEEPER))
    popen = owned.own(subprocess.Popen(SLEEPER, stdout=subprocess.PIPE))  # noqa: ASYNC220
    serve = owned.own(Silent(tmp_path / "depositd.yaml", 9, tmp_path / "serve.log"))
    await serve.spawn()
    done = owned.own(await asyncio.create_subprocess_exec(sys.executable, "-c", "pass"))
    assert await done.wait() == 0
    with pytest.raises(AssertionError, match="the test fails"):
        try:
            raise AssertionError("the test fails")
        finally:
            await owned.kill_all()
    assert command.returncode == -signal.SIGKILL
    assert popen.poll() == -signal.SIGKILL
    assert popen.stdout is not None and popen.stdout.closed
    assert serve.proc is not None and serve.proc.returncode == -signal.SIGKILL
    assert done.returncode == 0


async def test_a_serve_that_never_answers_is_not_left_running(tmp_path: Path) -> None:
    """`async with` a serve that does not come up: the start fails and the process is gone."""
    serve = Silent(tmp_path / "depositd.yaml", 9, tmp_path / "serve.log")
    with pytest.raises(AssertionError, match="serve did not start"):
        async with serve:
            pass
    assert serve.proc is not None and serve.proc.returncode == -signal.SIGKILL


async def test_a_command_out_of_time_is_killed(tmp_path: Path) -> None:
    """`cli` that runs out of its time: the error, and the command is no longer running."""
    config = tmp_path / "depositd.yaml"
    with pytest.raises(TimeoutError):
        await cli(config, "status", within=0.01)  # not even Python starts that fast
    assert [pid for pid in children(os.getpid()) if str(config) in command_line(pid)] == []


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


# What a test module may not start but through its owner (the `processes` fixture, a
# `Processes`): the one module that spawns for the owner, and this test of it.
TESTS = ROOT / "tests"
SPAWNER = TESTS / "support" / "processes.py"
EXEMPT = {SPAWNER, Path(__file__).resolve()}
# Started only as the direct argument of an `.own(...)` call (`await` allowed between).
SPAWNS = {"asyncio.create_subprocess_exec", "asyncio.create_subprocess_shell", "subprocess.Popen"}
# A `serve` process: `processes.serve(...)`, `processes.own(...)` or an `async with` item
# (its exit kills the process, also when the test is cancelled by its timeout).
SERVE = "tests.support.processes.ServeProcess"
# Bounded only by a `timeout=` keyword (the child is killed when it runs out).
BOUNDED = {"subprocess.run", "subprocess.check_output", "subprocess.check_call", "subprocess.call"}
# Children no owner can take: start them with `Popen` and own it.
UNOWNABLE = {
    "os.fork",
    "os.forkpty",
    "pty.fork",
    "pty.spawn",
    "os.system",
    "os.popen",
    "os.posix_spawn",
    "os.posix_spawnp",
    "os.spawnl",
    "os.spawnle",
    "os.spawnlp",
    "os.spawnlpe",
    "os.spawnv",
    "os.spawnve",
    "os.spawnvp",
    "os.spawnvpe",
}
# Starts that break the rules above on purpose, by file and call, with the reason.
ALLOWED: dict[tuple[str, str], str] = {
    ("tests/support/machine.py", "subprocess.Popen"): "the container outlives one test (a"
    " module's fixture): `Machine.close` powers it off and kills its process group, called by"
    " that fixture's `finally` and by the constructor when the boot fails",
}


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def _aliases(tree: ast.Module) -> dict[str, str]:
    """Each name a module imports, to the dotted name it stands for."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    names[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _dotted(node: ast.expr, names: dict[str, str], local: str) -> str | None:
    """The dotted name an expression stands for (`asyncio.subprocess.X` read as `asyncio.X`)."""
    if isinstance(node, ast.Name):
        return names.get(node.id, f"{local}.{node.id}")
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value, names, local)
        if base is None:
            return None
        return f"{base}.{node.attr}".replace("asyncio.subprocess.", "asyncio.")
    return None


def _test_modules() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(), str(path)) for path in sorted(TESTS.rglob("*.py"))}


def _serve_classes(modules: dict[Path, ast.Module]) -> set[str]:
    """`ServeProcess` and every class of the tests derived from it (`Service`)."""
    found = {SERVE}
    grew = True
    while grew:
        grew = False
        for path, tree in modules.items():
            names, local = _aliases(tree), _module_name(path)
            for node in ast.walk(tree):
                if not isinstance(node, ast.ClassDef) or f"{local}.{node.name}" in found:
                    continue
                if any(_dotted(base, names, local) in found for base in node.bases):
                    found.add(f"{local}.{node.name}")
                    grew = True
    return found


def _parents(tree: ast.Module) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _owned(call: ast.Call, parents: dict[ast.AST, ast.AST]) -> bool:
    """The call is the direct argument of an `.own(...)` call (through an `await`)."""
    node: ast.AST = call
    if isinstance(parents.get(node), ast.Await):
        node = parents[node]
    owner = parents.get(node)
    return (
        isinstance(owner, ast.Call)
        and isinstance(owner.func, ast.Attribute)
        and owner.func.attr == "own"
        and node in owner.args
    )


def _in_with(call: ast.Call, parents: dict[ast.AST, ast.AST], kind: type[ast.AST]) -> bool:
    """The call is (inside) the context expression of a `with` (`kind`) item."""
    node: ast.AST = call
    while node in parents:
        parent = parents[node]
        if isinstance(parent, ast.withitem):
            return parent.context_expr is node and isinstance(parents.get(parent), kind)
        if not isinstance(parent, ast.Call | ast.Await):
            return False
        node = parent
    return False


def _problems(tree: ast.Module, local: str, serves: set[str]) -> list[tuple[int, str, str]]:
    """Each start in the module (`local` its dotted name) with no owner or bound, by line: the
    line, what it calls, the problem."""
    names, parents = _aliases(tree), _parents(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _dotted(node.func, names, local)
            problem = None
            if name in SPAWNS and not _owned(node, parents):
                problem = f"{name} not started as the argument of `processes.own(...)`"
            elif name in SPAWNS and _in_with(node, parents, ast.With):
                problem = f"{name} as a `with` item (its exit waits for the process)"
            elif (
                name in serves
                and not _owned(node, parents)
                and not _in_with(node, parents, ast.AsyncWith)
            ):
                problem = f"{name} neither owned (`processes.own`) nor an `async with` item"
            elif name in BOUNDED and not any(k.arg == "timeout" for k in node.keywords):
                problem = f"{name} without `timeout=`"
            elif name in UNOWNABLE:
                problem = f"{name}: no owner can take that child (start it with Popen)"
            if problem:
                found.append((node.lineno, str(name), problem))
        elif isinstance(node, ast.Name | ast.Attribute):
            # `subprocess.run` handed to a caller (`asyncio.to_thread`) takes its timeout there.
            name, caller = _dotted(node, names, local), parents.get(node)
            if name not in BOUNDED or isinstance(caller, ast.Attribute):
                continue
            if isinstance(caller, ast.Call) and (
                caller.func is node or any(k.arg == "timeout" for k in caller.keywords)
            ):
                continue
            found.append((node.lineno, str(name), f"{name} handed on without `timeout=`"))
    return sorted(found)


def test_every_process_a_test_starts_has_an_owner_or_a_bound() -> None:
    """No test module starts a child that could outlive the test when it fails or times out:
    a process is started as the argument of `processes.own(...)` (the fixture kills and reaps it
    at teardown), a `serve` is owned or an `async with` item, and a command run to its end
    (`subprocess.run`) has a `timeout=` that kills it."""
    modules = _test_modules()
    serves = _serve_classes(modules)
    found = [
        (str(path.relative_to(ROOT)), line, name, problem)
        for path, tree in modules.items()
        if path not in EXEMPT
        for line, name, problem in _problems(tree, _module_name(path), serves)
    ]
    assert [f"{p}:{line}: {why}" for p, line, name, why in found if (p, name) not in ALLOWED] == []
    assert {(p, name) for p, _, name, _ in found} >= ALLOWED.keys(), "an allowance left unused"


def test_the_check_finds_an_unowned_start() -> None:
    """The check reads the calls themselves: an owned start, a bounded run and a `serve` in an
    `async with` pass; the same calls without their owner or their bound do not."""
    source = (
        "import asyncio, os, subprocess\n"
        "from subprocess import Popen as P\n"
        "from tests.support.processes import ServeProcess\n"
        "async def t(processes):\n"
        "    processes.own(await asyncio.create_subprocess_exec('x'))\n"
        "    processes.own(subprocess.Popen(['x']))\n"
        "    subprocess.run(['x'], timeout=5)\n"
        "    await asyncio.to_thread(subprocess.run, ['x'], timeout=5)\n"
        "    processes.own(ServeProcess(c, 1, log))\n"
        "    async with ServeProcess(c, 1, log):\n"
        "        pass\n"
        "    await asyncio.create_subprocess_exec('x')\n"
        "    P(['x'])\n"
        "    with processes.own(subprocess.Popen(['x'])):\n"
        "        pass\n"
        "    subprocess.check_output(['x'])\n"
        "    await asyncio.to_thread(subprocess.run, ['x'])\n"
        "    await ServeProcess(c, 1, log).start()\n"
        "    os.fork()\n"
    )
    tree = ast.parse(source)
    assert [line for line, _, _ in _problems(tree, "m", {SERVE})] == [12, 13, 14, 16, 17, 18, 19]
