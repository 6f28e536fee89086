"""End to end: retention of personal data on what a running depositd kept (docs/audit.md,
"Retention of personal data"). The sandbox's webhooks drive two deposits from known addresses
through their submissions; one completes, the other stays under review. The day's run, a
month on, removes the completed deposit's payer values from the database (every table, and on
SQLite the file and its WAL) while its hash and field names still prove what was sent, and
`depositd verify` still holds; the deposit under review keeps its values."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from tests.support.processes import Processes
from tests.support.stacks import MakeStack
from worker.clock import now_ms
from worker.dev.harness import Stack
from worker.dev.sandbox.testing import ENTITY_PAYER
from worker.service.retention import purge_personal_data
from worker.store import journal, submissions
from worker.store.pgstore import PgStore
from worker.store.retention import SUBJECT

DAY_MS = 86_400_000
DONE_ADDRESS = "TE2eRetentionDone00000000000000001"
WAITING_ADDRESS = "TE2eRetentionWait00000000000000001"
DONE_PAYER = {
    **ENTITY_PAYER,
    "fullName": "Quennell Harbour Holdings",
    "companyAddress": "77 Zwinglistrasse, Zurich",
    "walletLabel": "Quennell cold store",
}
WAITING_PAYER = {
    **ENTITY_PAYER,
    "fullName": "Brackwater Mills Pte",
    "companyAddress": "9 Tanjong Rhu Road, Singapore",
    "walletLabel": "Brackwater treasury",
}
PROFILES = json.dumps(
    {
        "profiles": {"done-entity": DONE_PAYER, "waiting-entity": WAITING_PAYER},
        "addresses": {DONE_ADDRESS: "done-entity", WAITING_ADDRESS: "waiting-entity"},
    }
)
# The values only these payers have (the others, such as the country, are common words).
DONE_VALUES = ("Quennell Harbour Holdings", "77 Zwinglistrasse, Zurich", "Quennell cold store")
WAITING_VALUES = ("Brackwater Mills Pte", "9 Tanjong Rhu Road, Singapore", "Brackwater treasury")


async def submitted(stack: Stack, tx: str) -> dict[str, Any]:
    """The deposit's submission once the provider accepted it."""

    async def done() -> bool:
        found = [a for a in await stack.actions(tx) if a["action"] == "submit_profile"]
        return bool(found) and found[-1]["status"] == "done"

    await stack.wait_for(done, what="the submission accepted")
    await stack.settle()
    return [a for a in await stack.actions(tx) if a["action"] == "submit_profile"][-1]


async def stored_text(stack: Stack) -> str:
    """Every value of every table of the stack's database, as one text."""

    def read(db: Any) -> str:
        if isinstance(stack.store, PgStore):
            sql = (
                "SELECT table_name FROM information_schema.tables"
                " WHERE table_schema = current_schema()"
            )
        else:
            sql = "SELECT name FROM sqlite_master WHERE type = 'table'"
        parts: list[str] = []
        for (name,) in db.execute(sql).fetchall():
            for row in db.execute(f"SELECT * FROM {name}").fetchall():
                parts.extend(str(v) for v in tuple(row))
        return "\n".join(parts)

    return await stack.store.read(read)


def file_bytes(stack: Stack) -> bytes:
    """SQLite: the database file and its WAL as they are on disk; PostgreSQL: nothing."""
    if isinstance(stack.store, PgStore):
        return b""
    path = stack.store.path
    wal = Path(f"{path}-wal")
    return path.read_bytes() + (wal.read_bytes() if wal.exists() else b"")


async def test_a_month_after_completion_the_values_sent_are_gone_and_still_provable(
    start_stack: MakeStack, tmp_path: Path, processes: Processes
) -> None:
    profiles = tmp_path / "profiles.yaml"
    profiles.write_text(PROFILES)
    stack = await start_stack(profiles=profiles)
    done_tx = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "250.00", DONE_ADDRESS)[
        "transactionId"
    ]
    waiting_tx = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "75.00", WAITING_ADDRESS)[
        "transactionId"
    ]
    done_action = await submitted(stack, done_tx)
    waiting_action = await submitted(stack, waiting_tx)
    stack.sandbox.approve_review(done_tx)
    await stack.settle()
    stack.sandbox.finish_sweep(done_tx)
    await stack.settle()
    [booked] = await stack.ledger()
    assert booked["transaction_id"] == done_tx
    text = await stored_text(stack)
    assert all(v in text for v in DONE_VALUES + WAITING_VALUES)

    # The day's run as the service makes it, 31 days on, keeping 30.
    run = await purge_personal_data(stack.store, 30, now=now_ms() + 31 * DAY_MS)

    assert run.action_ids == [done_action["id"]] and run.wal_emptied
    text, raw = await stored_text(stack), file_bytes(stack)
    for value in DONE_VALUES:
        assert value not in text and value.encode() not in raw, value
    assert all(v in text for v in WAITING_VALUES)
    [done_row] = await stack.store.read(lambda db: submissions.of_deposit(db, done_tx))
    [waiting_row] = await stack.store.read(lambda db: submissions.of_deposit(db, waiting_tx))
    assert done_row["body"] is None and done_row["purged_at"] is not None
    assert waiting_row["purged_at"] is None
    assert json.loads(waiting_row["body"])["fullName"] == WAITING_PAYER["fullName"]
    assert waiting_row["action_id"] == waiting_action["id"]

    entries = await stack.store.read(lambda db: list(journal.entries(db)))
    assert journal.chain_problem(entries) is None
    [purged] = [e for e in entries if e.kind == journal.PURGED]
    assert (purged.subject, purged.body["action_ids"]) == (SUBJECT, [done_action["id"]])
    assert [purged.seq] == run.entries
    # What was sent stays provable without the values: whoever holds them (the payer, the
    # provider) hashes them to the hash the SUBMITTED entry and the row still hold.
    [sent] = [e for e in entries if e.kind == journal.SUBMITTED and e.subject == done_tx]
    assert sent.body["payload_sha256"] == done_row["payload_sha256"]
    assert done_row["payload_sha256"] == submissions.payload_sha256(DONE_PAYER)
    assert sent.body["fields"] == json.loads(done_row["fields"]) == sorted(DONE_PAYER)
    # No payer value in the journal, before or after.
    journal_text = json.dumps([e.as_json() for e in entries], ensure_ascii=False)
    assert not [v for v in DONE_VALUES + WAITING_VALUES if v in journal_text]
    # And `depositd verify` accepts the purged record beside the running service.
    status, out, err = await depositd(processes, stack.config_path, "verify")
    assert status == 0, (out, err)
    assert out.startswith("journal verified:")


async def depositd(processes: Processes, config: Path, *args: str) -> tuple[int, str, str]:
    """`python -m worker ARGS --config CONFIG` in a process of its own: status, stdout, stderr."""
    proc = processes.own(
        await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", "worker", *args, "--config", str(config)],
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()
