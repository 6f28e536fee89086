"""Fixed-field conflicts on a real SQLite store: what is recorded, the critical alert a person
reads, what holds a booking, and a person's decision (`depositd resolve`)."""

from __future__ import annotations

import json
import threading
from decimal import Decimal
from typing import Any

import pytest
import sqlite_utils

from tests.support.pgcluster import Cluster
from worker.store.conflicts import all_conflicts
from worker.store.deposits import get_deposit_row, lock_deposit
from worker.store.pg import PgDatabase
from worker.store.pg import connect as pg_connect
from worker.store.pgstore import PgStore
from worker.track.conflicts import (
    decide,
    decided_value,
    held_by,
    hold_likely_duplicate,
)
from worker.track.processor import apply_fact
from worker.track.tracker import Deposit, Fact

TX = "tx-c1"
T0 = 1_700_000_000_000


def fact(t: int, *, source: str = "webhook", event_id: str | None = None, **fields: Any) -> Fact:
    """A fact about TX stating the fixed fields (changed by `fields`)."""
    stated: dict[str, Any] = {
        "wallet_id": 1001,
        "currency": "USDT",
        "network": "TRON",
        "amount": Decimal("12.5"),
        "from_address": "TFrom",
        "to_address": "TTo",
        "tx_hash": "0xabc",
    }
    stated.update(fields)
    return Fact(TX, source, T0 + t, event_id=event_id, **stated)


def apply(db: sqlite_utils.Database, f: Fact) -> Deposit:
    with db.conn:
        deposit, _, _ = apply_fact(db, f, None)
    return deposit


def alerts(db: sqlite_utils.Database) -> list[dict[str, Any]]:
    rows = db.execute(
        "SELECT transaction_id, event_id, trigger, params FROM actions WHERE action='alert'"
        " ORDER BY id"
    ).fetchall()
    return [{"tx": r[0], "event": r[1], "trigger": r[2], **json.loads(r[3])} for r in rows]


def recorded(db: sqlite_utils.Database) -> list[tuple[Any, ...]]:
    return [
        (c["field"], c["fixed_value"], c["seen_value"], c["source"], c["event_id"])
        for c in all_conflicts(db, TX)
    ]


def test_a_contradicting_fact_is_recorded_and_alerted_once_per_field(
    db: sqlite_utils.Database,
) -> None:
    """A later fact stating another amount and network: one conflict per field with the held
    and the stated value (amounts without trailing zeros), a critical alert per field saying
    what to run; the same value again records nothing, another value is recorded but not
    alerted again."""
    apply(db, fact(0, event_id="e1"))
    apply(db, fact(1, event_id="e2", amount=Decimal("13.000"), network="ETH"))
    assert recorded(db) == [
        ("network", "TRON", "ETH", "webhook", "e2"),
        ("amount", "12.5", "13", "webhook", "e2"),
    ]
    sent = alerts(db)
    assert [(a["tx"], a["event"], a["trigger"]) for a in sent] == [
        (TX, "e2", "conflict"),
        (TX, "e2", "conflict"),
    ]
    assert {(a["condition"], a["severity"]) for a in sent} == {("fixed_field_conflict", "critical")}
    assert [a["once_per"] for a in sent] == ["network", "amount"]
    assert sent[1]["detail"] == (
        "amount was 12.5, the webhook event e2 says 13; booking is held until a decision: "
        f"depositd resolve {TX} --set amount=VALUE --by NAME"
    )
    assert sent[0]["detail"].startswith("network was TRON, the webhook event e2 says ETH;")
    apply(db, fact(2, source="poll", amount=Decimal("13")))
    assert len(recorded(db)) == 2
    apply(db, fact(3, source="poll", amount=Decimal("14"), from_address="TElse"))
    assert recorded(db)[2:] == [
        ("amount", "12.5", "14", "poll", None),
        ("from_address", "TFrom", "TElse", "poll", None),
    ]
    later = alerts(db)[2:]
    assert [a["once_per"] for a in later] == ["from_address"]
    assert later[0]["detail"].startswith("fromAddress was TFrom, the poll fact says TElse;")
    assert "--set fromAddress=VALUE" in later[0]["detail"]
    observed = [
        c["observed_at"] for c in db.execute("SELECT observed_at FROM conflicts").fetchall()
    ]
    assert observed == [T0 + 1, T0 + 1, T0 + 3, T0 + 3]


