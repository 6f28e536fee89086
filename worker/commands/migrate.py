"""`depositd migrate-store --to URL|PATH`: copy the database of `--config` into an empty database
of the other engine (docs/postgresql.md).

SQLite to PostgreSQL (`--to postgresql://...`) moves one machine to several; PostgreSQL to a
SQLite file (`--to PATH`) goes back. The service is stopped: the copy is refused while a `serve`
holds the source or the target, and holds their serve locks itself so that none starts
meanwhile; it holds the commands' write lock exclusively (`worker.store.writelock`), so that no
command writes to the source during the copy. The target is written in one transaction (schema,
rows, sequences), checked against the source (rows per table, the ledger's sum per currency)
and the source checked unchanged since the snapshot before it commits: a failure or a
difference leaves it as it was. Exit status: 0 copied and checked, 2 refused, 1 failed.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import sys
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import parse_qsl, urlsplit

from worker.config.settings import StorageSettings, load_settings
from worker.errors import SchemaTooNew, StorageError
from worker.store import transfer, writelock
from worker.store.database import table_columns
from worker.store.errors import StoreError
from worker.store.pg import PgDatabase, connect
from worker.store.pgstore import command_connection, hold_serve_lock_alone, serving_on
from worker.store.servelock import lock_path
from worker.store.sqlite import connect as sqlite_connect
from worker.store.sqlitestore import database, migrate
from worker.urls import mask_url


class Refused(Exception):
    """The copy is not started (exit 2)."""


def run(args: argparse.Namespace) -> int:
    """Copy, check, print the figures of both sides."""
    storage = load_settings(args.config).storage
    to_postgres = args.to.startswith(("postgresql://", "postgres://"))
    target_name = mask_url(args.to) if to_postgres else args.to
    started = time.monotonic()
    try:
        if to_postgres == (storage.url is not None):
            raise Refused(
                f"--to must be a database of the other engine than {storage.where}"
                " (a postgresql:// URL from SQLite, a file from PostgreSQL)"
            )
        if to_postgres and _url_password(args.to):
            # A password on the command line is in the process list and the shell's history.
            raise Refused(
                "--to carries a password: give it with --password-file (or libpq's"
                " PGPASSWORD / PGPASSFILE) and leave it out of the URL"
            )
        password = _password(args.password_file)
        with (
            _held_source(storage) as source,
            _target(args.to, to_postgres, password) as target,
        ):
            figures = _copy(source, target, _progress())
    except (Refused, writelock.Writing) as exc:
        print(f"depositd: migrate-store refused: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"depositd: migrate-store: cannot read the password file: {exc}", file=sys.stderr)
        return 2
    except (StorageError, StoreError, ValueError, ArithmeticError) as exc:
        print(
            f"depositd: migrate-store to {target_name} failed, the target is left as it was: {exc}",
            file=sys.stderr,
        )
        return 1
    _report(sys.stdout, storage.where, target_name, figures, time.monotonic() - started)
    return 0


_Figures = tuple[dict[str, int], dict[str, Decimal]]


def _copy(
    source: Any, target: Any, progress: transfer.Progress | None
) -> tuple[_Figures, _Figures]:
    """Both sides' figures ((source, target) each), once the target committed them."""
    tables = list(table_columns(source))
    transfer.begin_source(source)
    snapshot = transfer.fingerprint(source, tables)
    transfer.begin_target(target)
    try:
        try:
            transfer.create_schema(target)
        except SchemaTooNew as exc:
            raise Refused(str(exc)) from exc
        try:
            transfer.ensure_empty(target, tables)
        except transfer.TargetNotEmpty as exc:
            raise Refused(f"{exc}; give an empty database") from exc
        transfer.copy_rows(source, target, progress)
        transfer.set_sequences(target)
        mine, theirs = transfer.figures(source, tables), transfer.figures(target, tables)
        if mine != theirs:
            raise ValueError(f"the copy differs from the source: {mine} != {theirs}")
        transfer.end(source, commit=False)
        # Something outside depositd's commands (a sqlite3 or psql session, say) may have
        # written to the source since the snapshot: then the copy lacks it.
        if transfer.fingerprint(source, tables) != snapshot:
            raise ValueError(
                "the source changed during the copy (something other than depositd wrote to"
                " it); stop every writer and copy again"
            )
        transfer.end(target, commit=True)
    except BaseException:
        with contextlib.suppress(Exception):
            transfer.end(target, commit=False)
        raise
    finally:
        with contextlib.suppress(Exception):
            transfer.end(source, commit=False)
    return mine, theirs


