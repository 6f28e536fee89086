"""The PostgreSQL store: the same `Store` (group commit, savepoints, reads on their own thread)
on a server shared by several instances.

What differs from SQLite: the statements of a round that wait on the network (BEGIN, the webhook
inserts, COMMIT) run on the writer thread, so the event loop never waits for a round trip;
migrations run under an advisory lock, so instances starting together migrate once; a lost
connection fails the round in flight (its deliveries are answered 503) and is opened again,
with back-off, by the next round or read.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from worker.config.settings import StorageSettings
from worker.errors import AlreadyServing, StorageError
from worker.logs import get_logger
from worker.store import atcommit, journal
from worker.store.db import Db
from worker.store.durability import postgres_durability
from worker.store.errors import StoreError
from worker.store.pg import PgConnection, PgDatabase, connect
from worker.store.sqlitestore import (
    Store,
    _in_savepoint,
    _Insert,
    _Job,
    _Settled,
    migrate,
)
from worker.urls import db_hosts, mask_url

log = get_logger(__name__)

T = TypeVar("T")

# pg_advisory_lock key held while migrating: "depositd" in ASCII, as a bigint.
MIGRATION_LOCK = 0x6465706F73697464
# The serve lock's key (held shared by every `serve` of the database, see `serve_lock`).
SERVE_LOCK = MIGRATION_LOCK + 1
# `status` and a starting serve take the serve lock exclusively for an instant: a serve
# starting meanwhile tries again.
_LOCK_TRIES, _LOCK_PAUSE_S = 20, 0.05
# How often the serve lock's session is looked at (and, lost, opened again).
LOCK_CHECK_S = 2.0
_LOCK_STOP_S = 5.0
_BACKOFF_S = (0.05, 0.2, 0.5, 1.0, 2.0)


class _Link:
    """One connection that is opened again after it was lost, not more often than the
    back-off allows (a failed attempt is answered at once until the next one is due)."""

    def __init__(self, url: str, password: str | None, name: str) -> None:
        self.url = url
        self.password = password
        self.name = name
        self.db: PgDatabase | None = None
        self._failures = 0
        self._retry_at = 0.0
        self._last_error = ""
        self.on_restored: Callable[[], None] | None = None

    def get(self) -> PgDatabase:
        if self.db is not None and not self.db.conn.broken:
            return self.db
        if self.db is not None:
            self.close()
            log.warning("database connection lost", connection=self.name)
        if time.monotonic() < self._retry_at:
            raise StorageError(f"database unreachable: {self._last_error}")
        try:
            self.db = PgDatabase(
                connect(self.url, password=self.password, application_name=f"depositd-{self.name}")
            )
        except StoreError as exc:
            self._last_error = str(exc)
            self._retry_at = time.monotonic() + _BACKOFF_S[min(self._failures, 4)]
            self._failures += 1
            raise StorageError(f"database unreachable: {exc}") from exc
        if self._failures:
            log.info("database connection restored", connection=self.name)
            if self.on_restored is not None:
                self.on_restored()
        self._failures = 0
        return self.db

    def retry_now(self) -> None:
        """The next `get` connects at once, whatever the back-off (the server is back)."""
        self._retry_at = 0.0

    def close(self) -> None:
        db, self.db = self.db, None
        if db is not None:
            with contextlib.suppress(StoreError):
                db.close()


class PgStore(Store):
    """`Store` on PostgreSQL, named by a `postgresql://` URL."""

    engine = "postgres"

    def __init__(self, url: str, *, password: str | None = None) -> None:
        super().__init__(Path("."), synchronous="FULL")
        self.url = url
        self.where = self.outage.where = mask_url(url)
        self.outage.servers = db_hosts(url)
        self._wlink = _Link(url, password, "writer")
        self._rlink = _Link(url, password, "reader")
        # The writer connected again: the reader may as well, rather than wait out its back-off
        # (a poll reading through it would fail once more after the outage ended).
        self._wlink.on_restored = self._rlink.retry_now

    def _open_writer(self) -> None:
        db = self._wlink.get()
        try:
            db.execute("SELECT pg_advisory_lock(?)", [MIGRATION_LOCK])
            try:
                others = self._others_serving
                migrate(
                    db,
                    # A command: does a serve hold the serve lock now (pg_locks)?
                    others_serving=others if others is not None else lambda: serving_on(db.conn),
                )
            finally:
                db.execute("SELECT pg_advisory_unlock(?)", [MIGRATION_LOCK])
        except StoreError as exc:
            raise StorageError(f"cannot open database {self.where}: {exc}") from exc
        self._wdb = db

    def _open_reader(self) -> None:
        self._rdb = self._rlink.get()

    async def close(self) -> None:
        await super().close()
        self._wlink.close()
        self._rlink.close()

    @staticmethod
    def _close_db(db: Any) -> None:
        """The links close their connections."""

    def _start_checkpoint(self) -> None:
        """PostgreSQL checkpoints on its own."""

    async def empty_wal(self) -> bool:
        """PostgreSQL recycles its WAL on its own: nothing to do."""
        return True

    async def _cycle(
        self, inserts: list[_Insert], inline: list[_Job], threaded: list[_Job]
    ) -> None:
        loop = asyncio.get_running_loop()
        assert self._writer is not None
        settled: list[_Settled] = []
        db: PgDatabase | None = None
        try:
            opened, first = await loop.run_in_executor(self._writer, self._begin_with, inserts)
            db = opened
            settled += first
            # The processor's batches stay on the loop (they are CPU-bound and call back into
            # it); their statements are short round trips on a local network.
            # In pipeline mode: the statements whose results are not read share round trips.
            with opened.conn.pipeline():
                for job in inline:
                    settled.append((job.future, *_in_savepoint(opened, job.fn)))
            finishing = loop.run_in_executor(self._writer, self._finish_on, opened, threaded)
            try:
                settled += await asyncio.shield(finishing)
            except asyncio.CancelledError:
                await asyncio.wait([finishing])
                raise
        except BaseException as exc:
            self._fail_round(db, exc, inserts, inline, threaded)
            if not isinstance(exc, Exception):
                raise
            return
        self._settle(settled)

    @staticmethod
    def _can_roll_back(db: Any) -> bool:
        return bool(db.conn.in_transaction and not db.conn.broken)

    def _begin_with(self, inserts: list[_Insert]) -> tuple[PgDatabase, list[_Settled]]:
        """On the writer thread: BEGIN (connecting again first if the connection was lost),
        then the round's webhook rows."""
        db = self._wlink.get()
        self._wdb = db
        try:
            if db.conn.in_transaction:  # left open by a round that failed half-way
                db.conn.execute("ROLLBACK")
            # Read committed whatever the server's default: a claim that waited for another
            # instance's commit re-checks its condition on the committed row (a lost claim),
            # where repeatable read would fail the job with a serialization error.
            db.conn.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
            atcommit.open_queue(db.conn)
        except StoreError as exc:
            raise StorageError(str(exc)) from exc
        return db, (self._insert_all(db, inserts) if inserts else [])

    def _finish_on(self, db: PgDatabase, jobs: list[_Job]) -> list[_Settled]:
        """On the writer thread: the `write` jobs, then COMMIT."""
        settled: list[_Settled] = [(job.future, *_in_savepoint(db, job.fn)) for job in jobs]
        try:
            # The round's journal entries, last: no other lock is taken after the journal's.
            journal.append_queued(db)
            db.conn.execute("COMMIT")
        except StoreError as exc:
            raise StorageError(str(exc)) from exc
        return settled

    async def durability(self) -> dict[str, Any]:
        """What the server says a commit survives (read on the read connection)."""
        return await self.read(postgres_durability)

    def _run_read(self, fn: Callable[[Any], T]) -> T:
        db = self._rlink.get()  # StorageError while the database is unreachable
        self._rdb = db
        try:
            with db.atomic():
                return fn(db)
        except StoreError as exc:
            raise StorageError(str(exc)) from exc


