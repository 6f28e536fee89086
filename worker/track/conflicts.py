"""Fixed-field conflicts: a later fact contradicting what the first fact fixed.

The first fact about a deposit fixes its amount, wallet, currency, network and addresses
(`worker.track.tracker.FIXED_FIELDS`).
A later fact stating another value is stored as usual, recorded
here, alerted (critical, once per field) and holds every booking of the deposit until a human
decides the value with `depositd resolve`; the booking that was held then happens exactly once,
with the decided value.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import sqlite_utils

from worker.clock import utc_now
from worker.provider.amounts import AmountError, parse_amount
from worker.track.tracker import FIXED_FIELDS, Deposit, Fact, conflicts

# The options of `depositd resolve --set`: the wire names of the fixed fields.
WIRE_NAMES = {
    "wallet_id": "walletId",
    "currency": "currency",
    "network": "network",
    "amount": "amount",
    "from_address": "fromAddress",
    "to_address": "toAddress",
}
FIELD_OF = {wire: name for name, wire in WIRE_NAMES.items()}


def as_text(value: Any) -> str:
    """A field's value as stored in the conflicts table (amounts without trailing zeros)."""
    if isinstance(value, Decimal):
        return format(value.normalize(), "f")
    return str(value)


def record_conflicts(db: sqlite_utils.Database, before: Deposit | None, fact: Fact) -> list[str]:
    """Record the fixed fields `fact` contradicts; returns the fields newly in conflict (to
    alert about). A value already recorded or decided for that field is not recorded again."""
    new_fields: list[str] = []
    for name, held, stated in conflicts(before, fact):
        tx, stated_text = fact.transaction_id, as_text(stated)
        known = db.execute(
            "SELECT 1 FROM conflicts WHERE transaction_id=? AND field=?"
            " AND (seen_value=? OR fixed_value=? OR decided_value=?) LIMIT 1",
            [tx, name, stated_text, stated_text, stated_text],
        ).fetchone()
        if known is not None:
            continue
        first = db.execute(
            "SELECT 1 FROM conflicts WHERE transaction_id=? AND field=? LIMIT 1", [tx, name]
        ).fetchone()
        db.execute(
            "INSERT INTO conflicts (transaction_id, field, fixed_value, seen_value, source,"
            " event_id, observed_at, created_at) VALUES (?,?,?,?,?,?,?,?)",
            [
                tx,
                name,
                as_text(held),
                stated_text,
                fact.source,
                fact.event_id,
                fact.observed_at,
                utc_now(),
            ],
        )
        if first is None:
            new_fields.append(name)
    return new_fields


def open_conflicts(db: sqlite_utils.Database, transaction_id: str) -> list[dict[str, Any]]:
    """The undecided conflicts of one deposit, oldest first."""
    rows = db.execute(
        "SELECT field, fixed_value, seen_value, source, event_id, created_at FROM conflicts"
        " WHERE transaction_id=? AND decided_at IS NULL ORDER BY id",
        [transaction_id],
    ).fetchall()
    keys = ("field", "fixed_value", "seen_value", "source", "event_id", "created_at")
    return [dict(zip(keys, row, strict=True)) for row in rows]


def all_conflicts(db: sqlite_utils.Database, transaction_id: str) -> list[dict[str, Any]]:
    """Every conflict of one deposit with its decision, oldest first."""
    cur = db.execute(
        "SELECT field, fixed_value, seen_value, source, event_id, created_at, decided_value,"
        " decided_by, decided_at, note FROM conflicts WHERE transaction_id=? ORDER BY id",
        [transaction_id],
    )
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def decided_value(name: str, text: str) -> Any:
    """A decided value for a field, read as that field is (an amount with the amount rules);
    raises ValueError naming what is wrong."""
    if name == "amount":
        try:
            return parse_amount(text, positive=True)
        except AmountError as exc:
            raise ValueError(str(exc)) from None
    if name == "wallet_id":
        if not text.isascii() or not text.isdigit():
            raise ValueError(f"walletId must be a number, not {text!r}")
        return int(text)
    if not text.strip():
        raise ValueError(f"{WIRE_NAMES[name]} must not be empty")
    return text


def decide(
    db: sqlite_utils.Database,
    transaction_id: str,
    values: dict[str, Any],
    *,
    by: str,
    note: str | None,
) -> None:
    """Record the decision on every open conflict of the fields in `values` and set the
    deposit's fields to the decided values; call inside a transaction."""
    now = utc_now()
    for name, value in values.items():
        if name not in FIXED_FIELDS:
            raise ValueError(f"{name} is not a fixed field")
        db.execute(
            "UPDATE conflicts SET decided_value=?, decided_by=?, decided_at=?, note=?"
            " WHERE transaction_id=? AND field=? AND decided_at IS NULL",
            [as_text(value), by, now, note, transaction_id, name],
        )
        stored = format(value, "f") if isinstance(value, Decimal) else value
        db.execute(
            f"UPDATE deposits SET {name}=?, updated_at=? WHERE transaction_id=?",
            [stored, now, transaction_id],
        )