def test_the_held_value_or_a_decided_one_stated_again_is_no_new_conflict(
    db: sqlite_utils.Database,
) -> None:
    """After a decision, a fact stating the decided value or the first value records
    nothing new and alerts nothing new."""
    apply(db, fact(0))
    apply(db, fact(1, amount=Decimal("20")))
    with db.conn:
        decide(db, TX, {"amount": Decimal("20")}, by="ana", note=None)
    apply(db, fact(2, amount=Decimal("20.00")))
    apply(db, fact(3, amount=Decimal("12.50")))
    assert recorded(db) == [("amount", "12.5", "20", "webhook", None)]
    assert len(alerts(db)) == 1


def test_open_conflicts_hold_the_deposit_until_decided(db: sqlite_utils.Database) -> None:
    """The open conflicts are what holds a booking; none, without a query, for a deposit the
    fact being reacted to has just created."""
    apply(db, fact(0))
    apply(db, fact(1, source="poll", amount=Decimal("99")))
    [held] = held_by(db, TX)
    assert {k: held[k] for k in ("field", "fixed_value", "seen_value", "source")} == {
        "field": "amount",
        "fixed_value": "12.5",
        "seen_value": "99",
        "source": "poll",
    }
    assert [c["field"] for c in held_by(db, TX, created=False)] == ["amount"]
    assert held_by(db, TX, created=True) == []
    with db.conn:
        decide(db, TX, {"amount": Decimal("99")}, by="ana", note="bank statement")
    assert held_by(db, TX) == []


def test_a_decision_sets_the_deposit_and_records_who_decided(db: sqlite_utils.Database) -> None:
    """`resolve --set amount=13.0 --set network=ETH`: the deposit's amount and network become
    the decided values, each open conflict records the value, who, when and why."""
    apply(db, fact(0))
    apply(db, fact(1, amount=Decimal("13"), network="ETH"))
    before = get_deposit_row(db, TX)
    assert before is not None
    with db.conn:
        decide(db, TX, {"amount": Decimal("13.0"), "network": "ETH"}, by="ana", note="ok")
    row = get_deposit_row(db, TX)
    assert row is not None
    assert (row["amount"], row["network"], row["currency"]) == ("13.0", "ETH", "USDT")
    assert row["updated_at"] != before["updated_at"]
    decisions = [
        (c["field"], c["decided_value"], c["decided_by"], c["note"], c["decided_at"] is not None)
        for c in all_conflicts(db, TX)
    ]
    assert decisions == [("network", "ETH", "ana", "ok", True), ("amount", "13", "ana", "ok", True)]


def test_a_duplicate_decision_changes_no_field_and_a_status_is_no_fixed_field(
    db: sqlite_utils.Database,
) -> None:
    """`--set duplicate=no` records the decision and leaves the deposit's fields; a field that
    is not fixed is refused."""
    deposit = apply(db, fact(0))
    assert hold_likely_duplicate(db, deposit, "tx-booked") is True
    before = get_deposit_row(db, TX)
    with db.conn:
        decide(db, TX, {"duplicate": "no"}, by="bob", note=None)
    assert get_deposit_row(db, TX) == before
    [c] = all_conflicts(db, TX)
    assert (c["field"], c["decided_value"], c["decided_by"]) == ("duplicate", "no", "bob")
    with pytest.raises(ValueError, match=r"^status is not a fixed field$"):
        decide(db, TX, {"status": "SUCCESS"}, by="bob", note=None)


def test_a_likely_duplicate_is_held_once(db: sqlite_utils.Database) -> None:
    """A second transactionId of a booked txHash is held naming the booked one; holding it
    again records and alerts nothing new."""
    deposit = apply(db, fact(0))
    assert hold_likely_duplicate(db, deposit, "tx-booked") is True
    assert hold_likely_duplicate(db, deposit, "tx-booked") is False
    [c] = all_conflicts(db, TX)
    assert (c["field"], c["fixed_value"], c["seen_value"], c["source"], c["event_id"]) == (
        "duplicate",
        "tx-booked",
        "0xabc",
        "ledger",
        None,
    )
    assert db.execute("SELECT observed_at FROM conflicts").fetchone()[0] is None
    assert c["created_at"]
    assert [h["field"] for h in held_by(db, TX)] == ["duplicate"]


