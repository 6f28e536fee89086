"""The booking decision (`worker.act.kinds.book.decide`) case by case, on both engines: what it
says of a deposit in each situation a credit can meet, in the order the cases are checked, and
that deciding writes nothing."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal
from typing import Any

import pytest

from worker.act.kinds.book import (
    BOOK,
    HOLD,
    REFUSE,
    WAITING_FOR_TX_HASH,
    Decision,
    book_held,
    decide,
)
from worker.act.queue import add_action
from worker.clock import now_ms, utc_now
from worker.store import journal, ledger
from worker.store.conflicts import insert_conflict, record_decision
from worker.store.deposits import upsert_deposit_rows
from worker.track.conflicts import DUPLICATE
from worker.track.tracker import Deposit, State

HASH = "0xabc"
BOOKED = "TX-BOOKED"


def credited(tx: str = "TX-NEW", **changes: Any) -> Deposit:
    """A credited deposit of 5 USDT to the merchant's address, with a txHash."""
    now = now_ms()
    deposit = Deposit(
        transaction_id=tx,
        wallet_id=1,
        wallet_name="main",
        currency="USDT",
        network="TRX",
        amount=Decimal("5"),
        from_address="TFROM",
        to_address="TTO",
        tx_hash=HASH,
        status=None,
        white_list_status=None,
        credit_status=None,
        whitelisted=None,
        fail_message=None,
        state=State.CREDITED,
        emitted=frozenset(),
        field_times={},
        first_source="webhook",
        created_at=now,
        updated_at=now,
    )
    return replace(deposit, **changes)


def book(db: Any, deposit: Deposit) -> None:
    """The deposit's ledger row, as a booking writes it."""
    ledger.book_once(
        db,
        transaction_id=deposit.transaction_id,
        wallet_id=deposit.wallet_id,
        wallet_name=deposit.wallet_name,
        currency=deposit.currency,
        network=deposit.network,
        amount=str(deposit.amount),
        from_address=deposit.from_address,
        tx_hash=deposit.tx_hash,
        trigger="credited",
    )()


def conflict(db: Any, tx: str, field: str, fixed: str, seen: str) -> None:
    insert_conflict(
        db,
        tx,
        field,
        fixed_value=fixed,
        seen_value=seen,
        source="poll",
        event_id=None,
        observed_at=None,
        now=utc_now(),
    )


def booked_elsewhere(db: Any) -> None:
    """Another transactionId booked with the same txHash, amount, currency and address (its
    deposit row holds the address: the ledger row has none)."""
    other = credited(BOOKED, to_address="tto ", tx_hash=HASH.upper())
    upsert_deposit_rows(db, [other.to_row()])
    book(db, other)


def booked_elsewhere_without_address(db: Any) -> None:
    """As `booked_elsewhere`, known from its webhook alone: no toAddress."""
    other = credited(BOOKED, to_address=None, tx_hash=HASH.upper())
    upsert_deposit_rows(db, [other.to_row()])
    book(db, other)


def duplicate_decided(value: str) -> Any:
    def setup(db: Any) -> None:
        booked_elsewhere(db)
        conflict(db, "TX-NEW", DUPLICATE, BOOKED, HASH)
        record_decision(db, "TX-NEW", DUPLICATE, value, by="ops", note=None, now=utc_now())

    return setup


def amount_in_conflict(db: Any) -> None:
    conflict(db, "TX-NEW", "amount", "5", "6")


def both_in_conflict(db: Any) -> None:
    conflict(db, "TX-NEW", "to_address", "TTO", "TOTHER")
    amount_in_conflict(db)


def nothing(db: Any) -> None:
    return None


LIKELY = (
    f"held: likely duplicate of {BOOKED}; waiting for a decision"
    " (depositd resolve TX-NEW --set duplicate=yes|no)"
)
IN_CONFLICT = "held: {} in conflict; waiting for a decision (depositd resolve)"

