"""`make mutation`: mutation testing of the modules that decide money, each against its own tests.

For every module listed under `[tool.depositd.mutation]` in pyproject.toml, a scratch copy of the
checkout is made under `.mutation/<module>/` (kept between runs: mutmut resumes and re-tests only
what changed), its pyproject's `[tool.mutmut]` is pointed at that one module and its test folder,
and `mutmut run` goes through it. Then one line per module: mutants, killed, survived, and the score
over the mutants not listed as equivalent in `mutation/equivalent.txt` (one name and a one-line
reason per line). A survivor not listed there is run once more against the module's whole test
list (mutmut's own choice of tests misses what runs on the store's threads); one that still
survives is printed, so a run shows only what is new.

Not part of `make test` (it takes tens of minutes); docs/testing.md gives the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRATCH = ROOT / ".mutation"
EQUIVALENT = ROOT / "mutation" / "equivalent.txt"
TARGET = 0.95


@dataclass
class Outcome:
    """One module's counts."""

    module: str
    total: int
    killed: int
    survivors: list[str]
    equivalent: int

    @property
    def score(self) -> float:
        counted = self.total - self.equivalent
        return 1.0 if counted <= 0 else self.killed / counted


def equivalents() -> dict[str, str]:
    """Mutant name -> reason, from mutation/equivalent.txt (`#` lines are comments)."""
    out: dict[str, str] = {}
    for line in EQUIVALENT.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, reason = line.partition(" ")
        if not reason.strip():
            raise SystemExit(f"{EQUIVALENT}: {name} has no reason")
        out[name] = reason.strip()
    return out


def scratch_copy(module: str, tests: list[str]) -> Path:
    """A copy of the tracked files with [tool.mutmut] aimed at `module` and `tests`."""
    place = SCRATCH / module.replace("/", "_").removesuffix(".py")
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    for name in files:
        if name.startswith(("mutation/", ".mutation/")):
            continue
        source, target = ROOT / name, place / name
        if not source.is_file():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists() or target.read_bytes() != source.read_bytes():
            shutil.copy2(source, target)
    config = (ROOT / "pyproject.toml").read_text()
    head, sep, _ = config.partition("[tool.mutmut]")
    if not sep:
        raise SystemExit("pyproject.toml has no [tool.mutmut] table")
    common = tomllib.loads(config)["tool"]["mutmut"]
    lines = [f"{key} = {json.dumps(value)}" for key, value in common.items()]
    lines += [f"only_mutate = {json.dumps([module])}"]
    lines += [f"pytest_add_cli_args_test_selection = {json.dumps(tests)}"]
    (place / "pyproject.toml").write_text(head + "[tool.mutmut]\n" + "\n".join(lines) + "\n")
    return place


def _results(mutmut: str, place: Path) -> list[tuple[str, str]]:
    """(mutant name, status) of every mutant of the scratch copy."""
    listing = subprocess.run(
        [mutmut, "results", "--all", "true"],
        cwd=place,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    out = []
    for line in listing.splitlines():
        name, _, status = line.strip().rpartition(": ")
        if name:
            out.append((name, status))
    return out


def _mutmut(command: list[str], place: Path, module: str) -> None:
    """Run mutmut; a failure (its tests fail without any mutant, say) stops with its output
    rather than reading as a score of mutants never checked."""
    done = subprocess.run(command, cwd=place, check=False, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-3000:]
        raise SystemExit(f"mutmut failed for {module} in {place}:\n{tail}")


def run_module(module: str, tests: list[str], children: int, known: dict[str, str]) -> Outcome:
    """Run mutmut over one module in its scratch copy and read its results.

    mutmut keeps a verdict once given, so a mutant that survived an earlier run is tested
    again by name (the tests may have changed since): only those not listed as equivalent."""
    place = scratch_copy(module, tests)
    mutmut = str(Path(sys.executable).parent / "mutmut")
    print(f"== {module} against {' '.join(tests)}", flush=True)
    run = [mutmut, "run", "--max-children", str(children)]
    _mutmut(run, place, module)
    again = [n for n, status in _results(mutmut, place) if status != "killed" and n not in known]
    if again:
        _mutmut([*run, *again], place, module)
    total = killed = equivalent = 0
    survivors: list[str] = []
    common = tomllib.loads((place / "pyproject.toml").read_text())["tool"]["mutmut"]
    pytest_args = [a for a in common.get("pytest_add_cli_args", []) if a != "-q"]
    for name, status in _results(mutmut, place):
        total += 1
        if status == "killed":
            killed += 1
        elif name in known:
            equivalent += 1
        elif _killed_by_all(place, name, [*pytest_args, *tests]):
            killed += 1
        else:
            survivors.append(f"{name}: {status}")
    return Outcome(module, total, killed, survivors, equivalent)


def _killed_by_all(place: Path, name: str, args: list[str]) -> bool:
    """Whether pytest with `args` (mutmut's options and the module's whole test list) fails
    with the mutant `name` switched on.

    mutmut runs against a mutant only the tests its map says reach the function, and the map
    misses calls made on other threads (the store's): a survivor is run once more against every
    configured test before it counts as one."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", *args],
        cwd=place / "mutants",
        env={**os.environ, "MUTANT_UNDER_TEST": name},
        check=False,
        capture_output=True,
    )
    return done.returncode == 1  # tests failed (0: all passed; others: could not run)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help="only these modules (paths as configured)")
    parser.add_argument("--children", type=int, default=2, help="mutants tested at once")
    args = parser.parse_args()
    table: dict[str, list[str]] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"][
        "depositd"
    ]["mutation"]
    chosen = args.modules or list(table)
    known = equivalents()
    outcomes = [run_module(m, table[m], args.children, known) for m in chosen]
    print(f"\n{'module':36} {'mutants':>8} {'killed':>7} {'equiv.':>7} {'left':>5} {'score':>7}")
    for o in outcomes:
        print(
            f"{o.module:36} {o.total:8} {o.killed:7} {o.equivalent:7} "
            f"{len(o.survivors):5} {o.score:7.1%}"
        )
    for o in outcomes:
        for line in o.survivors:
            print(f"  not killed: {line}")
    return 0 if all(o.score >= TARGET for o in outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