@contextlib.contextmanager
def serve_lock(storage: StorageSettings) -> Iterator[bool]:
    """Hold the database's serve lock for the block, shared with the other instances, on a
    session of its own; yields True when no other `serve` held it at start (this instance is
    the only one: the claims recorded are of instances gone).

    The lock is an advisory lock of the session: it goes when the session ends, at a clean
    stop as when the process dies (the server sees the connection close). Tried exclusively
    first (`pg_try_advisory_lock`): success means no other instance holds it shared; the
    session then takes it shared and drops the exclusive hold, and others may join. Alone
    means also that no other instance has a session on the database: one whose lock session
    was lost holds no lock until it has replaced it, but its store's sessions are there. A thread
    looks at the session every few seconds and, when it was lost (the server restarted, the
    network dropped it), takes the lock shared again on a new one.
    """
    conn = _lock_connection(storage)
    try:
        sole = _take_serve_lock(conn, mask_url(storage.url or ""))
    except BaseException:
        with contextlib.suppress(StoreError):
            conn.close()
        raise
    keeper = _LockKeeper(storage, conn)
    keeper.start()
    try:
        yield sole
    finally:
        keeper.stop()  # closes the session: the server releases its advisory locks


class _LockKeeper(threading.Thread):
    """Keeps the serve lock's session: a lost one is replaced, the lock taken shared again."""

    def __init__(self, storage: StorageSettings, conn: PgConnection) -> None:
        super().__init__(name="depositd-serve-lock", daemon=True)
        self.storage, self.conn = storage, conn
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.wait(LOCK_CHECK_S):
            try:
                self.conn.execute("SELECT 1")
            except StoreError as exc:
                log.warning("serve lock session lost", error=str(exc))
                self._take_again()
        # Given back here, not by `stop`: on a server that no longer answers, `stop`'s bounded
        # join leaves this thread waiting, and the exit ends it.
        with contextlib.suppress(StoreError):
            self.conn.close_releasing_locks()

    def _take_again(self) -> None:
        self._close()
        while not self._stopping.is_set():
            try:
                self.conn = _lock_connection(self.storage)
                # Waits only while a starting serve holds it exclusively for an instant.
                self.conn.execute("SELECT pg_advisory_lock_shared(?)", [SERVE_LOCK])
                log.info("serve lock taken again")
                return
            except (StorageError, StoreError):
                self._close()
                self._stopping.wait(LOCK_CHECK_S)

    def _close(self) -> None:
        with contextlib.suppress(StoreError):
            self.conn.close()

    def stop(self) -> None:
        """Stop checking; the thread gives the lock back and closes its session as it ends
        (waited for `_LOCK_STOP_S` at most)."""
        self._stopping.set()
        self.join(_LOCK_STOP_S)


