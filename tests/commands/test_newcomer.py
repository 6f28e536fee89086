"""What cost a newcomer time: example events for `rules test` by name, no `channels=None` in its
output, `init` naming the command as it was run, `check` warning on placeholder hosts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from worker.commands.check import is_placeholder_host
from worker.commands.cli import main
from worker.config.shipped import example_events

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TRIGGERS = (
    "needs_details",
    "rejected",
    "submitted",
    "credited",
    "completed",
    "blocked",
    "failed",
    "order_updated",
)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """A sandbox setup as `init --sandbox` writes it."""
    assert main(["init", "--sandbox", str(tmp_path / "s")]) == 0
    return tmp_path / "s" / "depositd.yaml"


def test_an_example_event_ships_for_each_trigger() -> None:
    """rules/events/ holds one example per trigger a file can show (`released` needs a stored
    blocked deposit: `rules test --event`), each a JSON object with its amount exact."""
    assert sorted(example_events()) == sorted(TRIGGERS)
    for path in example_events().values():
        body = json.loads(path.read_text())
        assert isinstance(body, dict)
        if "data" in body and "amount" in body["data"]:
            assert '"amount": 125.50' in path.read_text()  # the interface's number, exact digits


@pytest.mark.parametrize("name", TRIGGERS)
def test_rules_test_takes_an_example_by_name(
    name: str, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`rules test NAME` runs the shipped example of that trigger, which causes that trigger."""
    capsys.readouterr()
    assert main(["rules", "test", name, "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert f"\non {name}:\n" in out
    if name != "order_updated":
        transitions = next(line for line in out.splitlines() if line.startswith("transitions:"))
        assert name in transitions.split(": ")[1].split(", ")
    assert "dry run: nothing was sent, stored or changed" in out


def test_rules_test_an_unknown_name_lists_the_examples(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A name that is neither a file nor an example exits 2 and lists the examples."""
    assert main(["rules", "test", "credit", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "credit: no such file, nor an example event of that name" in err
    assert "credited" in err and "needs_details" in err


def test_rules_test_shows_no_unset_parameter(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An alert with no channels named shows as `alert(severity=critical)`, not with
    `channels=None` (nor `"channels":null` in what would run)."""
    capsys.readouterr()
    assert main(["rules", "test", "failed", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "[match] blocked or failed -> alert(severity=critical)\n" in out
    assert 'would run: alert {"severity":"critical"}' in out
    assert "None" not in out and "null" not in out


def _init(argv: list[str], folder: Path, path: str) -> str:
    env = {**os.environ, "PATH": path}
    done = subprocess.run(
        [*argv, "init", "--sandbox", str(folder)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_init_prints_the_command_as_it_was_run(tmp_path: Path) -> None:
    """Run by its path (not on PATH), `init` prints that path in every next step and in the
    config's comments; found on PATH, the bare name; as `python -m worker`, that."""
    script = BIN / "depositd"
    out = _init([str(script)], tmp_path / "a", "/usr/bin:/bin")
    steps = [line.strip() for line in out.splitlines() if line.startswith("  ")]
    assert len(steps) == 5 and all(s.startswith(f"{script} ") for s in steps)
    assert (
        f"# Terminal 2: {script} serve --config" in (tmp_path / "a" / "depositd.yaml").read_text()
    )
    out = _init(["depositd"], tmp_path / "b", f"{BIN}:/usr/bin:/bin")
    assert "\n  depositd serve --config " in out
    out = _init([sys.executable, "-m", "worker"], tmp_path / "c", "/usr/bin:/bin")
    assert f"\n  {sys.executable} -m worker serve --config " in out


def test_placeholder_hosts() -> None:
    """The reserved example names are placeholders; real and loopback names are not."""
    for host in ("provider.example", "smtp.example", "hosted.provider.example", "x.invalid"):
        assert is_placeholder_host(host), host
    for host in ("example.com", "api.example.org", "merchant.test"):
        assert is_placeholder_host(host), host
    for host in ("127.0.0.1", "localhost", "api.provider.com", "examples.com"):
        assert not is_placeholder_host(host), host


def test_check_warns_on_placeholder_hosts(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A config left with `provider.example` and `smtp.example` from the example passes `check`
    (exit 0: it is valid) with a warning naming each setting; a real one has no such warning."""
    assert main(["check", "--config", str(config)]) == 0
    assert "placeholder" not in capsys.readouterr().err
    text = config.read_text()
    text = text.replace("http://127.0.0.1:", "https://provider.example:")
    text += (
        "notify:\n  email:\n    host: smtp.example\n    from: depositd@merchant.example\n"
        "    to: [ops@merchant.com]\n"
    )
    config.write_text(text)
    assert main(["check", "--config", str(config)]) == 0
    err = capsys.readouterr().err
    assert f"warning: {config}: provider.base_url: provider.example is a placeholder name" in err
    assert f"warning: {config}: notify.email.host: smtp.example is a placeholder name" in err
    assert "notify.email.from: merchant.example is a placeholder" in err
    assert "notify.email.to" not in err
