"""`events`, `deposits` and `ledger` through the command line, on a real database file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.configs import make_config, write_config
from tests.support.processes import Processes
from tests.support.stores import StoreMaker
from worker.commands.cli import main
from worker.commands.read import parse_since
from worker.logs import configure
from worker.provider.jsonio import dumpb
from worker.store.sqlitestore import event_row
from worker.track.processor import Processor

T0 = 1_700_000_000_000
ROOT = Path(__file__).resolve().parents[2]


def envelope(event_id: str, event_type: str, tx: str, t: int, **data: Any) -> dict[str, Any]:
    """A deposit webhook envelope."""
    status = data.pop("status", "PROCESSING")
    return {
        "eventId": event_id,
        "eventType": event_type,
        "referenceId": tx,
        "status": status,
        "timestamp": T0 + t,
        "data": {
            "transactionId": tx,
            "amount": "5.5",
            "currency": "USDT",
            "network": "TRON",
            "walletId": 1001,
            "walletName": "main",
            "fromAddress": "T-from",
            "transactionHash": "0xh",
            "status": status,
            **data,
        },
    }


@pytest.fixture(autouse=True)
def logs_to_stderr() -> None:
    """Keep log lines out of stdout, which the tests parse."""
    configure("console", "warning", stream=sys.stderr)


@pytest.fixture
async def config(tmp_path: Path, make_store: StoreMaker) -> Path:
    """A database with two deposits, one failed event, a failed action, two failed alerts (one
    about no deposit) and a sent one, and two ledger entries; on SQLite and on PostgreSQL."""
    path = write_config(tmp_path, make_config(make_store.storage()))
    store = make_store()
    await store.open()
    events = [
        envelope("e1", "DEPOSIT_WHITELIST_REQUIRED", "tx-a", 1),
        envelope("e2", "DEPOSIT_ORDER_NOTIFICATION", "tx-b", 2, status="SUCCESS"),
        envelope("e3", "DEPOSIT_WHITELIST_FAILED", "tx-a", 3),
    ]
    del events[2]["data"]["walletId"]  # fails validation
    for n, ev in enumerate(events):
        await store.queue_event(
            event_row(
                ev["eventId"],
                ev["eventType"],
                ev["referenceId"],
                ev["referenceId"],
                dumpb(ev),
                {},
                f"2026-01-01T00:00:0{n}.000Z",
            )
        )
    await Processor(store).run_until_idle()

    def extras(db: Any) -> None:
        db.execute(
            "INSERT INTO actions (transaction_id, event_id, trigger, rule_set, rule_set_version,"
            " rule, action, params, status, attempts, outcome, created_at, updated_at)"
            " VALUES ('tx-a', 'e1', 'needs_details', 'wallet-1001.yaml', 'abc123', 'ask',"
            " 'alert', '{}', 'failed', 3, 'smtp down', '2026-01-01T00:00:05.000Z',"
            " '2026-01-01T00:00:06.000Z')"
        )
        for key, tx, status, error in (
            ("tx-a:needs_details:slack", "tx-a", "failed", "slack 500"),
            ("tx-a:needs_details:email", "tx-a", "sent", None),
            ("system#9:detail_failing:slack", "-", "failed", "slack timeout"),
        ):
            db.execute(
                "INSERT INTO alerts (dedupe_key, transaction_id, condition, severity, channel,"
                " status, attempts, last_error, created_at) VALUES (?, ?, ?, 'warning', ?, ?, 5,"
                " ?, '2026-01-01T00:00:07.000Z')",
                [key, tx, key.split(":")[1], key.split(":")[2], status, error],
            )
        for tx, booked in (
            ("tx-b", "2026-11-22T10:00:00.000Z"),
            ("tx-c", "2026-11-23T10:00:00.000Z"),
        ):
            db.execute(
                "INSERT INTO ledger VALUES (?, 1001, 'main', 'USDT', 'TRON', '1234.5678', 'T-from',"
                " '0xh', ?, 'credited')",
                [tx, booked],
            )

    await store.write(extras)
    await store.close()
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run the CLI; returns (exit status, stdout, stderr)."""
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def json_lines(text: str) -> list[dict[str, Any]]:
    """Parse one JSON object per line."""
    return [json.loads(line) for line in text.splitlines()]


