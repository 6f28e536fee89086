"""The `conflicts` table: later facts contradicting a deposit's fixed fields, and decisions."""

from __future__ import annotations

from typing import Any

from worker.store.database import has_table
from worker.store.db import Db
from worker.store.tx import conn_of


def is_recorded(db: Db, transaction_id: str, field: str, value: str) -> bool:
    """Whether `value` is already recorded for the field (seen, fixed or decided)."""
    row = db.execute(
        "SELECT 1 FROM conflicts WHERE transaction_id=? AND field=?"
        " AND (seen_value=? OR fixed_value=? OR decided_value=?) LIMIT 1",
        [transaction_id, field, value, value, value],
    ).fetchone()
    return row is not None


def has_conflict(db: Db, transaction_id: str, field: str) -> bool:
    """Whether any conflict on the field was recorded for the deposit."""
    row = db.execute(
        "SELECT 1 FROM conflicts WHERE transaction_id=? AND field=? LIMIT 1",
        [transaction_id, field],
    ).fetchone()
    return row is not None


def insert_conflict(
    db: Db,
    transaction_id: str,
    field: str,
    *,
    fixed_value: str,
    seen_value: str,
    source: str,
    event_id: str | None,
    observed_at: int | None,
    now: str,
) -> None:
    """Record one conflict, undecided."""
    db.execute(
        "INSERT INTO conflicts (transaction_id, field, fixed_value, seen_value, source,"
        " event_id, observed_at, created_at) VALUES (?,?,?,?,?,?,?,?)",
        [transaction_id, field, fixed_value, seen_value, source, event_id, observed_at, now],
    )


def open_conflicts(db: Db, transaction_id: str) -> list[dict[str, Any]]:
    """The undecided conflicts of one deposit, oldest first."""
    rows = (
        conn_of(db)
        .execute(
            "SELECT field, fixed_value, seen_value, source, event_id, created_at FROM conflicts"
            " WHERE transaction_id=? AND decided_at IS NULL ORDER BY id",
            (transaction_id,),
        )
        .fetchall()
    )
    keys = ("field", "fixed_value", "seen_value", "source", "event_id", "created_at")
    return [dict(zip(keys, row, strict=True)) for row in rows]


def decided_value_of(db: Db, transaction_id: str, field: str) -> str | None:
    """The latest decision on the field's conflicts, or None when none was decided."""
    row = db.execute(
        "SELECT decided_value FROM conflicts WHERE transaction_id=? AND field=?"
        " AND decided_at IS NOT NULL ORDER BY id DESC LIMIT 1",
        [transaction_id, field],
    ).fetchone()
    return None if row is None else str(row[0])


def all_conflicts(db: Db, transaction_id: str) -> list[dict[str, Any]]:
    """Every conflict of one deposit with its decision, oldest first."""
    cur = db.execute(
        "SELECT field, fixed_value, seen_value, source, event_id, created_at, decided_value,"
        " decided_by, decided_at, note FROM conflicts WHERE transaction_id=? ORDER BY id",
        [transaction_id],
    )
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def record_decision(
    db: Db, transaction_id: str, field: str, value: str, *, by: str, note: str | None, now: str
) -> None:
    """Record the decided value on every open conflict of the field."""
    db.execute(
        "UPDATE conflicts SET decided_value=?, decided_by=?, decided_at=?, note=?"
        " WHERE transaction_id=? AND field=? AND decided_at IS NULL",
        [value, by, now, note, transaction_id, field],
    )


def count_held_deposits(db: Db) -> int:
    """How many deposits have an undecided conflict (none before the table exists)."""
    if not has_table(db, "conflicts"):
        return 0
    row = db.execute(
        "SELECT COUNT(DISTINCT transaction_id) FROM conflicts WHERE decided_at IS NULL"
    ).fetchone()
    return int(row[0])
