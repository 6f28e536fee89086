"""How fast the command line answers: `depositd --help` and `depositd status`, wall time.

Not a test. Runs, in turns (paired: each round runs every case once, so a busy machine weighs on
all of them alike), each in a fresh interpreter:

- `import aiohttp`: the yardstick (`python -c 'import aiohttp'`);
- `--help` and `status` as `depositd` runs them now (a command's modules imported when it runs);
- `--help (eager)`: `--help` after importing every command's module first, as the command line
  did before it imported lazily: the baseline `--help` is compared with.

Bytecode caching is on (see `ENV`). `status` reads a fresh database of an `init --sandbox`
setup in a temporary folder. Prints the median wall and CPU time (user + system) of each case
and the medians of the per-round ratios.

    .venv/bin/python bench/cli.py [--rounds 21]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Bytecode caching on, as for an installed depositd (pip compiles a package at install; a
# checkout run with PYTHONDONTWRITEBYTECODE would compile every module of worker/ on each run,
# while aiohttp's are compiled in site-packages): the warm-up run writes worker/'s __pycache__.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
EAGER = (
    "import importlib, sys; from worker.commands.cli import COMMANDS, main; "
    "[importlib.import_module(t.partition(':')[0]) for t in COMMANDS.values()]; "
    "sys.exit(main(['--help']))"
)


def cases(config: Path) -> dict[str, list[str]]:
    """Each case's command line."""
    py = sys.executable
    return {
        "import aiohttp": [py, "-c", "import aiohttp"],
        "--help": [py, "-m", "worker", "--help"],
        "--help (eager)": [py, "-c", EAGER],
        "status": [py, "-m", "worker", "status", "--config", str(config)],
    }


def setup(folder: Path) -> Path:
    """An `init --sandbox` setup with its database created; the config's path."""
    import sqlite_utils

    from worker.logs import configure
    from worker.store.sqlitestore import migrate

    configure(None, "warning")

    subprocess.run(
        [sys.executable, "-m", "worker", "init", "--sandbox", str(folder / "s")],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    db = sqlite_utils.Database(folder / "s" / "depositd.db")
    migrate(db)
    db.close()
    return folder / "s" / "depositd.yaml"


def _cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def measure(
    commands: dict[str, list[str]], rounds: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Wall and CPU seconds per run of each case, `rounds` rounds of one run each, in turns (CPU
    time, user + system of the child, is the steadier figure on a busy machine)."""
    wall: dict[str, list[float]] = {name: [] for name in commands}
    cpu: dict[str, list[float]] = {name: [] for name in commands}
    for argv in commands.values():  # warm the file cache once
        subprocess.run(argv, capture_output=True, cwd=ROOT, check=False, env=ENV)
    for _ in range(rounds):
        for name, argv in commands.items():
            start, start_cpu = time.perf_counter(), _cpu()
            done = subprocess.run(argv, capture_output=True, cwd=ROOT, check=False, env=ENV)
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(_cpu() - start_cpu)
            if done.returncode != 0:
                raise SystemExit(f"{name}: exit {done.returncode}: {done.stderr.decode()[-500:]}")
    return wall, cpu


def ratio(times: dict[str, list[float]], a: str, b: str) -> float:
    """The median over the rounds of a/b."""
    return statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21, help="rounds of paired runs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        wall, cpu = measure(cases(setup(Path(tmp))), args.rounds)
    print(f"{args.rounds} rounds, python {sys.version.split()[0]}, median per run:")
    print(f"  {'case':16} {'wall':>8} {'cpu':>8}")
    for name in wall:
        print(
            f"  {name:16} {statistics.median(wall[name]) * 1000:6.0f}ms"
            f" {statistics.median(cpu[name]) * 1000:6.0f}ms"
        )
    print("ratios (median of the per-round ratios), wall / cpu:")
    for a, b, goal in (("--help", "--help (eager)", 0.5), ("status", "import aiohttp", 1.0)):
        print(
            f"  {a} / {b}: {ratio(wall, a, b):.2f} / {ratio(cpu, a, b):.2f}  (goal <= {goal:.2f})"
        )


if __name__ == "__main__":
    main()
