"""The configured database as the commands open it: read-only by default, beside `serve`.

Kept apart from the commands that print (`worker.commands.read`) so that a command such as
`status` opens the database without loading the tracker, the models or sqlite-utils.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from worker.config.settings import Settings, load_settings
from worker.store.database import has_table, probe_schema
from worker.store.db import Connection
from worker.store.errors import StoreError
from worker.store.sqlite import connect
from worker.urls import mask_url


class NoDatabase(Exception):
    """The configured database file does not exist yet."""


@contextmanager
def open_db(
    args: argparse.Namespace, *, readonly: bool = True, settings: Settings | None = None
) -> Iterator[Connection]:
    """A connection to the configured database (read-only by default); `NoDatabase` if absent.
    A writable one comes with the commands' write lock held (`worker.store.writelock`): refused
    while `migrate-store` copies the database."""
    if settings is None:
        settings = load_settings(args.config)
    if readonly:
        with _connection(settings, readonly=True) as conn:
            _has_schema(conn, settings)
            yield conn
        return
    if settings.storage.url is None and not settings.storage.file.exists():
        raise NoDatabase(f"no database at {settings.storage.file} (has `depositd serve` run yet?)")
    from worker.store.writelock import command_writes

    with command_writes(settings.storage), _connection(settings, readonly=False) as conn:
        _has_schema(conn, settings)
        yield conn


def _has_schema(conn: Connection, settings: Settings) -> None:
    """`NoDatabase` when the database holds no depositd tables (an empty file, or a PostgreSQL
    database `serve` has not started on yet): said as such, not as a missing table."""
    if has_table(conn, "meta"):
        return
    if settings.storage.url is not None:
        where = f"the database {mask_url(settings.storage.url)}"
    else:
        where = str(settings.storage.file)
    raise NoDatabase(f"{where} holds no depositd tables yet (has `depositd serve` run on it?)")


@contextmanager
def _connection(settings: Settings, *, readonly: bool) -> Iterator[Connection]:
    if settings.storage.url is not None:
        from worker.store.pgstore import command_connection  # psycopg: only for PostgreSQL

        pg = command_connection(settings.storage, readonly=readonly)
        try:
            yield pg
        finally:
            pg.close()
        return
    path = settings.storage.file
    if not path.exists():
        raise NoDatabase(f"no database at {path} (has `depositd serve` run yet?)")
    conn: Connection = connect(path, readonly=readonly, synchronous=settings.storage.synchronous)
    if readonly:
        conn = _readable(conn, path)
    try:
        yield conn
    finally:
        conn.close()


def _readable(conn: Connection, path: Path) -> Connection:
    """`conn`, or an immutable reader when a read-only WAL reader cannot start here.

    A WAL reader needs the -shm file; with none left (the service stopped cleanly) and a folder
    this user cannot write, SQLite cannot create it and refuses to read ("attempt to write a
    readonly database"). With no -wal content the main file holds every commit, so reading it
    as immutable is complete (as `rules test` does). A -wal with content is never skipped.
    """
    try:
        probe_schema(conn)
        return conn
    except StoreError as exc:
        if not (exc.code or "").startswith("SQLITE_READONLY") or _wal_has_content(path):
            conn.close()
            raise
    conn.close()
    return connect(path, immutable=True)


def _wal_has_content(path: Path) -> bool:
    wal = path.with_name(path.name + "-wal")
    try:
        return wal.stat().st_size > 0
    except FileNotFoundError:
        return False
    except OSError:
        return True  # cannot tell: do not risk skipping commits


def run_on_db(
    args: argparse.Namespace,
    body: Any,
    *,
    readonly: bool = True,
    settings: Settings | None = None,
) -> int:
    """Run `body(conn, args, out)` on the configured database; exit 1 when it cannot be read.
    `settings`: the caller's, when it has read them already (the file is read once)."""
    out = sys.stdout
    try:
        with open_db(args, readonly=readonly, settings=settings) as conn:
            result: int = body(conn, args, out)
            return result
    except NoDatabase as exc:
        print(f"depositd: {exc}", file=sys.stderr)
        return 1
    except StoreError as exc:
        print(f"depositd: cannot read the database: {exc}", file=sys.stderr)
        return 1