def _lock_connection(storage: StorageSettings) -> PgConnection:
    assert storage.url is not None
    password = storage.password.get_secret_value() if storage.password else None
    try:
        return connect(storage.url, password=password, application_name="depositd-serve")
    except StoreError as exc:
        raise StorageError(str(exc)) from exc


def _take_serve_lock(conn: PgConnection, where: str) -> bool:
    """The serve lock exclusively then shared (True: no other serve), or shared (False)."""
    try:
        for attempt in range(_LOCK_TRIES):
            if conn.execute("SELECT pg_try_advisory_lock(?)", [SERVE_LOCK]).fetchone()[0]:
                conn.execute("SELECT pg_advisory_lock_shared(?)", [SERVE_LOCK])
                conn.execute("SELECT pg_advisory_unlock(?)", [SERVE_LOCK])
                return not _instances_connected(conn)
            # Shared fails only while someone holds it exclusively for an instant (`status`
            # looking, another serve starting): try again.
            if conn.execute("SELECT pg_try_advisory_lock_shared(?)", [SERVE_LOCK]).fetchone()[0]:
                return False
            if attempt < _LOCK_TRIES - 1:
                time.sleep(_LOCK_PAUSE_S)
    except StoreError as exc:
        raise StorageError(f"cannot take the serve lock of {where}: {exc}") from exc
    raise AlreadyServing(f"cannot take the serve lock of {where}")


# The sessions of a running `serve` (`PgStore`'s writer and reader, the serve lock's own).
_INSTANCE_SESSIONS = ("depositd-writer", "depositd-reader", "depositd-serve")


def _instances_connected(conn: PgConnection) -> bool:
    """Does another instance have a session on the database, though none holds the serve
    lock? Then one is replacing its lost lock session (the server ended it, the network dropped
    it) and its claims are live: this instance is not alone."""
    marks = ", ".join("?" for _ in _INSTANCE_SESSIONS)
    row = conn.execute(
        "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database()"
        f" AND pid <> pg_backend_pid() AND application_name IN ({marks})",
        list(_INSTANCE_SESSIONS),
    ).fetchone()
    return int(row[0]) > 0


def hold_serve_lock_alone(conn: PgConnection) -> bool:
    """Take the serve lock exclusively on this session, for as long as it lasts (a command
    that needs every `serve` stopped: none starts meanwhile); False while one holds it."""
    return bool(conn.execute("SELECT pg_try_advisory_lock(?)", [SERVE_LOCK]).fetchone()[0])


def serving_on(conn: Db) -> bool:
    """Does a `depositd serve` hold the serve lock of this PostgreSQL database now? Looked
    up in `pg_locks` (any session may read it), without taking the lock."""
    row = conn.execute(
        "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        " AND classid = ? AND objid = ? AND objsubid = 1",
        [SERVE_LOCK >> 32, SERVE_LOCK & 0xFFFFFFFF],
    ).fetchone()
    return int(row[0]) > 0


def serving(storage: StorageSettings) -> bool | None:
    """`serving_on` a command's own connection to `storage.url`; None when it cannot look."""
    try:
        conn = command_connection(storage)
    except StoreError:
        return None
    try:
        return serving_on(conn)
    except StoreError:
        return None
    finally:
        conn.close()


def command_connection(storage: StorageSettings, *, readonly: bool = True) -> PgConnection:
    """A command's own connection to `storage.url` (read-only unless asked); raises
    `StoreUnavailable` naming the server (password masked) when it cannot connect."""
    assert storage.url is not None
    password = storage.password.get_secret_value() if storage.password else None
    conn = connect(storage.url, password=password, application_name="depositd-command")
    if readonly:
        conn.execute("SET default_transaction_read_only = on")
    return conn
