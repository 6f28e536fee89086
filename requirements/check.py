"""Check that pyproject.toml and the locks agree, without the network.

Every requirement of pyproject.toml (the build's, the runtime's and the `demo` and `dev`
extras') must be met by a version pinned in the lock that installs it (`runtime.txt`: the
service; `dev.txt`: everything), and every pinned entry must carry hashes. Run by `make lint`;
`make lock` fixes what it reports.

    python requirements/check.py [--root DIR]
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def read_lock(path: Path) -> tuple[dict[str, set[str]], list[str]]:
    """The pinned versions by package name, and the entries that lack a hash."""
    pins: dict[str, set[str]] = {}
    unhashed: list[str] = []
    entries = re.split(r"\n(?=\S)", path.read_text())
    for entry in entries:
        match = PIN.match(entry)
        if match is None:
            continue
        pins.setdefault(canonicalize_name(match[1]), set()).add(match[2])
        if "--hash=sha256:" not in entry:
            unhashed.append(f"{match[1]}=={match[2]}")
    return pins, unhashed


def requirements(root: Path) -> tuple[list[Requirement], list[Requirement]]:
    """(what the service installs, what development installs on top) from pyproject.toml."""
    project = tomllib.loads((root / "pyproject.toml").read_text())
    name = canonicalize_name(project["project"]["name"])
    extras = project["project"].get("optional-dependencies", {})
    build = [Requirement(r) for r in project["build-system"]["requires"]]
    runtime = build + [Requirement(r) for r in project["project"]["dependencies"]]
    dev: list[Requirement] = []
    todo, seen = ["dev"], set()
    while todo:
        extra = todo.pop()
        seen.add(extra)
        for text in extras.get(extra, []):
            req = Requirement(text)
            if canonicalize_name(req.name) == name:  # depositd[demo]: the extra's own list
                todo += [e for e in req.extras if e not in seen]
            else:
                dev.append(req)
    return runtime, dev


def problems(root: Path) -> list[str]:
    """What disagrees between pyproject.toml and requirements/*.txt (empty when they agree)."""
    runtime, dev = requirements(root)
    found = []
    for lock_name, needed in (("runtime.txt", runtime), ("dev.txt", runtime + dev)):
        lock = root / "requirements" / lock_name
        if not lock.is_file():
            found.append(f"{lock}: missing")
            continue
        pins, unhashed = read_lock(lock)
        found += [f"{lock}: {pin} has no --hash" for pin in unhashed]
        for req in needed:
            if req.marker is not None and not req.marker.evaluate():
                continue
            versions = pins.get(canonicalize_name(req.name), set())
            if not any(req.specifier.contains(v, prereleases=True) for v in versions):
                have = ", ".join(sorted(versions)) or "nothing"
                found.append(f"{lock}: {req} is not met (pinned: {have})")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    found = problems(parser.parse_args().root)
    for problem in found:
        print(problem, file=sys.stderr)
    if found:
        print("pyproject.toml and the locks disagree: run `make lock`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