@contextlib.contextmanager
def _held_source(storage: StorageSettings) -> Iterator[Any]:
    """The source's connection, its schema brought to this version (as `serve` would), its
    serve lock and the commands' write lock held exclusively: refused while a `serve` or a
    command that writes holds them."""
    if storage.url is not None:
        conn = command_connection(storage, readonly=False)
        try:
            if serving_on(conn) or not hold_serve_lock_alone(conn):
                raise Refused(f"a depositd serve runs on {storage.where}: stop every instance")
            writelock.hold_copy_writes(conn, storage.where)
            migrate(PgDatabase(conn))
            yield conn
        finally:
            conn.close_releasing_locks()
        return
    path = storage.file
    if not path.exists():
        raise Refused(f"no database at {path}")
    with (
        _file_lock(path, f"a depositd serve runs on {path}: stop it first"),
        writelock.copy_writes(path),
    ):
        lite = sqlite_connect(path)
        try:
            migrate(database(lite))
            lite.isolation_level = None  # BEGIN and COMMIT are the copy's own
            yield lite
        finally:
            lite.close()


def _url_password(url: str) -> bool:
    """Whether a postgresql:// URL carries a password (user:password@, or ?password=)."""
    parts = urlsplit(url)
    query = {k.lower() for k, _ in parse_qsl(parts.query, keep_blank_values=True)}
    return parts.password is not None or "password" in query


def _password(name: str | None) -> str | None:
    """The target's password: a file, or a credential of `$CREDENTIALS_DIRECTORY` by name."""
    if name is None:
        return None
    path = Path(name)
    credentials = os.environ.get("CREDENTIALS_DIRECTORY")
    if not path.is_absolute() and credentials and (Path(credentials) / name).is_file():
        path = Path(credentials) / name
    return path.read_text().rstrip("\r\n")


@contextlib.contextmanager
def _target(to: str, to_postgres: bool, password: str | None) -> Iterator[Any]:
    """The target's connection (a new SQLite file is removed again if the copy fails)."""
    if to_postgres:
        conn = connect(to, password=password, application_name="depositd-migrate")
        try:
            # A serve on the target would work on rows the copy then replaces; holding its lock,
            # none starts meanwhile.
            if serving_on(conn) or not hold_serve_lock_alone(conn):
                raise Refused(f"a depositd serve runs on {mask_url(to)}: stop it first")
            yield conn
        finally:
            conn.close_releasing_locks()
        return
    path = Path(to)
    created = not path.exists()
    ok = False
    with _file_lock(path, f"a depositd serve runs on {path}"):
        lite = sqlite_connect(path)
        lite.isolation_level = None
        try:
            yield lite
            ok = True
        finally:
            lite.close()
            if created and not ok:
                for name in (path.name, *(path.name + s for s in ("-wal", "-shm"))):
                    path.with_name(name).unlink(missing_ok=True)


@contextlib.contextmanager
def _file_lock(database: Path, busy: str) -> Iterator[None]:
    """A SQLite database's serve lock held exclusively: a `serve` cannot start meanwhile."""
    path = lock_path(database)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Refused(busy) from None
        yield
    finally:
        os.close(fd)


def _progress() -> transfer.Progress | None:
    """Rows copied per table, on a terminal only."""
    if not sys.stderr.isatty():
        return None

    def show(table: str, done: int, total: int) -> None:
        end = "\n" if done >= total else ""
        print(f"\r  copying {table}: {done}/{total} rows", end=end, file=sys.stderr, flush=True)

    return show


def _report(
    out: TextIO, source: str, target: str, figures: tuple[_Figures, _Figures], took: float
) -> None:
    (rows_a, sums_a), (rows_b, sums_b) = figures
    width = max(len(t) for t in rows_a) if rows_a else 5
    print(f"{'table':<{width}}  {'source':>10}  {'target':>10}", file=out)
    for table in rows_a:
        print(f"{table:<{width}}  {rows_a[table]:>10}  {rows_b[table]:>10}", file=out)
    print(f"{'ledger sum':<{width}}  {'source':>20}  {'target':>20}", file=out)
    for currency in sums_a:
        print(f"{currency:<{width}}  {sums_a[currency]:>20}  {sums_b[currency]:>20}", file=out)
    print(
        f"copied {source} to {target} in {took:.1f}s: rows per table and ledger sums match",
        file=out,
    )