CASES = {
    "credited, nothing booked": (nothing, {}, False, Decision(BOOK)),
    "completed": (nothing, {"state": State.COMPLETED}, False, Decision(BOOK)),
    "submitted: not credited": (
        nothing,
        {"state": State.SUBMITTED},
        False,
        Decision(REFUSE, "not booked: the deposit is submitted, not credited"),
    ),
    "not credited wins over a conflict": (
        amount_in_conflict,
        {"state": State.FAILED},
        False,
        Decision(REFUSE, "not booked: the deposit is failed, not credited"),
    ),
    "a fixed field in conflict": (
        amount_in_conflict,
        {},
        False,
        Decision(HOLD, IN_CONFLICT.format("amount")),
    ),
    "two fields in conflict, named in order": (
        both_in_conflict,
        {},
        False,
        Decision(HOLD, IN_CONFLICT.format("amount, toAddress")),
    ),
    "a conflict wins over a missing txHash": (
        amount_in_conflict,
        {"tx_hash": None},
        False,
        Decision(HOLD, IN_CONFLICT.format("amount")),
    ),
    "txHash not known yet": (
        nothing,
        {"tx_hash": None},
        False,
        Decision(HOLD, WAITING_FOR_TX_HASH),
    ),
    "txHash empty": (nothing, {"tx_hash": ""}, False, Decision(HOLD, WAITING_FOR_TX_HASH)),
    "txHash not known, in a deferring batch": (
        nothing,
        {"tx_hash": None},
        True,
        Decision(HOLD, WAITING_FOR_TX_HASH),
    ),
    "likely duplicate (hash and address case-blind)": (
        booked_elsewhere,
        {},
        False,
        Decision(HOLD, LIKELY, duplicate_of=BOOKED),
    ),
    "likely duplicate, in a deferring batch: the batch's statement checks": (
        booked_elsewhere,
        {},
        True,
        Decision(BOOK),
    ),
    "same txHash, another amount: a batch output": (
        booked_elsewhere,
        {"amount": Decimal("5.1")},
        False,
        Decision(BOOK),
    ),
    "same txHash, same amount written otherwise": (
        booked_elsewhere,
        {"amount": Decimal("5.000")},
        False,
        Decision(HOLD, LIKELY, duplicate_of=BOOKED),
    ),
    "same txHash, another address": (
        booked_elsewhere,
        {"to_address": "TX2"},
        False,
        Decision(BOOK),
    ),
    "same txHash, an address not known on one side": (
        booked_elsewhere_without_address,
        {"to_address": "TX2"},
        False,
        Decision(HOLD, LIKELY, duplicate_of=BOOKED),
    ),
    "same txHash, another currency": (
        booked_elsewhere,
        {"currency": "USDC"},
        False,
        Decision(BOOK),
    ),
    "decided a duplicate": (
        duplicate_decided("yes"),
        {},
        False,
        Decision(REFUSE, "not booked: decided a duplicate (depositd resolve)"),
    ),
    "decided not a duplicate": (duplicate_decided("no"), {}, False, Decision(BOOK)),
}


TABLES = ("ledger", "conflicts", "actions", "journal", "deposits")


@pytest.mark.parametrize("case", list(CASES))
async def test_decide_says_book_hold_or_refuse_and_why_and_writes_nothing(
    make_store: Any, case: str
) -> None:
    setup, changes, deferred, expected = CASES[case]
    store = make_store("d.db")
    await store.open()
    try:
        await store.write(setup)

        def run(db: Any) -> tuple[Decision, list[int], list[int]]:
            before = [db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in TABLES]
            decision = decide(db, credited(**changes), created=False, deferred=deferred)
            after = [db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in TABLES]
            return decision, before, after

        decision, before, after = await store.write(run)
    finally:
        await store.close()
    assert decision == expected
    assert after == before


async def test_a_deposit_just_created_is_not_read_for_conflicts(make_store: Any) -> None:
    """`created`: the fact created the deposit, so no conflict can be recorded against it (a
    stale row left by a test stands for one: it is not read)."""
    store = make_store("d.db")
    await store.open()
    try:
        await store.write(amount_in_conflict)
        decision = await store.write(
            lambda db: decide(db, credited(), created=True, deferred=False)
        )
    finally:
        await store.close()
    assert decision == Decision(BOOK)


async def test_a_held_booking_is_journalled_under_the_rules_that_held_it(make_store: Any) -> None:
    """`book_held`: the BOOKED entry keeps the rules hash of the HELD entry (the rules that
    decided the hold), not that of an earlier entry about the deposit under other rules (its
    submission), nor the rules in force at the release."""
    store = make_store("d.db")
    await store.open()
    deposit = credited()

    def held(db: Any) -> None:
        journal.append(db, journal.SUBMITTED, deposit.transaction_id, {"rules_hash": "old"})
        journal.append(db, journal.HELD, deposit.transaction_id, {"rules_hash": "held"})
        add_action(
            db,
            deposit=deposit,
            action="book",
            params={},
            trigger="credited",
            status="skipped",
            outcome=WAITING_FOR_TX_HASH,
        )

    try:
        await store.write(held)
        done = await store.write(lambda db: book_held(db, deposit, "(known)", rules_hash="now"))
        entries = await store.read(lambda db: journal.entries_about(db, deposit.transaction_id))
    finally:
        await store.close()
    assert done == ("done", "booked")
    [booked] = [e for e in entries if e.kind == journal.BOOKED]
    assert booked.body["rules_hash"] == "held"
