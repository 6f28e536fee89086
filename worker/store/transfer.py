"""Copying a whole database from one engine to the other (`depositd migrate-store`): the
target's schema, the rows of every table, the generated keys' sequences, and the figures both
sides are compared by (docs/postgresql.md).

The caller holds one transaction on each side: a snapshot of the source, and on the target
the schema, the rows, the sequences and the checks, committed together or not at all. Rows go
through the same statements on both engines (plain INSERT and SELECT); what differs per engine
(taking the target, the sequences) is written out below.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

from worker.errors import SchemaTooNew
from worker.store.database import table_columns
from worker.store.db import Connection
from worker.store.ledger import sums_by_currency
from worker.store.meta import set_meta
from worker.store.pg import is_postgres
from worker.store.schema import MIGRATIONS, SCHEMA_VERSION

# pg_advisory_lock key of migrations (`worker.store.pgstore.MIGRATION_LOCK`): a `serve`
# starting on the target meanwhile waits until the copy is committed or rolled back.
_MIGRATION_LOCK = 0x6465706F73697464
_CHUNK = 1000  # rows per read and per insert
# The names of depositd's tables and columns: a lower-case letter or `_`, then those or digits.
_NAME_START = frozenset(string.ascii_lowercase + "_")
_NAME_CHARS = _NAME_START | frozenset(string.digits)

Progress = Callable[[str, int, int], None]  # (table, rows copied, rows in all)


class TargetNotEmpty(Exception):
    """The target already holds depositd rows."""


def begin_source(conn: Connection) -> None:
    """Open the read transaction every row is copied from (one snapshot of the source)."""
    if is_postgres(conn):
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    else:
        conn.execute("BEGIN")
        conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()  # the snapshot starts


def begin_target(conn: Connection) -> None:
    """Open the target's one write transaction; on PostgreSQL with the migration lock held."""
    if is_postgres(conn):
        conn.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
        conn.execute("SELECT pg_advisory_xact_lock(?)", [_MIGRATION_LOCK])
    else:
        conn.execute("BEGIN IMMEDIATE")


def end(conn: Connection, *, commit: bool) -> None:
    """Commit or roll back the open transaction."""
    conn.execute("COMMIT" if commit else "ROLLBACK")


def recorded_version(conn: Connection) -> int:
    """The schema version a database records (0: none)."""
    if "meta" not in table_columns(conn):
        return 0
    row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    return int(row[0]) if row else 0


def create_schema(conn: Connection) -> None:
    """Bring the target's schema to this version inside the open transaction."""
    conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
    current = recorded_version(conn)
    if current > SCHEMA_VERSION:
        raise SchemaTooNew(
            f"the target's schema version {current} is newer than this depositd supports"
            f" ({SCHEMA_VERSION})"
        )
    for version in range(current, SCHEMA_VERSION):
        MIGRATIONS[version](conn)
        set_meta(conn, "schema_version", str(version + 1))


def row_counts(conn: Connection, tables: list[str]) -> dict[str, int]:
    """Rows per table."""
    return {t: int(conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]) for t in tables}


def ensure_empty(conn: Connection, tables: list[str]) -> None:
    """`TargetNotEmpty` naming the tables that hold rows (`meta` aside: a `serve` started on
    the target records only its start there)."""
    full = [f"{t} ({n} rows)" for t, n in row_counts(conn, tables).items() if n and t != "meta"]
    if full:
        raise TargetNotEmpty("the target holds depositd rows: " + ", ".join(full))


def _chunks(conn: Connection, table: str, columns: list[str]) -> Iterator[list[tuple[Any, ...]]]:
    cursor = conn.execute(f"SELECT {', '.join(columns)} FROM {table}")
    while True:
        rows = [tuple(r) for r in cursor.fetchmany(_CHUNK)]
        if not rows:
            return
        yield rows


def _is_name(name: str) -> bool:
    return name[:1] in _NAME_START and all(char in _NAME_CHARS for char in name)


def copy_rows(source: Any, target: Any, progress: Progress | None = None) -> list[str]:
    """Copy every table of the source into the target's same table (the target's `meta`
    replaced by the source's); returns the tables copied, in order."""
    tables = table_columns(source)
    odd = [n for t, cols in tables.items() for n in (t, *cols) if not _is_name(n)]
    if odd:
        raise ValueError(f"the source has tables or columns depositd does not name: {odd}")
    missing = sorted(set(tables) - set(table_columns(target)))
    if missing:
        raise ValueError(f"the target lacks the tables {', '.join(missing)}")
    totals = row_counts(source, list(tables))
    target.execute("DELETE FROM meta")
    for table, columns in tables.items():
        insert = (
            f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)})"
        )
        done = 0
        if progress is not None:
            progress(table, 0, totals[table])
        for rows in _chunks(source, table, columns):
            target.executemany(insert, rows)
            done += len(rows)
            if progress is not None:
                progress(table, done, totals[table])
    return list(tables)


def set_sequences(conn: Connection) -> int:
    """Set each generated key's sequence past the copied keys; how many were set. SQLite needs
    none: its next key is one past the largest (`sqlite_sequence` follows inserted keys)."""
    if not is_postgres(conn):
        return 0
    keys = conn.execute(
        "SELECT table_name, column_name FROM information_schema.columns"
        " WHERE table_schema = current_schema() AND is_identity = 'YES'"
    ).fetchall()
    for table, column in keys:
        conn.execute(
            f"SELECT setval(pg_get_serial_sequence(?, ?),"
            f" COALESCE((SELECT MAX({column}) FROM {table}), 0) + 1, false)",
            [table, column],
        )
    return len(keys)


def figures(conn: Connection, tables: list[str]) -> tuple[dict[str, int], dict[str, Decimal]]:
    """What both sides are compared by: rows per table, and the ledger's sum per currency."""
    return row_counts(conn, tables), sums_by_currency(conn)


def fingerprint(conn: Connection, tables: list[str]) -> tuple[Any, ...]:
    """What tells whether the source changed since the copy's snapshot: rows per table, a mark
    of every row's content, and the ledger's sums. The mark is SQLite's `data_version` (it moves
    with every commit another connection makes) and on PostgreSQL the sum of each row's hash
    (an update moves it as an insert or a delete does)."""
    if is_postgres(conn):
        marks: list[Any] = [
            tuple(
                conn.execute(
                    f"SELECT COUNT(*), COALESCE(SUM(hashtext(r::text)::bigint), 0) FROM {t} AS r"
                ).fetchone()
            )
            for t in tables
        ]
    else:
        marks = [conn.execute("PRAGMA data_version").fetchone()[0]]
    return (*marks, row_counts(conn, tables), sums_by_currency(conn))