def test_events_json(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`events --json` prints every event with its status and never the body."""
    status, out, _ = run(capsys, "events", "--json", "--config", str(config))
    assert status == 0
    lines = json_lines(out)
    assert [(e["eventId"], e["transactionId"], e["status"]) for e in lines] == [
        ("e1", "tx-a", "processed"),
        ("e2", "tx-b", "processed"),
        ("e3", "tx-a", "failed"),
    ]
    assert {"eventType", "receivedAt", "error"} <= set(lines[0])
    assert {e["kind"] for e in lines} == {"event"}
    assert "T-from" not in out and "body" not in lines[0]


def test_events_failed(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`events --failed` shows only failed events with the error, then failed actions and alerts."""
    status, out, _ = run(capsys, "events", "--failed", "--config", str(config))
    assert status == 0
    lines = out.splitlines()
    assert lines[0].split() == [
        "receivedAt",
        "eventId",
        "eventType",
        "transactionId",
        "status",
        "error",
    ]
    assert "e3" in lines[1] and "e1" not in out
    assert "failed actions" in out and "smtp down" in out
    assert "failed alerts" in out and "slack 500" in out and "slack timeout" in out
    assert "needs_details:email" not in out


def test_events_failed_json_has_actions_and_alerts(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`events --failed --json` prints what the table shows: failed events, actions, alerts,
    told apart by `kind`, every line with the keys docs/reference.md pins."""
    status, out, _ = run(capsys, "events", "--failed", "--json", "--config", str(config))
    assert status == 0
    lines = json_lines(out)
    assert [line["kind"] for line in lines] == ["event", "action", "alert", "alert"]
    for line in lines:
        assert {"eventId", "eventType", "transactionId", "receivedAt", "status"} <= set(line)
        assert line["status"] == "failed"
    event, action, alert, system_alert = lines
    assert event["eventId"] == "e3" and "walletId" in event["error"]
    assert action["eventId"] == "e1" and action["transactionId"] == "tx-a"
    # The event the action came from.
    assert action["eventType"] == "DEPOSIT_WHITELIST_REQUIRED"
    assert action["receivedAt"] == "2026-01-01T00:00:00.000Z"
    assert (action["action"], action["rule"], action["attempts"], action["outcome"]) == (
        "alert",
        "ask",
        3,
        "smtp down",
    )
    assert (alert["alert"], alert["channel"], alert["error"]) == (
        "tx-a:needs_details:slack",
        "slack",
        "slack 500",
    )
    assert alert["transactionId"] == "tx-a" and alert["eventId"] is None
    assert system_alert["condition"] == "detail_failing"
    assert system_alert["transactionId"] is None


def test_human_table_is_aligned(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Human output puts every column at the same offset on every line."""
    status, out, _ = run(capsys, "deposits", "--config", str(config))
    assert status == 0
    header, *rows = out.splitlines()
    offset = header.index("state")
    assert len(rows) == 2
    for row in rows:
        assert row[offset - 2 : offset] == "  " and row[offset] != " "


def test_deposits_json_and_state_filter(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`deposits --json` has the keys; --state filters; an unknown state is usage error 2."""
    status, out, _ = run(capsys, "deposits", "--json", "--config", str(config))
    assert status == 0
    deposits = {d["transactionId"]: d for d in json_lines(out)}
    assert set(deposits) == {"tx-a", "tx-b"}
    required = {
        "transactionId",
        "walletId",
        "currency",
        "network",
        "amount",
        "status",
        "whiteListStatus",
        "creditStatus",
        "state",
        "updatedAt",
    }
    assert required <= set(deposits["tx-a"])
    assert deposits["tx-a"]["state"] == "needs_details"
    assert deposits["tx-b"]["state"] == "completed" and deposits["tx-b"]["amount"] == "5.5"
    status, out, _ = run(
        capsys, "deposits", "--json", "--state", "completed", "--config", str(config)
    )
    assert [d["transactionId"] for d in json_lines(out)] == ["tx-b"]
    # --state has choices: argparse refuses an unknown one (exit 2) before anything runs.
    with pytest.raises(SystemExit) as exited:
        run(capsys, "deposits", "--state", "bogus", "--config", str(config))
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "unknown state 'bogus'" in err
    # A transactionId with --state would silently drop the filter: refused.
    status, out, err = run(
        capsys, "deposits", "tx-a", "--state", "completed", "--config", str(config)
    )
    assert (status, out) == (2, "") and "not both" in err


def test_one_deposit_with_history(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`deposits TX` shows the deposit, its facts and its actions (JSON and table)."""
    status, out, _ = run(capsys, "deposits", "tx-a", "--json", "--config", str(config))
    assert status == 0
    [deposit] = json_lines(out)
    assert deposit["transactionId"] == "tx-a"
    assert [(f["eventId"], f["changed"]) for f in deposit["facts"]] == [("e1", True)]
    assert [(a["action"], a["status"], a["ruleSetVersion"]) for a in deposit["actions"]] == [
        ("alert", "failed", "abc123")
    ]
    status, out, _ = run(capsys, "deposits", "tx-a", "--config", str(config))
    assert status == 0
    assert "facts" in out and "actions" in out and "abc123" in out
    status, _, err = run(capsys, "deposits", "tx-zzz", "--config", str(config))
    assert status == 1 and "no deposit 'tx-zzz'" in err


def test_ledger_json_and_since(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`ledger --json` prints docs/reference.md objects; --since keeps later bookings only."""
    status, out, _ = run(capsys, "ledger", "--json", "--config", str(config))
    assert status == 0
    entries = json_lines(out)
    assert entries[0] == {
        "transactionId": "tx-b",
        "walletId": 1001,
        "walletName": "main",
        "currency": "USDT",
        "network": "TRON",
        "amount": "1234.5678",
        "fromAddress": "T-from",
        "txHash": "0xh",
        "bookedAt": "2026-11-22T10:00:00.000Z",
        "trigger": "credited",
    }
    status, out, _ = run(
        capsys, "ledger", "--json", "--since", "2026-11-23T00:00:00+02:00", "--config", str(config)
    )
    assert [e["transactionId"] for e in json_lines(out)] == ["tx-c"]
    status, out, _ = run(capsys, "ledger", "--config", str(config))
    assert status == 0 and out.splitlines()[0].startswith("bookedAt")
    status, _, err = run(capsys, "ledger", "--since", "yesterday", "--config", str(config))
    assert status == 2 and "--since" in err


@pytest.mark.parametrize(
    ("since", "says"),
    [
        ("", "is empty"),
        ("  ", "is empty"),
        ("0001-01-01T00:00:00+01:00", "out of range"),
        ("9999-12-31T23:59:59-01:00", "out of range"),
    ],
)
def test_ledger_since_empty_or_out_of_range_is_usage_error(
    config: Path, capsys: pytest.CaptureFixture[str], since: str, says: str
) -> None:
    """An empty --since is not "no filter", and one that leaves the datetime range once in UTC
    is no traceback: both exit 2 printing nothing on stdout."""
    status, out, err = run(capsys, "ledger", "--json", "--since", since, "--config", str(config))
    assert (status, out) == (2, "")
    assert "--since" in err and says in err and "Traceback" not in err


def test_parse_since_normalises_to_utc() -> None:
    """--since accepts dates, offsets and Z, compared as UTC milliseconds."""
    assert parse_since("2026-11-22") == "2026-11-22T00:00:00.000Z"
    assert parse_since("2026-11-22T12:00:00+02:00") == "2026-11-22T10:00:00.000Z"
    assert parse_since("2026-11-22T10:00:00Z") == "2026-11-22T10:00:00.000Z"


def test_missing_database_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without a database file the commands say so and exit 1, creating nothing."""
    cfg = write_config(tmp_path, make_config(Path("depositd.db")))
    for command in ("events", "deposits", "ledger"):
        status, _, err = run(capsys, command, "--config", str(cfg))
        assert status == 1 and "no database at" in err
    assert not (tmp_path / "depositd.db").exists()


def test_a_database_without_tables_is_said_so(
    tmp_path: Path, make_store: StoreMaker, capsys: pytest.CaptureFixture[str]
) -> None:
    """An empty database file, or a PostgreSQL database `serve` never started on: the reading
    commands say it holds no depositd tables (not a missing table's name) and exit 1,
    creating nothing."""
    storage = make_store.storage()
    if "path" in storage:
        Path(storage["path"]).touch()
    cfg = write_config(tmp_path, make_config(storage))
    for command in ("status", "events", "deposits", "ledger"):
        status, out, err = run(capsys, command, "--config", str(cfg))
        assert (status, out) == (1, ""), (command, err)
        assert "holds no depositd tables yet (has `depositd serve` run on it?)" in err, err
        assert "no such table" not in err and "does not exist" not in err
    if "path" in storage:
        assert Path(storage["path"]).stat().st_size == 0


def unprivileged(folder: Path) -> list[str]:
    """A command prefix under which the read-only `folder` cannot be written: none for a normal
    user; for root (whom chmod does not stop), setpriv dropping the capabilities that override
    file permissions. Skips the test when neither stops a write."""
    prefix: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("root without setpriv: chmod cannot take write access away")
        prefix = [setpriv, "--bounding-set=-dac_override,-dac_read_search"]
    probe = folder / "probe"
    write = [*prefix, sys.executable, "-c", f"open({str(probe)!r}, 'w')"]
    if subprocess.run(write, capture_output=True, timeout=30).returncode == 0:
        probe.unlink()
        pytest.skip("cannot take write access to a folder away here")
    return prefix


@pytest.mark.parametrize("engine", ["sqlite"])  # a file's folder
def test_read_commands_on_a_wal_database_in_a_read_only_folder(config: Path) -> None:
    """A user who may read the database but not write its folder (the service stopped cleanly,
    so no -shm is left to share) still gets events, deposits, ledger, addresses and status,
    like `rules test`; nothing is created beside the database."""
    folder = config.parent
    db = folder / "depositd.db"
    assert db.read_bytes()[18] == 2  # WAL in the header
    before = sorted(os.listdir(folder))
    assert "depositd.db-shm" not in before and "depositd.db-wal" not in before
    db.chmod(0o444)
    folder.chmod(0o555)
    try:
        prefix = unprivileged(folder)
        outputs: dict[str, str] = {}
        for command in ("events", "deposits", "ledger", "addresses", "status"):
            flags = [] if command == "status" else ["--json"]
            proc = subprocess.run(
                [*prefix, sys.executable, "-m", "worker", command, *flags, "--config", str(config)],
                capture_output=True,
                text=True,
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                timeout=60,
            )
            assert proc.returncode == 0, f"{command}: {proc.stderr}"
            outputs[command] = proc.stdout
    finally:
        folder.chmod(0o755)
        db.chmod(0o644)
    assert [e["eventId"] for e in json_lines(outputs["events"])] == ["e1", "e2", "e3"]
    assert len(json_lines(outputs["deposits"])) == 2
    assert len(json_lines(outputs["ledger"])) == 2
    assert outputs["addresses"] == ""
    assert json.loads(outputs["status"])["booked"] == 2
    assert sorted(os.listdir(folder)) == before


def test_events_type_since_limit(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`events --type/--since/--limit` print only the matching events, the newest N of them
    oldest first; a --since that is not a time is usage error 2."""
    base = ["events", "--json", "--config", str(config)]
    _, out, _ = run(capsys, *base, "--type", "DEPOSIT_WHITELIST_REQUIRED")
    assert [e["eventId"] for e in json_lines(out)] == ["e1"]
    _, out, _ = run(capsys, *base, "--type", "DEPOSIT_WHITELIST_REQUIRED", "--type", "X")
    assert [e["eventId"] for e in json_lines(out)] == ["e1"]
    _, out, _ = run(capsys, *base, "--since", "2026-01-01T00:00:01Z")
    assert [e["eventId"] for e in json_lines(out)] == ["e2", "e3"]
    _, out, _ = run(capsys, *base, "--limit", "2")
    assert [e["eventId"] for e in json_lines(out)] == ["e2", "e3"]
    status, _, err = run(capsys, *base, "--since", "yesterday")
    assert status == 2 and "not an ISO 8601 time" in err


async def test_events_follow_prints_new_events(
    config: Path, make_store: StoreMaker, processes: Processes
) -> None:
    """`events --follow` prints the stored events, then each event stored afterwards, until
    interrupted (exit 0)."""
    import asyncio
    import signal

    proc = processes.own(
        await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", "worker", "events", "--follow", "--json"],
            *["--config", str(config)],
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    )
    assert proc.stdout is not None
    seen: list[str] = []

    async def read_until(event_id: str) -> None:
        while event_id not in seen:
            line = await asyncio.wait_for(proc.stdout.readline(), 30)  # type: ignore[union-attr]
            assert line, f"events --follow ended before {event_id}"
            seen.append(json.loads(line)["eventId"])

    try:
        await read_until("e3")
        store = make_store()
        await store.open()
        ev = envelope("e4", "DEPOSIT_WHITELIST_REQUIRED", "tx-d", 4)
        row = event_row(
            "e4", ev["eventType"], "tx-d", "tx-d", dumpb(ev), {}, "2026-01-02T00:00:00.000Z"
        )
        await store.queue_event(row)
        await store.close()
        await read_until("e4")
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = await asyncio.wait_for(proc.wait(), 15)
        except TimeoutError:
            proc.kill()  # a failing test leaves no process behind
            await proc.wait()
            raise
    assert seen == ["e1", "e2", "e3", "e4"] and code == 0
