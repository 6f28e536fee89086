"""The README's quick start, run as written: init, sandbox and serve as processes, a deposit,
and the operator console `init` configured, logged in to with its token file."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from http.cookiejar import CookieJar
from pathlib import Path

import pytest

from tests.support.processes import Processes

ROOT = Path(__file__).resolve().parents[2]
README_DIR = "/tmp/depositd-local"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def quickstart_commands() -> list[list[str]]:
    """The `depositd` commands of the README's quick start block, in order, as argv lists."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- quickstart:.*?```sh\n(.*?)```", text, re.S)
    assert block, "README.md lost its quick start block"
    commands = []
    for line in block.group(1).splitlines():
        argv = shlex.split(line, comments=True)
        if argv and argv[0] == ".venv/bin/depositd":
            commands.append(argv[1:])
    return commands


def depositd(argv: list[str], folder: Path) -> list[str]:
    """The README's command with its folder replaced by `folder`, run with this Python."""
    args = [a.replace(README_DIR, str(folder)) for a in argv]
    return [sys.executable, "-m", "worker", *args]


def wait_until(check: object, what: str, timeout_s: float = 30) -> None:
    """Poll `check()` until true; fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


def test_readme_quickstart_books_a_deposit(tmp_path: Path, processes: Processes) -> None:
    """Following the README's quick start on a clean folder, the injected deposit is submitted,
    credited and booked, and neither the sandbox nor serve logs a warning or an error."""
    folder = tmp_path / "local"
    commands = quickstart_commands()
    assert [c[0] for c in commands] == [
        "init",
        "sandbox",
        "serve",
        "sandbox",
        "deposits",
        "ledger",
    ]
    init, sandbox, serve, inject, deposits, ledger = (depositd(c, folder) for c in commands)
    written = subprocess.run(
        init, check=True, env=ENV, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    logs = {name: tmp_path / f"{name}.log" for name in ("sandbox", "serve")}
    for name, argv in (("sandbox", sandbox), ("serve", serve)):
        with logs[name].open("wb") as log:
            processes.own(subprocess.Popen(argv, env=ENV, cwd=tmp_path, stdout=log, stderr=log))
        marker = "sandbox starting" if name == "sandbox" else "serving"
        wait_until(lambda n=name, m=marker: m in logs[n].read_text(), f"{name} to start")

    injected = subprocess.run(
        inject, env=ENV, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert injected.returncode == 0, injected.stderr
    tx = injected.stdout.split()[1].rstrip(":")

    def shown(argv: list[str], *words: str) -> bool:
        out = subprocess.run(
            argv, env=ENV, cwd=tmp_path, capture_output=True, text=True, timeout=30
        ).stdout
        return all(w in out for w in words)

    wait_until(lambda: shown(deposits, tx, "completed"), "the deposit to complete")
    assert shown(ledger, tx, "125.50", "credited")
    events = subprocess.run(
        depositd(["events", "--json", "--config", str(folder / "depositd.yaml")], folder),
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "DEPOSIT_WHITELIST_REQUIRED" in events and "DEPOSIT_WHITELIST_CREDITED" in events
    for name, path in logs.items():
        text = path.read_text()
        assert "[warning" not in text and "[error" not in text, f"{name}:\n{text}"
    console_shows_the_deposit(written.stdout, folder, tx)


def console_shows_the_deposit(init_out: str, folder: Path, tx: str) -> None:
    """The console address `init` printed answers while serve runs: the token in
    secrets/console_token logs in, the deposit's timeline shows it completed, and the pages may
    frame the sandbox's hosted Travel Rule page."""
    found = re.search(
        r"^the console, while serve runs: (http://127\.0\.0\.1:\d+/)$", init_out, re.M
    )
    assert found, init_out
    url = found.group(1)
    assert f"cat {folder}/secrets/console_token" in init_out
    token = (folder / "secrets" / "console_token").read_text().strip()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(CookieJar()))
    with opener.open(url + "login", timeout=10) as answer:
        csrf = re.search(r'name="csrf" value="([^"]+)"', answer.read().decode())
    assert csrf
    form = urllib.parse.urlencode({"csrf": csrf.group(1), "token": token, "operator": "me"})
    with opener.open(url + "login", data=form.encode(), timeout=10) as answer:
        assert answer.url == url and "Log out" in answer.read().decode()
    with opener.open(f"{url}deposits/{tx}", timeout=10) as answer:
        page = answer.read().decode()
        policy = answer.headers["Content-Security-Policy"]
    assert tx in page and "completed" in page
    sandbox = re.search(
        r"base_url: (http://127\.0\.0\.1:\d+)", (folder / "depositd.yaml").read_text()
    )
    assert sandbox and f"frame-src {sandbox.group(1)}" in policy, policy
