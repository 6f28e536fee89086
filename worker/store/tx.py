"""Transaction control inside a write transaction (savepoints), and a database's connection."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, cast

from worker.store import atcommit
from worker.store.db import Connection, Database, Db
from worker.store.errors import StoreBusy, StoreUnavailable
from worker.store.pg import InsertRows, PgConnection


def conn_of(db: Db) -> Connection:
    """The connection itself: statements on the processor's path skip sqlite-utils'
    `execute` wrapper (they always run inside the caller's transaction)."""
    # Both wrappers (sqlite-utils' Database, PgDatabase) hold the connection as `.conn`; the
    # check names the connections so that sqlite-utils need not be imported to tell them apart.
    if isinstance(db, sqlite3.Connection | PgConnection):
        return db
    return cast("Database", db).conn


def insert_rows(db: Db, insert: InsertRows, rows: Sequence[Sequence[Any]]) -> None:
    """Insert the rows (`insert.sql` each), in order: on PostgreSQL in statements of many rows
    each (`PgConnection.insert_rows`), on SQLite one statement per row."""
    conn = conn_of(db)
    if isinstance(conn, PgConnection):
        conn.insert_rows(insert, rows)
    else:
        conn.executemany(insert.sql, rows)


# Ids per IN list on SQLite (well under its limit on bound values).
_IN_CHUNK = 500


def select_among(db: Db, head: str, ids: Sequence[str]) -> list[Any]:
    """The cursors of `head` (a SELECT up to the column tested, `... WHERE transaction_id`)
    for the rows whose column is one of `ids`, sent now and read by the caller (on PostgreSQL
    in pipeline mode, statements sent meanwhile share the round trip): on PostgreSQL one
    statement whatever the number (`= ANY` of an array, prepared once, where an IN list's text
    changes with its length), on SQLite one per `_IN_CHUNK` ids."""
    conn = conn_of(db)
    if isinstance(conn, PgConnection):
        return [conn.execute(f"{head} = ANY(?::text[])", [list(ids)])] if ids else []
    cursors = []
    for start in range(0, len(ids), _IN_CHUNK):
        chunk = ids[start : start + _IN_CHUNK]
        cursors.append(conn.execute(f"{head} IN ({','.join('?' * len(chunk))})", chunk))
    return cursors


def add_row(db: Db, insert: InsertRows, values: Sequence[Any]) -> None:
    """Insert one row (`insert.sql`), its outcome not read: on PostgreSQL in pipeline mode it
    waits to be sent with the rows of the same INSERT added right after it
    (`PgConnection.add_row`)."""
    conn = conn_of(db)
    if isinstance(conn, PgConnection):
        conn.add_row(insert, values)
    else:
        conn.execute(insert.sql, values)


def release(conn: Connection, name: str) -> None:
    """RELEASE the savepoint `name`. On PostgreSQL in pipeline mode this is where a statement
    of the savepoint's block that was sent without waiting fails (`PgConnection.release`)."""
    if isinstance(conn, PgConnection):
        conn.release(name)
    else:
        conn.execute(f"RELEASE {name}")


@contextmanager
def savepoint(conn: Connection, name: str) -> Iterator[None]:
    """Run the block under a savepoint of the open transaction: if it raises, its writes are
    undone and the exception goes on (the store failing, `StoreBusy` or `StoreUnavailable`, and
    a transaction SQLite dropped are left to the caller, who gives the whole transaction back)."""
    conn.execute(f"SAVEPOINT {name}")
    queued = atcommit.mark(conn)
    try:
        yield
        release(conn, name)  # inside: a statement of the block sent without waiting fails here
    except (StoreBusy, StoreUnavailable):
        raise
    except BaseException:
        atcommit.drop_after(conn, queued)
        if isinstance(conn, PgConnection):
            conn.settle()  # what the block sent, waited for: the ROLLBACK TO then runs
        if conn.in_transaction:
            conn.execute(f"ROLLBACK TO {name}")
            release(conn, name)
        raise
