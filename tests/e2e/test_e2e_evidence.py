"""End to end: the evidence bundle of a deposit the running depositd handled (docs/audit.md,
"Evidence for one deposit"). The sandbox delivers the webhooks, the worker submits the stored
profile, the review passes, the credit books it and its day is reconciled; `depositd evidence`
run beside the service writes the bundle, `depositd verify-evidence` checks it alone."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import Processes
from tests.support.stacks import MakeStack
from tests.support.stores import stack_rows
from worker.commands.cli import main
from worker.dev.harness import Stack
from worker.store import journal, submissions

SOURCE = "TE2eEvidencePayer0000000000000001"
PAYER = {
    "correspondentType": "ENTITY",
    "fullName": "Vellacott Ironside Partners Ltd",
    "countryCode": "SG",
    "companyAddress": "8 Vellacott Quay, Singapore",
    "walletType": "VASP",
    "provider": "Binance",
    "walletLabel": "Vellacott settlement wallet",
    "addressType": "STANDARD",
}


async def command(processes: Processes, stack: Stack, *args: str) -> tuple[int, str, str]:
    """`python -m worker ARGS --config <the stack's>` beside the running service."""
    proc = processes.own(
        await asyncio.create_subprocess_exec(
            sys.executable, "-m", "worker", *args, "--config", str(stack.config_path),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def verify(capsys: pytest.CaptureFixture[str], path: Path) -> tuple[int, str]:
    """`depositd verify-evidence PATH`: (exit status, stdout); no configuration, no database."""
    status = main(["verify-evidence", str(path)])
    return status, capsys.readouterr().out


def values_in(data: bytes) -> list[str]:
    """The payer values that appear in a file's bytes or in any of its strings."""
    text = json.dumps(json.loads(data), ensure_ascii=False)
    return [v for v in PAYER.values() if f'"{v}"' in text or (len(v) > 5 and v in text)]


async def booked_and_reconciled(stack: Stack) -> str:
    """A deposit from the profile's address: submitted, approved, credited, booked, and its
    day reconciled; its transactionId."""
    tx = str(stack.sandbox.inject_deposit(1001, "USDT", "TRON", "742.25", SOURCE)["transactionId"])

    async def submitted() -> bool:
        done = [a for a in await stack.actions(tx) if a["action"] == "submit_profile"]
        return bool(done) and done[-1]["status"] == "done"

    await stack.wait_for(submitted, what="the submission")
    stack.sandbox.approve_review(tx)

    async def booked() -> bool:
        return any(row["transaction_id"] == tx for row in await stack.ledger())

    await stack.wait_for(booked, what="the booking")
    await stack.settle()
    await stack.runtime.reconcile(dt.datetime.now(dt.UTC).date())
    await stack.settle()
    return tx


async def test_the_evidence_of_a_deposit_the_service_handled(
    start_stack: MakeStack,
    tmp_path: Path,
    processes: Processes,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The bundle written beside the running service holds the webhooks the sandbox signed,
    the submission by field names and the hash the journal keeps, the booking and its day's
    run, with their entries; it verifies on its own and fails once a byte changes. Payer
    values are in it only with --with-personal-data, whose export is journaled."""
    profiles = tmp_path / "profiles.yaml"
    profiles.write_text(
        json.dumps({"profiles": {"vellacott": PAYER}, "addresses": {SOURCE: "vellacott"}})
    )
    stack = await start_stack(profiles=profiles)
    tx = await booked_and_reconciled(stack)

    out = tmp_path / "evidence.json"
    status, stdout, stderr = await command(
        processes, stack, "evidence", tx, "--out", str(out), "--by", "auditor"
    )
    assert status == 0, stderr
    data = out.read_bytes()
    bundle: dict[str, Any] = json.loads(data)["bundle"]
    types = [e["event_type"] for e in bundle["webhooks"]["events"]]
    assert {"DEPOSIT_WHITELIST_REQUIRED", "DEPOSIT_WHITELIST_CREDITED"} <= set(types)
    [sent] = bundle["submissions"]
    [kept] = await stack.store.read(lambda db: submissions.of_deposit(db, tx))
    assert sent["payload_sha256"] == kept["payload_sha256"] == submissions.payload_sha256(PAYER)
    assert sent["fields"] == sorted(PAYER) and "payload" not in sent
    entries = bundle["journal"]["entries"]
    kinds = {(e["kind"], e["subject"]) for e in entries}
    day = bundle["reconciliation"][0]["day"]
    assert {
        (journal.SUBMITTED, tx),
        (journal.BOOKED, tx),
        (journal.RECONCILED, f"day:{day}"),
    } <= kinds
    assert bundle["ledger"]["amount"] == "742.25" and values_in(data) == []
    head = bundle["journal"]["proof"]["head"]
    assert f"head {head}" in stdout

    status, stdout = verify(capsys, out)
    assert status == 0 and f"head {head}" in stdout
    changed = tmp_path / "changed.json"
    at = data.index(b'"amount":"742.25"') + 11
    changed.write_bytes(data[:at] + b"8" + data[at + 1 :])
    assert verify(capsys, changed)[0] == 3

    full = tmp_path / "with-payer.json"
    status, stdout, stderr = await command(
        processes, stack, "evidence", tx, "--out", str(full), "--by", "auditor",
        "--with-personal-data",
    )  # fmt: skip
    assert status == 0 and "holds personal data" in stderr
    assert sorted(values_in(full.read_bytes())) == sorted(PAYER.values())
    assert not [v for v in PAYER.values() if len(v) > 2 and v in stdout + stderr]
    status, stdout = verify(capsys, full)
    assert status == 0 and "with personal data" in stdout
    exported = stack_rows(
        stack, "SELECT body FROM journal WHERE kind = ? AND subject = ?", (journal.EXPORTED, tx)
    )
    assert [json.loads(r[0]) for r in exported] == [
        {"by": "auditor", "file": "with-payer.json", "with_personal_data": True}
    ]