@pytest.mark.parametrize(
    ("name", "text", "value"),
    [
        ("amount", " 12.50 ", Decimal("12.50")),
        ("duplicate", " Yes ", "yes"),
        ("duplicate", "NO", "no"),
        ("wallet_id", "2002", 2002),
        ("currency", "USDC", "USDC"),
        ("from_address", " TAbc\t", "TAbc"),
    ],
)
def test_a_decided_value_is_read_as_its_field(name: str, text: str, value: Any) -> None:
    """`resolve --set` values: an amount exactly, duplicate yes/no whatever the case, a
    walletId as a number, another field as given without the spaces around it (no fact
    states them: a decided address with a space would be contradicted by every later fact)."""
    got = decided_value(name, text)
    assert got == value
    assert type(got) is type(value)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("amount", "0", "a deposit amount must be above zero"),
        ("amount", "1,000", "amount is not a decimal number"),
        ("duplicate", "maybe", "duplicate must be yes (never booked) or no (its own deposit)"),
        ("wallet_id", "12a", "walletId must be a number, not '12a'"),
        ("wallet_id", "\uff11\uff12", "walletId must be a number, not '\uff11\uff12'"),
        ("currency", "  ", "currency must not be empty"),
        ("to_address", "", "toAddress must not be empty"),
    ],
)
def test_a_bad_decided_value_is_refused_saying_why(name: str, text: str, message: str) -> None:
    """A value that cannot be the field's is refused with a message for the person."""
    with pytest.raises(ValueError) as info:
        decided_value(name, text)
    assert str(info.value).startswith(message)


async def test_a_decision_waits_for_a_batch_holding_the_deposit_on_postgres(
    pg_cluster: Cluster,
) -> None:
    """PostgreSQL: while another instance's transaction holds the deposit, a decision waits
    for it (never writing over a row that batch is about to write back), then goes on."""
    url = pg_cluster.create_database()
    try:
        store = PgStore(url)
        await store.open()
        await store.close()
        one, two = PgDatabase(pg_connect(url)), PgDatabase(pg_connect(url))
        try:
            one.execute("INSERT INTO deposits (transaction_id, amount) VALUES (?, ?)", [TX, "1"])
            one.execute("BEGIN")
            lock_deposit(one, TX)  # as a processor batch holds its deposits
            done: list[str] = []

            def decision() -> None:
                two.execute("BEGIN")
                decide(two, TX, {"amount": Decimal("2")}, by="ana", note=None)
                two.execute("COMMIT")
                done.append("decided")

            thread = threading.Thread(target=decision)
            thread.start()
            thread.join(0.5)
            assert done == [], "the decision did not wait for the deposit's holder"
            one.execute("COMMIT")
            thread.join(10)
            assert not thread.is_alive(), "the decision never returned"
            assert done == ["decided"]
            row = one.execute("SELECT amount FROM deposits WHERE transaction_id=?", [TX]).fetchone()
            assert tuple(row) == ("2",)
        finally:
            one.close()
            two.close()
    finally:
        pg_cluster.drop_database(url)


def test_a_field_already_recorded_does_not_hide_the_next_one(db: sqlite_utils.Database) -> None:
    """A fact restating a recorded amount and stating a new fromAddress: the address is
    recorded (and alerted), with the time it was recorded."""
    apply(db, fact(0))
    apply(db, fact(1, amount=Decimal("13")))
    apply(db, fact(2, amount=Decimal("13"), from_address="TElse"))
    assert recorded(db) == [
        ("amount", "12.5", "13", "webhook", None),
        ("from_address", "TFrom", "TElse", "webhook", None),
    ]
    assert [a["once_per"] for a in alerts(db)] == ["amount", "from_address"]
    assert all(c["created_at"] for c in all_conflicts(db, TX))


def test_one_decision_on_a_duplicate_and_a_tiny_amount(db: sqlite_utils.Database) -> None:
    """`--set duplicate=no --set amount=0.00000010` at once: both decided, the deposit's
    amount written in plain digits (never 1.0E-7)."""
    deposit = apply(db, fact(0, amount=Decimal("0.0000001")))
    apply(db, fact(1, amount=Decimal("0.00000011")))
    hold_likely_duplicate(db, deposit, "tx-booked")
    with db.conn:
        decide(
            db,
            TX,
            {"duplicate": "no", "amount": decided_value("amount", "0.00000010")},
            by="ana",
            note=None,
        )
    row = get_deposit_row(db, TX)
    assert row is not None and row["amount"] == "0.00000010"
    assert held_by(db, TX) == []
