"""Statements on a database as a whole rather than one table: probes, the tables and columns it
has, and a backup copy's pragmas; each in the SQL of the database's engine."""

from __future__ import annotations

import sqlite3

from worker.store.db import Db
from worker.store.pg import dialect, is_postgres

_COUNT_TABLES = {
    "sqlite": "SELECT COUNT(*) FROM sqlite_master",
    "postgres": "SELECT COUNT(*) FROM information_schema.tables",
}


def probe_schema(conn: Db) -> None:
    """Read the schema: raises when this connection cannot read the database."""
    conn.execute(_COUNT_TABLES[dialect(conn)]).fetchone()


_HAS_TABLE = {
    "sqlite": "SELECT COUNT(*) FROM sqlite_master WHERE type='table' AND name=?",
    "postgres": "SELECT COUNT(*) FROM information_schema.tables"
    " WHERE table_schema = current_schema() AND table_name = ?",
}


def has_table(db: Db, name: str) -> bool:
    """Whether the database has the table (one not yet migrated may lack it)."""
    row = db.execute(_HAS_TABLE[dialect(db)], [name]).fetchone()
    return bool(row[0])


def table_columns(db: Db) -> dict[str, list[str]]:
    """Every table with its column names, in order."""
    if is_postgres(db):
        rows = db.execute(
            "SELECT table_name, column_name FROM information_schema.columns"
            " WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position"
        ).fetchall()
        tables: dict[str, list[str]] = {}
        for table, column in rows:
            tables.setdefault(str(table), []).append(str(column))
        return tables
    names = [
        str(r[0])
        for r in db.execute(
            "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'"
            " ORDER BY name"
        ).fetchall()
    ]
    return {
        name: [str(r[1]) for r in db.execute(f"PRAGMA table_info({name})").fetchall()]
        for name in names
    }


def finish_copy(conn: sqlite3.Connection) -> int:
    """Make a fresh backup copy a standalone file (no WAL); returns its page count."""
    pages = int(conn.execute("PRAGMA page_count").fetchone()[0])
    conn.execute("PRAGMA journal_mode=DELETE")
    return pages
