"""The ledger table (one row per booked deposit): every statement on it.

Each function runs inside the caller's transaction (`Store.write` jobs).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import sqlite_utils

from worker.clock import utc_now
from worker.store.pg import is_postgres
from worker.store.tx import Db, conn_of


def is_booked(db: sqlite_utils.Database, transaction_id: str) -> bool:
    """Does the ledger hold the deposit?"""
    found = conn_of(db).execute("SELECT 1 FROM ledger WHERE transaction_id=?", (transaction_id,))
    return found.fetchone() is not None


def booked_under_other_id(
    db: sqlite_utils.Database, tx_hash: str, transaction_id: str
) -> str | None:
    """The transactionId another ledger row with this txHash is booked under, if any."""
    other = (
        conn_of(db)
        .execute(
            "SELECT transaction_id FROM ledger WHERE tx_hash=? AND transaction_id<>? LIMIT 1",
            (tx_hash, transaction_id),
        )
        .fetchone()
    )
    return None if other is None else str(other[0])


def insert_booking(
    db: sqlite_utils.Database,
    *,
    transaction_id: str,
    wallet_id: int | None,
    wallet_name: str | None,
    currency: str | None,
    network: str | None,
    amount: str | None,
    from_address: str | None,
    tx_hash: str | None,
    trigger: str,
) -> bool:
    """Write the deposit's ledger row unless it exists; False when it was already booked."""
    cur = conn_of(db).execute(
        "INSERT OR IGNORE INTO ledger (transaction_id, wallet_id, wallet_name, currency, network,"
        " amount, from_address, tx_hash, booked_at, trigger) VALUES (?,?,?,?,?,?,?,?,?,?)",
        [
            transaction_id,
            wallet_id,
            wallet_name,
            currency,
            network,
            amount,
            from_address,
            tx_hash,
            utc_now(),
            trigger,
        ],
    )
    return cur.rowcount == 1


# The row unless the deposit is booked, or its txHash is booked under another transactionId:
# one statement (one round trip on PostgreSQL) for the booking that goes through. PostgreSQL
# types the values of a SELECT list itself: they are cast to the columns' types.
_BOOK_UNLESS_TAKEN = {
    "sqlite": "INSERT OR IGNORE INTO ledger (transaction_id, wallet_id, wallet_name, currency,"
    " network, amount, from_address, tx_hash, booked_at, trigger)"
    " SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?"
    " WHERE NOT EXISTS (SELECT 1 FROM ledger WHERE tx_hash = ? AND transaction_id <> ?)",
    "postgres": "INSERT INTO ledger (transaction_id, wallet_id, wallet_name, currency,"
    " network, amount, from_address, tx_hash, booked_at, trigger)"
    " SELECT ?::text, ?::bigint, ?::text, ?::text, ?::text, ?::text, ?::text, ?::text,"
    " ?::text, ?::text"
    " WHERE NOT EXISTS (SELECT 1 FROM ledger WHERE tx_hash = ?::text AND transaction_id <> ?)"
    " ON CONFLICT DO NOTHING",
}


def book_unless_taken(
    db: sqlite_utils.Database,
    *,
    transaction_id: str,
    wallet_id: int | None,
    wallet_name: str | None,
    currency: str | None,
    network: str | None,
    amount: str | None,
    from_address: str | None,
    tx_hash: str | None,
    trigger: str,
) -> Callable[[], bool]:
    """Write the deposit's ledger row unless it exists or its txHash is booked under another
    transactionId; returns what says whether it was written (asked when needed: on PostgreSQL
    in pipeline mode the statement is not waited for until then). Not written:
    `is_booked` and `booked_under_other_id` say why."""
    sql = _BOOK_UNLESS_TAKEN["postgres" if is_postgres(db) else "sqlite"]
    values = [transaction_id, wallet_id, wallet_name, currency, network, amount, from_address]
    values += [tx_hash, utc_now(), trigger, tx_hash, transaction_id]
    cursor = conn_of(db).execute(sql, values)
    return lambda: cursor.rowcount == 1


def booked_among(db: sqlite_utils.Database, transaction_ids: list[str]) -> set[str]:
    """Which of these deposits the ledger holds."""
    found: set[str] = set()
    for start in range(0, len(transaction_ids), 500):
        part = transaction_ids[start : start + 500]
        marks = ", ".join("?" for _ in part)
        rows = conn_of(db).execute(
            f"SELECT transaction_id FROM ledger WHERE transaction_id IN ({marks})", part
        )
        found.update(str(r[0]) for r in rows.fetchall())
    return found


# --- reads and commands outside the outbox ---


def booked_since(conn: sqlite3.Connection, since: str | None = None) -> list[Any]:
    """Ledger rows booked at or after `since` (all when None), oldest booking first."""
    query = "SELECT * FROM ledger"
    params: list[Any] = []
    if since is not None:
        query += " WHERE booked_at >= ?"
        params.append(since)
    return conn.execute(query + " ORDER BY booked_at, transaction_id", params).fetchall()


def all_booked(db: Db) -> list[dict[str, Any]]:
    """Every ledger row in booking order, ties in transaction id order (the table's key: the
    same order on both engines, where PostgreSQL has no insertion order to read)."""
    return [dict(r) for r in db.execute("SELECT * FROM ledger ORDER BY booked_at, transaction_id")]


def booked_on_day(db: Db, day: str, *, limit: int, offset: int) -> list[dict[str, Any]]:
    """One page of the deposits booked on a UTC day (YYYY-MM-DD), in booking order."""
    rows = db.execute(
        "SELECT * FROM ledger WHERE substr(booked_at, 1, 10) = ? ORDER BY booked_at,"
        " transaction_id LIMIT ? OFFSET ?",
        [day, limit, offset],
    )
    return [dict(r) for r in rows]


def count_booked(db: Db) -> int:
    """How many deposits are booked."""
    return int(db.execute("SELECT COUNT(*) FROM ledger").fetchone()[0])


def snapshot(db: Db) -> tuple[Any, ...]:
    """Figures that change whenever a deposit is booked."""
    return tuple(db.execute("SELECT COUNT(*) FROM ledger").fetchone())


def sums_by_currency(conn: Db) -> dict[str, Decimal]:
    """The ledger's booked amounts summed per currency, exactly (`depositd migrate-store`
    compares them on both sides)."""
    sums: dict[str, Decimal] = {}
    for currency, amount in conn.execute("SELECT currency, amount FROM ledger").fetchall():
        if amount is not None:
            key = str(currency)
            sums[key] = sums.get(key, Decimal(0)) + Decimal(str(amount))
    return dict(sorted(sums.items()))
