"""Transaction control inside a write transaction (savepoints), and what table helpers run on."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeAlias

from worker.store import atcommit
from worker.store.pg import PgConnection, PgDatabase

if TYPE_CHECKING:
    import sqlite_utils

# What the table helpers run on: the store's database, or a command's connection (SQLite's, or
# their PostgreSQL stand-ins from `worker.store.pg`).
Db: TypeAlias = "sqlite_utils.Database | sqlite3.Connection | PgDatabase | PgConnection"


def conn_of(db: Db) -> sqlite3.Connection | PgConnection:
    """The connection itself: statements on the processor's path skip sqlite-utils'
    `execute` wrapper (they always run inside the caller's transaction)."""
    # Both wrappers (sqlite-utils' Database, PgDatabase) hold the connection as `.conn`; the
    # check names the connections so that sqlite-utils need not be imported to tell them apart.
    return db if isinstance(db, sqlite3.Connection | PgConnection) else db.conn


def release(conn: sqlite3.Connection | PgConnection, name: str) -> None:
    """RELEASE the savepoint `name`. On PostgreSQL in pipeline mode this is where a statement
    of the savepoint's block that was sent without waiting fails (`PgConnection.release`)."""
    if isinstance(conn, PgConnection):
        conn.release(name)
    else:
        conn.execute(f"RELEASE {name}")


@contextmanager
def savepoint(conn: sqlite3.Connection, name: str) -> Iterator[None]:
    """Run the block under a savepoint of the open transaction: if it raises, its writes are
    undone and the exception goes on (a failing store, `sqlite3.OperationalError`, and a
    transaction SQLite dropped are left to the caller, who gives the whole transaction back)."""
    conn.execute(f"SAVEPOINT {name}")
    queued = atcommit.mark(conn)
    try:
        yield
        release(conn, name)  # inside: a statement of the block sent without waiting fails here
    except sqlite3.OperationalError:
        raise
    except BaseException:
        atcommit.drop_after(conn, queued)
        if conn.in_transaction:
            conn.execute(f"ROLLBACK TO {name}")
            release(conn, name)
        raise
