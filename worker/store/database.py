"""Statements on a database as a whole rather than one table: probes and a backup copy's pragmas."""

from __future__ import annotations

import sqlite3

from worker.store.tx import Db


def probe_schema(conn: sqlite3.Connection) -> None:
    """Read the schema: raises when this connection cannot read the database."""
    conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()


def has_table(db: Db, name: str) -> bool:
    """Whether the database has the table (one not yet migrated may lack it)."""
    row = db.execute(
        "SELECT COUNT(*) FROM sqlite_master WHERE type='table' AND name=?", [name]
    ).fetchone()
    return bool(row[0])


def finish_copy(conn: sqlite3.Connection) -> int:
    """Make a fresh backup copy a standalone file (no WAL); returns its page count."""
    pages = int(conn.execute("PRAGMA page_count").fetchone()[0])
    conn.execute("PRAGMA journal_mode=DELETE")
    return pages
