"""Log lines under journald carry their level's syslog priority (docs: deploy guide, "Logs")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = """
from worker.logs import configure, get_logger
configure("json", "info")
log = get_logger("t")
log.info("all well", n=1)
log.warning("look")
log.error("broken", what="x")
"""


def run_logging(tmp_path: Path, journal: bool) -> list[str]:
    """Lines a process writes to its stderr (a file here), with JOURNAL_STREAM naming that
    file when `journal`, as systemd names the journal's socket."""
    err = tmp_path / "stderr"
    with err.open("wb") as out:
        env = {k: v for k, v in os.environ.items() if k != "JOURNAL_STREAM"}
        if journal:
            st = os.fstat(out.fileno())
            env["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
        subprocess.run(
            [sys.executable, "-c", _SCRIPT], cwd=ROOT, env=env, stderr=out, check=True, timeout=60
        )
    return err.read_text().splitlines()


def test_journal_lines_carry_the_priority_of_their_level(tmp_path: Path) -> None:
    """Under journald each line starts with <6>, <4> or <3> (info, warning, error), which
    journald stores as PRIORITY= and strips, so `journalctl -p err` finds the error line; the
    rest of the line is the same JSON object."""
    lines = run_logging(tmp_path, journal=True)
    assert [line[:3] for line in lines] == ["<6>", "<4>", "<3>"]
    error = json.loads(lines[2][3:])
    assert error["event"] == "broken"
    assert error["level"] == "error"


def test_no_prefix_when_stderr_is_not_the_journal(tmp_path: Path) -> None:
    """A JSON line per event and nothing before it when stderr is a file or pipe, also when
    JOURNAL_STREAM is inherited but names another stream."""
    for lines in (run_logging(tmp_path, journal=False),):
        assert [json.loads(line)["event"] for line in lines] == ["all well", "look", "broken"]
    env_other = tmp_path / "other"
    env_other.write_text("")
    st = env_other.stat()
    err = tmp_path / "stderr2"
    with err.open("wb") as out:
        env = dict(os.environ, JOURNAL_STREAM=f"{st.st_dev}:{st.st_ino}")
        subprocess.run(
            [sys.executable, "-c", _SCRIPT], cwd=ROOT, env=env, stderr=out, check=True, timeout=60
        )
    assert err.read_text().startswith("{")
