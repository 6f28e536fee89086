"""The hash-locked requirements: the environment is installed from them, and
requirements/check.py (run by `make lint`) catches a pyproject.toml the locks do not meet."""

from __future__ import annotations

import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "requirements" / "check.py"
sys.path.insert(0, str(CHECK.parent))
from check import read_lock  # noqa: E402


def installed() -> dict[str, str]:
    """Every distribution of this interpreter's environment but depositd itself."""
    found = {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions()}
    found.pop("depositd", None)
    return found


def test_this_environment_is_exactly_the_dev_lock() -> None:
    """Every package the tests run with is pinned in requirements/dev.txt at that version (an
    unlocked package or version in the environment fails here)."""
    pins, unhashed = read_lock(ROOT / "requirements" / "dev.txt")
    assert not unhashed
    off = {
        name: version for name, version in installed().items() if version not in pins.get(name, ())
    }
    assert not off, f"installed but not locked: {off}"


def run_check(root: Path) -> subprocess.CompletedProcess[str]:
    """requirements/check.py against the tree at `root`."""
    return subprocess.run(
        [sys.executable, str(CHECK), "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of pyproject.toml and requirements/ to break."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    shutil.copytree(ROOT / "requirements", tmp_path / "requirements")
    return tmp_path


def test_lock_check_accepts_the_repository() -> None:
    """pyproject.toml and the committed locks agree."""
    result = run_check(ROOT)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('"yarl>=1.9",', '"yarl>=1.9",\n    "rich>=13",', "requirements/runtime.txt: rich>=13"),
        ('"pyyaml>=6.0,<7"', '"pyyaml>=7"', "requirements/runtime.txt: pyyaml>=7 is not met"),
        ('"ruff>=0.4",', '"ruff>=0.4",\n    "black",', "requirements/dev.txt: black is not met"),
    ],
)
def test_lock_check_names_a_requirement_the_lock_does_not_meet(
    tree: Path, old: str, new: str, message: str
) -> None:
    """A dependency added or raised in pyproject.toml without `make lock` fails the check."""
    pyproject = tree / "pyproject.toml"
    assert old in pyproject.read_text()
    pyproject.write_text(pyproject.read_text().replace(old, new))
    result = run_check(tree)
    assert result.returncode == 1
    assert message in result.stderr
    assert "run `make lock`" in result.stderr


def test_lock_check_wants_hashes(tree: Path) -> None:
    """A pinned entry without its hashes fails the check."""
    lock = tree / "requirements" / "runtime.txt"
    lock.write_text(lock.read_text() + "six==1.16.0\n")
    result = run_check(tree)
    assert result.returncode == 1
    assert "six==1.16.0 has no --hash" in result.stderr
