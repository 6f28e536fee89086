"""The ledger table (one row per booked deposit): every statement on it.

Each function runs inside the caller's transaction (`Store.write` jobs).
"""

from __future__ import annotations

import sqlite3
from typing import Any

from worker.store.tx import Db

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
    """Every ledger row in booking order (ties in insertion order)."""
    return [dict(r) for r in db.execute("SELECT * FROM ledger ORDER BY booked_at, rowid")]


def count_booked(db: Db) -> int:
    """How many deposits are booked."""
    return int(db.execute("SELECT COUNT(*) FROM ledger").fetchone()[0])


def snapshot(db: Db) -> tuple[Any, ...]:
    """Figures that change whenever a deposit is booked."""
    return tuple(db.execute("SELECT COUNT(*) FROM ledger").fetchone())
