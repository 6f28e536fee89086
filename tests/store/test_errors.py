"""The store's errors (worker/store/errors.py): each cause raises its member of the family on both
engines, through a command's connection and through the store, and nothing PostgreSQL raises is
a `sqlite3` exception."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.support.pgcluster import ENV_URL, Cluster
from tests.support.ports import free_port
from tests.support.stores import StoreMaker
from worker.errors import StorageError
from worker.store.db import Connection
from worker.store.errors import (
    StoreBusy,
    StoreError,
    StoreIntegrityError,
    StoreUnavailable,
    from_psycopg,
)
from worker.store.pg import connect as pg_connect
from worker.store.sqlite import connect as sqlite_connect

INSERT_META = "INSERT INTO meta (key, value) VALUES (?, ?)"


def _no_sqlite3(exc: BaseException) -> None:
    """Neither `exc` nor anything in its chain of causes is a `sqlite3` exception (on
    PostgreSQL; SQLite's own is the cause of SQLite's)."""
    seen: BaseException | None = exc
    while seen is not None:
        assert not isinstance(seen, sqlite3.Error), repr(seen)
        seen = seen.__cause__ or seen.__context__


async def _database(make_store: StoreMaker) -> None:
    """Create the store's database (its schema) and close it again."""
    store = make_store()
    await store.open()
    await store.close()


@contextlib.contextmanager
def _connection(make_store: StoreMaker) -> Iterator[Connection]:
    """A command's own connection to the test's database, on its engine."""
    if make_store.engine == "postgres":
        conn: Connection = pg_connect(make_store.url())
    else:
        conn = sqlite_connect(Path(make_store.storage()["path"]))
    try:
        yield conn
    finally:
        conn.close()


async def test_a_duplicate_key_is_an_integrity_error(make_store: StoreMaker) -> None:
    """The second row with the same key is refused with `StoreIntegrityError` on a command's
    connection; through the store, the write fails with `StorageError` caused by it."""
    await _database(make_store)
    with _connection(make_store) as conn:
        with conn:
            conn.execute(INSERT_META, ["dup", "1"])
        with pytest.raises(StoreIntegrityError) as caught, conn:
            conn.execute(INSERT_META, ["dup", "2"])
    if make_store.engine == "postgres":
        _no_sqlite3(caught.value)
    assert caught.value.code in ("SQLITE_CONSTRAINT_PRIMARYKEY", "23505")
    store = make_store()
    await store.open()
    try:
        with pytest.raises(StorageError) as wrapped:
            await store.write(lambda db: db.execute(INSERT_META, ["dup", "3"]))
    finally:
        await store.close()
    assert isinstance(wrapped.value.__cause__, StoreIntegrityError)


async def test_a_row_held_by_another_writer_is_busy(make_store: StoreMaker) -> None:
    """A write that cannot wait for another transaction's lock is `StoreBusy`: SQLite's
    write lock with no busy timeout, PostgreSQL's row lock past `lock_timeout`."""
    await _database(make_store)
    with _connection(make_store) as holder, _connection(make_store) as waiter:
        holder.execute("BEGIN IMMEDIATE" if make_store.engine == "sqlite" else "BEGIN")
        holder.execute(INSERT_META, ["held", "1"])
        if make_store.engine == "sqlite":
            waiter.execute("PRAGMA busy_timeout = 0")
            blocked = "BEGIN IMMEDIATE"
        else:
            waiter.execute("SET lock_timeout = '100ms'")
            blocked = "INSERT INTO meta (key, value) VALUES ('held', '2')"
        with pytest.raises(StoreBusy) as caught:
            waiter.execute(blocked)
        holder.execute("ROLLBACK")
    if make_store.engine == "postgres":
        _no_sqlite3(caught.value)
    assert caught.value.code in ("SQLITE_BUSY", "55P03")


async def test_a_lost_serialisation_race_is_busy_on_postgresql(pg_cluster: Cluster) -> None:
    """A repeatable-read transaction updating a row another one changed since its snapshot
    is `StoreBusy` (serialization_failure): the same work may succeed when tried again."""
    maker_url = pg_cluster.create_database()
    try:
        with contextlib.closing(pg_connect(maker_url)) as one:
            one.execute("CREATE TABLE counter (id INTEGER PRIMARY KEY, n INTEGER)")
            one.execute("INSERT INTO counter VALUES (1, 0)")
            with contextlib.closing(pg_connect(maker_url)) as two:
                one.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                one.execute("SELECT n FROM counter WHERE id = 1").fetchone()
                two.execute("UPDATE counter SET n = n + 1 WHERE id = 1")
                with pytest.raises(StoreBusy) as caught:
                    one.execute("UPDATE counter SET n = n + 1 WHERE id = 1")
                one.execute("ROLLBACK")
    finally:
        pg_cluster.drop_database(maker_url)
    _no_sqlite3(caught.value)
    assert caught.value.code == "40001"


