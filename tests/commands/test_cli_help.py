"""The command line's help and the commands it adds: every option described, values listed."""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.processes import Processes
from worker.commands.cli import STATES, build_parser, main
from worker.track.tracker import State

ROOT = Path(__file__).resolve().parents[2]


def _parsers(
    parser: argparse.ArgumentParser, name: str
) -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(name, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                found.extend(_parsers(sub, f"{name} {sub_name}"))
    return found


def test_every_option_of_every_command_has_help() -> None:
    """`--help` describes every option and argument of every command (none left blank)."""
    blank = [
        f"{name}: {action.option_strings or action.dest}"
        for name, parser in _parsers(build_parser(), "depositd")
        for action in parser._actions
        if not isinstance(action, argparse._SubParsersAction) and not action.help
    ]
    assert blank == []


def test_deposits_help_lists_the_states(capsys: pytest.CaptureFixture[str]) -> None:
    """`deposits --help` names every value `--state` takes: every state the tracker has."""
    assert list(STATES) == [s.value for s in State]
    with pytest.raises(SystemExit):
        main(["deposits", "--help"])
    out = capsys.readouterr().out
    for state in ("needs_details", "submitted", "credited", "completed", "blocked", "failed"):
        assert state in out


def test_demo_refuses_a_config(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`demo --config FILE` is exit 2 with a reason: the demo reads no config, so a given one is
    a mistake, not something to ignore."""
    assert main(["demo", "--config", str(tmp_path / "nonexistent.yaml")]) == 2
    assert "the demo writes its own configuration" in capsys.readouterr().err


def test_sandbox_inject_without_a_sandbox_says_how_to_start_it(tmp_path: Path) -> None:
    """`sandbox inject` with no sandbox running exits 1 and names the command that starts one."""
    run = [sys.executable, "-m", "worker"]
    subprocess.run(
        [*run, "init", "--sandbox", str(tmp_path / "s")], check=True, cwd=ROOT, timeout=60
    )
    config = tmp_path / "s" / "depositd.yaml"
    result = subprocess.run(
        [*run, "sandbox", "inject", "--config", str(config), "--amount", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert f"depositd sandbox --config {config}" in result.stderr


def test_init_refuses_a_folder_that_is_not_empty(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`init --sandbox DIR` on a folder holding files exits 2 and overwrites nothing."""
    (tmp_path / "depositd.yaml").write_text("mine")
    assert main(["init", "--sandbox", str(tmp_path)]) == 2
    assert (tmp_path / "depositd.yaml").read_text() == "mine"
    assert "not an empty folder" in capsys.readouterr().err


def test_quiet_sandbox_still_says_where_it_listens(tmp_path: Path, processes: Processes) -> None:
    """At `log.level: warning` the sandbox still prints its address at start (and nothing else)."""
    import signal

    run = [sys.executable, "-m", "worker"]
    subprocess.run(
        [*run, "init", "--sandbox", str(tmp_path / "s")], check=True, cwd=ROOT, timeout=60
    )
    config = tmp_path / "s" / "depositd.yaml"
    config.write_text(config.read_text().replace("level: info", "level: warning"))
    base_url = next(line for line in config.read_text().splitlines() if "base_url" in line)
    port = base_url.split(":")[-1].split()[0]
    proc = processes.own(
        subprocess.Popen(
            [*run, "sandbox", "--config", str(config)], cwd=ROOT, stderr=subprocess.PIPE, text=True
        )
    )
    assert proc.stderr is not None
    first = proc.stderr.readline()
    for _ in range(200):  # until it accepts connections (its signal handlers are set)
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", int(port))) == 0:
                break
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    rest = proc.stderr.read()
    proc.wait(timeout=30)
    assert first == f"sandbox listening on 127.0.0.1:{port}\n"
    assert proc.returncode == 0 and rest == ""
