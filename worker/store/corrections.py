"""The ledger's corrections: every statement on them.

A booked deposit's ledger row is never edited. When a person decides that a booked deposit's
amount (or asset) is other than booked, a *reversal* of what is booked (the negated amount,
in the booked asset) and a *rebooking* (the decided amount and asset) are written here, in
the transaction of the decision, each with its journal entry (`REVERSED`, `REBOOKED`). What a
deposit holds in the books is the net of its ledger row and its corrections: the last
rebooking's amount and asset when there is one, the ledger row's otherwise.

Each function runs inside the caller's transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from worker.clock import utc_now
from worker.store import journal
from worker.store.db import Db
from worker.store.tx import conn_of, select_among

REVERSAL = "reversal"
REBOOKING = "rebooking"
BOOKING = "booking"  # the kind of a ledger row itself, where entries of both are listed

# A correction's columns, as its REVERSED or REBOOKED entry's body holds them (`depositd
# verify` compares the row with them).
CORRECTION_FIELDS = (
    "id",
    "transaction_id",
    "kind",
    "wallet_id",
    "wallet_name",
    "currency",
    "network",
    "amount",
    "from_address",
    "tx_hash",
    "booked_at",
    "decided_by",
    "decision",
)
_COLUMNS = ", ".join(CORRECTION_FIELDS)


@dataclass(frozen=True)
class Booked:
    """What a deposit holds in the books now: its amount and asset, and whether a correction
    made it so."""

    amount: Decimal
    currency: str | None
    network: str | None
    corrected: bool


def corrections_of(db: Db, transaction_id: str) -> list[dict[str, Any]]:
    """The deposit's corrections, oldest first."""
    rows = db.execute(
        f"SELECT {_COLUMNS} FROM ledger_corrections WHERE transaction_id = ? ORDER BY id",
        [transaction_id],
    )
    return [dict(r) for r in rows]


def corrections_among(db: Db, transaction_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    """The corrections of these deposits, by transactionId, each deposit's oldest first."""
    cursors = select_among(
        db, f"SELECT {_COLUMNS} FROM ledger_corrections WHERE transaction_id", transaction_ids
    )
    found: dict[str, list[dict[str, Any]]] = {}
    for cursor in cursors:
        for row in cursor.fetchall():
            found.setdefault(str(row[1]), []).append(dict(zip(CORRECTION_FIELDS, row, strict=True)))
    for rows in found.values():
        rows.sort(key=lambda r: int(r["id"]))
    return found


def booked_now(ledger_row: dict[str, Any], corrections: list[dict[str, Any]]) -> Booked:
    """What a deposit with this ledger row and these corrections holds in the books."""
    rebookings = [c for c in corrections if c["kind"] == REBOOKING]
    last = rebookings[-1] if rebookings else ledger_row
    return Booked(
        amount=Decimal(str(last["amount"])),
        currency=last["currency"],
        network=last["network"],
        corrected=bool(rebookings),
    )


def net_amount(ledger_row: dict[str, Any], corrections: list[dict[str, Any]]) -> Decimal:
    """The sum of the booking and its corrections (equal to `booked_now`'s amount for a history
    `depositd verify` accepts, whatever the assets: a reversal reverses what was booked)."""
    total = Decimal(str(ledger_row["amount"]))
    for c in corrections:
        total += Decimal(str(c["amount"]))
    return total


def correct(
    db: Db,
    ledger_row: dict[str, Any],
    *,
    amount: Decimal,
    currency: str | None,
    by: str,
    decision: str,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Reverse what the deposit holds in the books and book `amount` in `currency` instead,
    both journaled with the decision and the person; the two rows written."""
    tx = str(ledger_row["transaction_id"])
    now = booked_now(ledger_row, corrections_of(db, tx))
    at = utc_now()
    common = {
        "transaction_id": tx,
        "wallet_id": ledger_row["wallet_id"],
        "wallet_name": ledger_row["wallet_name"],
        "network": now.network,
        "from_address": ledger_row["from_address"],
        "tx_hash": ledger_row["tx_hash"],
        "booked_at": at,
        "decided_by": by,
        "decision": decision,
    }
    reversal = {**common, "kind": REVERSAL, "currency": now.currency, "amount": str(-now.amount)}
    rebooking = {**common, "kind": REBOOKING, "currency": currency, "amount": str(amount)}
    for row, kind in ((reversal, journal.REVERSED), (rebooking, journal.REBOOKED)):
        row["id"] = _insert(db, row)
        journal.append_at_commit(db, kind, tx, {k: row[k] for k in CORRECTION_FIELDS})
    return reversal, rebooking


def _insert(db: Db, row: dict[str, Any]) -> int:
    names = [n for n in CORRECTION_FIELDS if n != "id"]
    cursor = conn_of(db).execute(
        f"INSERT INTO ledger_corrections ({', '.join(names)})"
        f" VALUES ({', '.join('?' for _ in names)}) RETURNING id",
        [row[n] for n in names],
    )
    return int(cursor.fetchone()[0])


def corrections_between(db: Db, first_day: str, last_day: str) -> list[dict[str, Any]]:
    """The corrections made from one UTC day to another (YYYY-MM-DD, both included), in the
    order they were made."""
    rows = db.execute(
        f"SELECT {_COLUMNS} FROM ledger_corrections"
        " WHERE substr(booked_at, 1, 10) BETWEEN ? AND ? ORDER BY id",
        [first_day, last_day],
    )
    return [dict(r) for r in rows]


def all_corrections(db: Db) -> list[dict[str, Any]]:
    """Every correction in the order they were made."""
    return [dict(r) for r in db.execute(f"SELECT {_COLUMNS} FROM ledger_corrections ORDER BY id")]