def test_a_sqlite_file_that_cannot_be_used_is_unavailable(tmp_path: Path) -> None:
    """A database in a folder that does not exist, a file that is not a database, and a write
    on a read-only connection: `StoreUnavailable`, the operator's to fix."""
    with pytest.raises(StoreUnavailable) as missing:
        sqlite_connect(tmp_path / "no-such-folder" / "d.db")
    assert missing.value.code == "SQLITE_CANTOPEN"
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database, " * 512)
    with pytest.raises(StoreUnavailable) as not_a_database:
        sqlite_connect(garbage).execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
    assert not_a_database.value.code == "SQLITE_NOTADB"
    path = tmp_path / "d.db"
    with contextlib.closing(sqlite_connect(path)) as conn:
        conn.execute("CREATE TABLE t (x)")
    with (
        contextlib.closing(sqlite_connect(path, readonly=True)) as conn,
        pytest.raises(StoreUnavailable) as readonly,
    ):
        conn.execute("INSERT INTO t VALUES (1)")
    assert readonly.value.code == "SQLITE_READONLY"


def test_an_unreachable_postgresql_server_is_unavailable() -> None:
    """Nothing listening where the URL points: `StoreUnavailable`, naming the server."""
    port = free_port()  # nothing listens there
    with pytest.raises(StoreUnavailable) as caught:
        pg_connect(f"postgresql://depositd@127.0.0.1:{port}/depositd")
    _no_sqlite3(caught.value)
    assert f"127.0.0.1:{port}" in str(caught.value)


def test_a_session_the_server_ends_is_unavailable(pg_cluster: Cluster) -> None:
    """A session the server terminated (an operator, a restart) fails its next statement, and
    every one after, with `StoreUnavailable`."""
    url = pg_cluster.create_database()
    try:
        with (
            contextlib.closing(pg_connect(url)) as victim,
            contextlib.closing(pg_connect(url)) as operator,
        ):
            pid = victim.execute("SELECT pg_backend_pid()").fetchone()[0]
            operator.execute("SELECT pg_terminate_backend(?)", [pid])
            with pytest.raises(StoreUnavailable) as ended:
                victim.execute("SELECT 1")
            with pytest.raises(StoreUnavailable) as after:
                victim.execute("SELECT 1")
    finally:
        pg_cluster.drop_database(url)
    for caught in (ended, after):
        _no_sqlite3(caught.value)


async def test_a_stopped_postgresql_server_is_unavailable(pg_cluster: Cluster) -> None:
    """Stopping the server fails an open session and a new one with `StoreUnavailable`; the
    store answers `StorageError` meanwhile, caused by it."""
    if os.environ.get(ENV_URL):
        pytest.skip(f"{ENV_URL} names a server this test cannot stop")
    url = pg_cluster.create_database()
    conn = pg_connect(url)
    try:
        await asyncio.to_thread(pg_cluster.stop)
        try:
            with pytest.raises(StoreUnavailable) as open_session:
                conn.execute("SELECT 1")
            with pytest.raises(StoreUnavailable) as new_session:
                pg_connect(url)
        finally:
            await asyncio.to_thread(pg_cluster.start)
    finally:
        with contextlib.suppress(StoreError):
            conn.close()
        pg_cluster.drop_database(url)
    for caught in (open_session, new_session):
        _no_sqlite3(caught.value)


@pytest.mark.parametrize(
    ("sqlstate", "kind"),
    [
        ("23505", StoreIntegrityError),  # unique_violation
        ("23503", StoreIntegrityError),  # foreign_key_violation
        ("23514", StoreIntegrityError),  # check_violation
        ("P0001", StoreIntegrityError),  # raise_exception: the journal's append-only trigger
        ("40001", StoreBusy),  # serialization_failure
        ("40P01", StoreBusy),  # deadlock_detected
        ("55P03", StoreBusy),  # lock_not_available
        ("08006", StoreUnavailable),  # connection_failure
        ("57P01", StoreUnavailable),  # admin_shutdown
        ("57P03", StoreUnavailable),  # cannot_connect_now
        ("53100", StoreUnavailable),  # disk_full
        ("25006", StoreUnavailable),  # read_only_sql_transaction (a standby)
        ("42P01", StoreError),  # undefined_table
        ("22P02", StoreError),  # invalid_text_representation
    ],
)
def test_each_sqlstate_is_its_member_of_the_family(sqlstate: str, kind: type[StoreError]) -> None:
    """The SQLSTATEs the module's table names, by their psycopg class."""
    error = from_psycopg(psycopg.errors.lookup(sqlstate)("refused"))
    assert type(error) is kind
    assert error.code == sqlstate


def test_psycopg_errors_without_a_sqlstate() -> None:
    """A connection psycopg finds lost or closed is unavailable; a pipeline aborted by an
    earlier failure is busy: the batch is given back whole, not blamed on the event that met
    it (the failure that aborted it may be another's, or lost in a savepoint's cleanup)."""
    assert type(from_psycopg(psycopg.OperationalError("consuming input failed"))) is (
        StoreUnavailable
    )
    assert type(from_psycopg(psycopg.InterfaceError("the connection is closed"))) is (
        StoreUnavailable
    )
    assert type(from_psycopg(psycopg.errors.PipelineAborted("pipeline aborted"))) is StoreBusy
