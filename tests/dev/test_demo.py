"""`depositd demo`: every scenario of docs/getting-started.md, end to end, no payer data shown."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from worker.dev import demo

ROOT = Path(__file__).resolve().parents[2]
# Contents of rules/profiles.yaml (and of the demo's corrected profile): never on the console.
PAYER_DATA = (
    "Demo Trading Ltd",
    "1990-01-31",
    "Demo Street",
    "Demo Road",
    "Alex",
    "Demo hot wallet",
)


def _depositd(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONWARNINGS": "error::ResourceWarning"}
    env.pop("DEPOSITD_CONFIG", None)
    return subprocess.run(
        [sys.executable, "-m", "worker", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _summary_rows(stdout: str) -> dict[str, str]:
    """Summary table rows by scenario title -> the row's last column (ok / FAILED)."""
    rows = {}
    for line in stdout.splitlines():
        for scenario in demo.SCENARIOS:
            if line.split("  ")[0].strip().isdigit() and f"  {scenario.title}  " in line:
                rows[scenario.title] = line.split()[-1]
    return rows


def test_demo_runs_every_scenario_ok(tmp_path: Path) -> None:
    """`python -m worker demo --keep DIR` exits 0, every scenario ok, no payer data, files kept."""
    kept = tmp_path / "demo"
    result = _depositd("demo", "--keep", str(kept))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    rows = _summary_rows(result.stdout)
    assert rows == {s.title: "ok" for s in demo.SCENARIOS}, result.stdout
    assert f"{len(demo.SCENARIOS)}/{len(demo.SCENARIOS)} scenarios as expected" in result.stdout
    for needle in PAYER_DATA:
        assert needle not in output, f"payer data {needle!r} printed"
    mails = [line.strip() for line in result.stdout.splitlines() if "e-mail: " in line]
    assert mails and all(line.startswith("e-mail: [depositd] ") for line in mails), mails
    log_text = (kept / "depositd.log").read_text(encoding="utf-8")
    for needle in PAYER_DATA[:3]:
        assert needle not in log_text
    # The log is one JSON object per line, each line once, and no scheduler chatter.
    log_lines = log_text.splitlines()
    assert all(line.startswith("{") for line in log_lines), log_lines[:5]
    assert "apscheduler" not in log_text.lower()
    # What the demo printed is what the database holds: six scenarios end booked (the released
    # BLOCKED deposit and the one filled in on the hosted page among them).
    ledger = _depositd("ledger", "--json", "--config", str(kept / "depositd.yaml"), timeout=30)
    assert ledger.returncode == 0, ledger.stderr
    booked = [json.loads(line) for line in ledger.stdout.splitlines() if line.strip()]
    assert len(booked) == 6
    assert len({b["transactionId"] for b in booked}) == 6


def test_demo_refuses_a_folder_with_a_previous_database(tmp_path: Path) -> None:
    """--keep on a folder that already holds a demo database exits 2 and names the folder."""
    (tmp_path / "depositd.db").write_bytes(b"")
    result = _depositd("demo", "--keep", str(tmp_path), timeout=30)
    assert result.returncode == 2
    assert str(tmp_path) in result.stderr


async def test_a_failed_scenario_fails_the_demo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scenario that ends unexpectedly or raises is reported FAILED and the demo returns 1."""

    async def wrong(_: demo.Demo) -> demo.Result:
        return demo.Result("something else", False)

    async def broken(_: demo.Demo) -> demo.Result:
        raise RuntimeError("boom")

    scenarios = (
        demo.Scenario("wrong end", "x", wrong),
        demo.Scenario("broken", "y", broken),
        demo.SCENARIOS[1],  # still runs after the broken one
    )
    monkeypatch.setattr(demo, "SCENARIOS", scenarios)
    out = io.StringIO()
    assert await demo.main(tmp_path, out) == 1
    text = out.getvalue()
    assert "error: RuntimeError: boom" in text
    lines = [line for line in text.splitlines() if line[:1].isdigit()]
    assert [line.split()[-1] for line in lines[:3]] == ["FAILED", "FAILED", "ok"]
    assert "1/3 scenarios as expected" in text
