"""The store's errors: what a statement or a connection raises, on either engine.

Every connection the store and the commands use raises these instead of its driver's own
(`worker.store.sqlite.Connection` for SQLite's, `worker.store.pg` for psycopg's), so that a caller
catches one family whatever the engine. The driver's exception is kept as `__cause__`, `code`
names the cause in the engine's own words (SQLite's result code, PostgreSQL's SQLSTATE), and the
message is the driver's.

Which failure is which, SQLite by primary result code, PostgreSQL by SQLSTATE (or its class):

- `StoreIntegrityError`: the statement would break a constraint. SQLite CONSTRAINT (unique,
  foreign key, check, not null, a trigger's refusal) and MISMATCH; PostgreSQL class 23 (the same,
  and exclusion), 40002, and P0001 raise_exception (the only `RAISE` is the journal's
  append-only trigger: a trigger's refusal, as on SQLite).
- `StoreBusy`: SQLite BUSY, LOCKED and PROTOCOL; PostgreSQL 40001 serialization_failure, 40P01
  deadlock_detected, 55P03 lock_not_available, 55006 object_in_use, 57014 query_canceled, and a
  pipeline aborted by an earlier statement's failure (psycopg's `PipelineAborted`: the failure
  that caused it may be another event's, or lost when a savepoint's cleanup ran inside the
  aborted pipeline, so the work is given back whole and tried again rather than blamed on the
  event that met it).
- `StoreUnavailable`: SQLite CANTOPEN, IOERR (disk I/O), FULL, READONLY, PERM, CORRUPT, NOTADB,
  NOLFS, AUTH, and a file `connect` cannot open; PostgreSQL class 08 (connection), 53
  (insufficient resources), 58 (system error), 57P01 to 57P05 (shutdown, cannot connect now),
  25006 read_only_sql_transaction, 40003, XX001, XX002, and psycopg's own errors without a
  SQLSTATE for a connection that cannot be made, was lost or is closed.
- `StoreError` itself: anything else, such as an SQL error (a missing table or column) or a value
  the driver cannot bind.

Busy means another transaction holds what this one needs, or lost a race with it: the same work
may succeed when tried again. Unavailable means the database cannot be used as it is now, by any
statement: the server is gone or refuses sessions, or SQLite's file cannot be opened, read or
written (disk I/O, a full disk, a file or folder without write access, a file that is not a
database or is damaged), for the operator to fix. Neither is the fault of the work that ran into
it: the processor gives its whole batch back for them (the events stay pending, tried again
later), where any other failure is the event's own and is recorded against that event.

`worker.errors.StorageError` is the service's side of the same failures: `Store.read`,
`Store.write` and the webhook inserts raise it (`StorageUnavailable` when a group transaction did
not commit), with the `StoreError` of the statement that failed as its cause.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

from worker.errors import DepositdError

if TYPE_CHECKING:
    import psycopg


class StoreError(DepositdError):
    """A statement or a connection failed; `code`: the engine's name of the cause, if any."""

    def __init__(self, message: str, *, code: str | None = None) -> None:
        self.code = code
        super().__init__(message)


class StoreIntegrityError(StoreError):
    """The statement would break a constraint (unique, foreign key, check, not null): refused."""


class StoreBusy(StoreError):
    """Another transaction holds what this one needs, or this one lost a race (serialisation,
    deadlock, a lock wait timed out): the same work may succeed when tried again."""


class StoreUnavailable(StoreError):
    """The database cannot be used now: cannot connect, connection lost, server shutting down,
    or a SQLite file that cannot be opened, read or written."""


# --- SQLite: by primary result code (the low byte of the extended one) -------------------------

_SQLITE: dict[int, type[StoreError]] = {
    sqlite3.SQLITE_CONSTRAINT: StoreIntegrityError,
    sqlite3.SQLITE_MISMATCH: StoreIntegrityError,
    sqlite3.SQLITE_BUSY: StoreBusy,
    sqlite3.SQLITE_LOCKED: StoreBusy,
    sqlite3.SQLITE_PROTOCOL: StoreBusy,
    sqlite3.SQLITE_CANTOPEN: StoreUnavailable,
    sqlite3.SQLITE_IOERR: StoreUnavailable,
    sqlite3.SQLITE_FULL: StoreUnavailable,
    sqlite3.SQLITE_READONLY: StoreUnavailable,
    sqlite3.SQLITE_PERM: StoreUnavailable,
    sqlite3.SQLITE_CORRUPT: StoreUnavailable,
    sqlite3.SQLITE_NOTADB: StoreUnavailable,
    sqlite3.SQLITE_NOLFS: StoreUnavailable,
    sqlite3.SQLITE_AUTH: StoreUnavailable,
}


def from_sqlite(exc: sqlite3.Error) -> StoreError:
    """The store's error for a `sqlite3` one (an error the module raises itself, without a
    result code, by its DB-API class)."""
    code: int | None = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        kind = _SQLITE.get(code & 0xFF, StoreError)
    else:
        kind = StoreIntegrityError if isinstance(exc, sqlite3.IntegrityError) else StoreError
    error = kind(str(exc), code=getattr(exc, "sqlite_errorname", None))
    error.__cause__ = exc
    return error


# --- PostgreSQL: by SQLSTATE, then its class (the first two characters) ------------------------

_PG_STATES: dict[str, type[StoreError]] = {
    "40002": StoreIntegrityError,  # transaction_integrity_constraint_violation
    "P0001": StoreIntegrityError,  # raise_exception: the journal's append-only trigger
    "40001": StoreBusy,  # serialization_failure
    "40P01": StoreBusy,  # deadlock_detected
    "55P03": StoreBusy,  # lock_not_available (lock_timeout, NOWAIT)
    "55006": StoreBusy,  # object_in_use
    "57014": StoreBusy,  # query_canceled (statement_timeout, a cancel)
    "57P01": StoreUnavailable,  # admin_shutdown
    "57P02": StoreUnavailable,  # crash_shutdown
    "57P03": StoreUnavailable,  # cannot_connect_now (starting, shutting down, recovering)
    "57P04": StoreUnavailable,  # database_dropped
    "57P05": StoreUnavailable,  # idle_session_timeout
    "25006": StoreUnavailable,  # read_only_sql_transaction (a standby, a read-only session)
    "40003": StoreUnavailable,  # statement_completion_unknown
    "XX001": StoreUnavailable,  # data_corrupted
    "XX002": StoreUnavailable,  # index_corrupted
}
_PG_CLASSES: dict[str, type[StoreError]] = {
    "23": StoreIntegrityError,  # integrity_constraint_violation
    "08": StoreUnavailable,  # connection_exception
    "53": StoreUnavailable,  # insufficient_resources (disk full, out of memory, connections)
    "58": StoreUnavailable,  # system_error (I/O)
}


def from_psycopg(exc: psycopg.Error) -> StoreError:
    """The store's error for a psycopg one: by its SQLSTATE; without one (psycopg's own), a
    connection that failed, was lost or is closed is unavailable."""
    import psycopg

    message = str(exc).strip() or type(exc).__name__
    state = exc.sqlstate
    if state is not None:
        kind = _PG_STATES.get(state) or _PG_CLASSES.get(state[:2], StoreError)
    elif isinstance(exc, psycopg.errors.PipelineAborted):
        kind = StoreBusy
    elif isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        kind = StoreUnavailable
    else:
        kind = StoreError
    error = kind(message, code=state)
    error.__cause__ = exc
    return error
