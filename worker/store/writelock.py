"""The write lock of the commands: every command that writes to the database holds it shared
for as long as it runs; `migrate-store` holds it exclusively while it copies
(docs/postgresql.md, "Moving a SQLite database to PostgreSQL: `depositd migrate-store`").

A command that writes while a copy runs would leave the source with a row the copy lacks, so
one of the two is refused: the command when a copy holds the lock, the copy when a command
does. `serve` is kept out by its own lock (`worker.store.servelock`, `worker.store.pgstore`).

SQLite: a `flock` on `<database>.write.lock` beside the database. PostgreSQL: a session
advisory lock on a connection of its own. Either goes with the process, a crash included.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from worker.config.settings import StorageSettings
from worker.errors import DepositdError
from worker.store.db import Db
from worker.store.errors import StoreError

if TYPE_CHECKING:
    from worker.store.sqlitestore import Store

# pg_advisory_lock key: one past the serve lock's (`worker.store.pgstore.SERVE_LOCK`).
WRITE_LOCK = 0x6465706F73697464 + 2


class Copying(DepositdError):
    """A `migrate-store` copies the database: a command that writes is refused."""


class Writing(DepositdError):
    """A command writes to the database: `migrate-store` is refused."""


def lock_path(database: Path) -> Path:
    """The write lock's file of a SQLite database."""
    return database.with_name(database.name + ".write.lock")


def _open(database: Path) -> int:
    path = lock_path(database)
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except PermissionError:
        return os.open(path, os.O_RDONLY)  # another user's file: flock needs no write access


@contextlib.contextmanager
def command_writes(storage: StorageSettings) -> Iterator[None]:
    """Hold the write lock shared for the block; `Copying` while a `migrate-store` holds it."""
    refused = Copying(
        f"migrate-store is copying {storage.where}: nothing was written; run the command"
        " again once the copy is done (on the database the service uses then)"
    )
    if storage.url is not None:
        conn = _pg_connection(storage)
        try:
            if not conn.execute("SELECT pg_try_advisory_lock_shared(?)", [WRITE_LOCK]).fetchone()[
                0
            ]:
                raise refused
            yield
        finally:
            with contextlib.suppress(StoreError):
                conn.close_releasing_locks()
        return
    fd = _open(storage.file)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise refused from None
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def copy_writes(database: Path) -> Iterator[None]:
    """Hold a SQLite database's write lock exclusively for the block; `Writing` while a
    command holds it."""
    fd = _open(database)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Writing(
                f"a depositd command writes to {database}: copy once it has finished"
            ) from None
        yield
    finally:
        os.close(fd)


def hold_copy_writes(conn: Db, where: str) -> None:
    """Take a PostgreSQL database's write lock exclusively on `conn`'s session, for as long as
    it lasts; `Writing` while a command holds it."""
    if not conn.execute("SELECT pg_try_advisory_lock(?)", [WRITE_LOCK]).fetchone()[0]:
        raise Writing(f"a depositd command writes to {where}: copy once it has finished")


def _pg_connection(storage: StorageSettings) -> Any:
    from worker.store.pgstore import command_connection  # psycopg: only for PostgreSQL

    return command_connection(storage)


@contextlib.asynccontextmanager
async def command_store(storage: StorageSettings) -> AsyncIterator[Store]:
    """The store of a command that writes, opened with the write lock held."""
    from worker.store.engines import store_for

    with command_writes(storage):
        store = store_for(storage)
        await store.open()
        try:
            yield store
        finally:
            await store.close()
