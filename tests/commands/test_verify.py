"""`depositd verify` run as a command on both engines: an intact journal verifies; a ledger row
edited, deleted or inserted by hand, a submission record changed and a journal entry changed
are each named with exit 3; an anchor kept elsewhere proves the journal up to it; `--head`
prints the head. The outcome is kept for `status`. And on what the real flow wrote: a running
worker's submission and booking verify, and an edit afterwards is named."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.configs import make_config, write_config
from tests.support.journalrows import book, by_hand, drop_append_only, purge, submit
from tests.support.processes import cli as command
from tests.support.stores import StoreMaker
from worker.commands.cli import main
from worker.dev.harness import Stack
from worker.dev.sandbox.testing import ENTITY_PAYER
from worker.store import journal
from worker.store.sqlitestore import Store

PAYER = {
    "payerType": "INDIVIDUAL",
    "firstName": "Ada",
    "lastName": "Lovelace",
    "residentialAddress": {"country": "GB", "city": "London"},
}


async def cli(config: Path, *args: str) -> tuple[int, str, str]:
    """`python -m worker ARGS --config CONFIG` (at most 60 s): status, stdout, stderr."""
    return await command(config, *args, within=60)


class Setup:
    """A database holding three bookings and two submissions with their entries, and the
    configuration of a command on it."""

    def __init__(self, storage: dict[str, str], config: Path, head: journal.Head) -> None:
        self.storage = storage
        self.config = config
        self.head = head
        self.action_ids: list[int] = []
        self.entries: list[journal.Entry] = []


@pytest.fixture
async def setup(make_store: StoreMaker, tmp_path: Path) -> AsyncIterator[Setup]:
    store: Store = make_store()
    await store.open()
    action_ids: list[int] = []

    def write(db: Any) -> None:
        for n in (1, 2, 3):
            book(db, f"tx-{n}", amount=f"{n}0.50")
        action_ids.append(submit(db, "tx-2", PAYER))
        action_ids.append(submit(db, "tx-3", {**PAYER, "firstName": "Grace"}))

    try:
        await store.write(write)
        head = await store.read(journal.head)
        entries = await store.read(lambda db: list(journal.entries(db)))
    finally:
        await store.close()
    assert head is not None
    storage = make_store.storage()
    config = write_config(tmp_path, make_config(storage))
    done = Setup(storage, config, head)
    done.action_ids, done.entries = action_ids, entries
    yield done


async def test_an_intact_journal_verifies_and_the_outcome_is_kept(setup: Setup) -> None:
    status, out, err = await cli(setup.config, "verify")
    assert (status, err) == (0, "")
    assert out.splitlines() == [
        f"journal verified: 5 entries, head {setup.head}; 3 ledger rows and 2 submissions"
        " match their entries"
    ]
    # What `status` shows: the head and the last verification.
    status, out, _ = await cli(setup.config, "status")
    shown = json.loads(out)["journal"]
    assert shown["head"] == str(setup.head)
    assert shown["lastVerification"]["verified"] is True
    assert shown["lastVerification"]["head"] == str(setup.head)
    for value in ("Ada", "Lovelace", "London", "Grace"):
        assert value not in out


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (
            "UPDATE ledger SET amount = '2000.50' WHERE transaction_id = 'tx-2'",
            "ledger row tx-2: amount differs from journal entry 2 (edited by hand?)",
        ),
        (
            "DELETE FROM ledger WHERE transaction_id = 'tx-3'",
            "journal entry 3 (booked tx-3): the deposit's ledger row is missing (deleted by hand?)",
        ),
        (
            "INSERT INTO ledger (transaction_id, wallet_id, currency, amount, booked_at, trigger)"
            " VALUES ('tx-9', 1001, 'USDT', '99', '2026-01-01T00:00:00.000Z', 'credited')",
            "ledger row tx-9 has no journal entry (inserted by hand?)",
        ),
    ],
    ids=["edited", "deleted", "inserted"],
)
async def test_a_ledger_row_changed_by_hand_is_named(setup: Setup, change: str, named: str) -> None:
    by_hand(setup.storage, change)
    status, out, err = await cli(setup.config, "verify")
    assert (status, err) == (3, "")
    assert out.splitlines() == [f"journal does not verify: {named}"]
    status, out, _ = await cli(setup.config, "status")
    last = json.loads(out)["journal"]["lastVerification"]
    assert (last["verified"], last["problem"]) == (False, named)


async def test_a_submission_record_changed_by_hand_is_named(setup: Setup) -> None:
    first = setup.action_ids[0]
    changed = json.dumps({**PAYER, "lastName": "Byron"}, sort_keys=True, separators=(",", ":"))
    by_hand(
        setup.storage, ("UPDATE submissions SET body = ? WHERE action_id = ?", [changed, first])
    )
    status, out, _ = await cli(setup.config, "verify", "--json")
    assert status == 3
    outcome = json.loads(out)
    assert outcome["verified"] is False
    assert outcome["problem"] == (
        f"submission record of action {first} (deposit tx-2): its payload does not hash to the"
        " payload_sha256 of journal entry 4 (submitted tx-2) (changed by hand?)"
    )
    # The problem names the record, never what it holds.
    assert "Byron" not in out and "Ada" not in out


async def test_a_purged_submission_verifies_and_a_payload_removed_by_hand_does_not(
    setup: Setup, make_store: StoreMaker
) -> None:
    first, second = setup.action_ids
    store = make_store()
    await store.open()
    try:
        await store.write(lambda db: purge(db, [first]))
    finally:
        await store.close()
    status, out, _ = await cli(setup.config, "verify")
    assert status == 0, out
    by_hand(
        setup.storage,
        (
            "UPDATE submissions SET body = NULL, purged_at = '2026-03-02T00:00:00.000Z'"
            " WHERE action_id = ?",
            [second],
        ),
    )
    status, out, _ = await cli(setup.config, "verify")
    assert status == 3
    assert out.strip() == (
        f"journal does not verify: submission record of action {second} (deposit tx-3): its"
        " payload is gone but no purge entry names it (changed by hand?)"
    )


async def test_an_entry_changed_by_hand_is_named(setup: Setup) -> None:
    by_hand(
        setup.storage,
        *drop_append_only(setup.storage),
        "UPDATE journal SET body = replace(body, '20.50', '2000.50') WHERE seq = 2",
    )
    status, out, _ = await cli(setup.config, "verify")
    assert status == 3
    assert out.strip() == (
        "journal does not verify: journal entry 2: its content does not match its digest"
    )


async def test_the_head_and_an_anchor(setup: Setup) -> None:
    status, out, _ = await cli(setup.config, "verify", "--head")
    assert (status, out) == (0, f"{setup.head.seq} {setup.head.hash}\n")
    # As printed, it is an anchor too.
    status, _, _ = await cli(setup.config, "verify", "--anchor", out.strip())
    assert status == 0
    anchor = journal.Head(2, setup.entries[1].hash)
    status, out, _ = await cli(setup.config, "verify", "--anchor", str(anchor))
    assert status == 0
    assert out.strip().endswith(f"the anchor {anchor} holds")

    wrong = journal.Head(2, "ab" * 32)
    status, out, _ = await cli(setup.config, "verify", "--anchor", str(wrong))
    assert status == 3
    assert out.strip() == (
        f"journal does not verify: journal entry 2: its hash is {anchor.hash}, the anchor's is"
        f" {wrong.hash}: the journal up to the anchor was changed"
    )
    beyond = journal.Head(setup.head.seq + 1, setup.head.hash)
    status, out, _ = await cli(setup.config, "verify", "--anchor", str(beyond))
    assert status == 3
    assert out.strip() == (
        f"journal does not verify: the journal ends at entry {setup.head.seq}, before the"
        f" anchor's entry {beyond.seq}: entries were removed, or the anchor is another"
        " database's"
    )


def test_bad_usage_exits_2_and_a_missing_database_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, make_config(tmp_path / "none.db"))
    for args, said in (
        (["--anchor", "12"], "an anchor is SEQ:HASH"),
        (["--anchor", "0:" + "0" * 64], "entries are numbered from 1"),
        (["--head", "--anchor", "1:" + "0" * 64], "--head prints the head alone"),
    ):
        assert main(["verify", *args, "--config", str(config)]) == 2
        assert said in capsys.readouterr().err
    assert main(["verify", "--config", str(config)]) == 1
    assert "no database at" in capsys.readouterr().err
    assert not (tmp_path / "none.db").exists()


# --- on what the real flow wrote ------------------------------------------------------------

FLOW_ADDRESS = "TVerifyFlowEntity0000000000000001"


@pytest.mark.usefixtures("engine")  # its stacks on SQLite and on PostgreSQL
async def test_what_the_flow_wrote_verifies_and_an_edit_is_named(
    start_stack: Callable[..., Awaitable[Stack]], tmp_path: Path
) -> None:
    """The sandbox's webhooks to a running worker: a deposit from a known address, its profile
    submitted and accepted, then credited and booked. `verify` finds every entry and row in
    place; a ledger row edited afterwards is named by its booking's entry."""
    profiles = tmp_path / "profiles.yaml"
    profiles.write_text(
        json.dumps(
            {"profiles": {"flow-entity": ENTITY_PAYER}, "addresses": {FLOW_ADDRESS: "flow-entity"}}
        )
    )
    stack = await start_stack(profiles=profiles)
    order = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "1234.5678", FLOW_ADDRESS)
    tx = str(order["transactionId"])

    async def accepted() -> bool:
        done = [a for a in await stack.actions(tx) if a["action"] == "submit_profile"]
        return bool(done) and done[-1]["status"] == "done"

    await stack.wait_for(accepted, what="the submission accepted")
    stack.sandbox.approve_review(tx)
    await stack.settle()
    stack.sandbox.finish_sweep(tx)
    await stack.wait_for(stack.ledger, what="the booking")
    await stack.settle()
    entries = await stack.store.read(lambda db: list(journal.entries(db)))
    kinds = [e.kind for e in entries]
    assert journal.SUBMITTED in kinds and journal.BOOKED in kinds

    status, out, err = await cli(stack.config_path, "verify")
    assert (status, err) == (0, ""), out
    assert out.strip() == (
        f"journal verified: {len(entries)} entries, head {entries[-1].seq}:{entries[-1].hash};"
        " 1 ledger row and 1 submission match their entries"
    )

    assert stack.storage is not None
    by_hand(stack.storage, ("UPDATE ledger SET amount = '1.5678' WHERE transaction_id = ?", [tx]))
    status, out, _ = await cli(stack.config_path, "verify")
    assert status == 3
    booked = next(e for e in entries if e.kind == journal.BOOKED)
    assert out.strip() == (
        f"journal does not verify: ledger row {tx}: amount differs from journal entry"
        f" {booked.seq} (edited by hand?)"
    )
