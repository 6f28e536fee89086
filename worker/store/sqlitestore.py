"""The SQLite store: connections, migrations and the group-commit writer (`Store`).

One write connection: webhook inserts that arrive while a commit is in flight are committed
together in the next transaction (group commit): one fsync for many events, no fixed delay.
Reads use their own connection and thread. The statements on each table are in that table's
module (`worker.store.events`, `worker.store.deposits`, ...).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import sqlite_utils

from worker.clock import utc_now
from worker.errors import SchemaTooNew, SchemaUpgradeRefused, StorageError, StorageUnavailable
from worker.logs import get_logger
from worker.store import atcommit, journal
from worker.store.database import has_table
from worker.store.db import Connection, Database, Db
from worker.store.durability import sqlite_durability
from worker.store.errors import StoreBusy, StoreError
from worker.store.events import insert_events
from worker.store.meta import CREATED_AT, set_meta, set_meta_unless_busy
from worker.store.outage import Outage
from worker.store.pg import PgConnection, PgDatabase, dialect
from worker.store.schema import MIGRATIONS, SCHEMA_VERSION
from worker.store.sqlite import connect
from worker.store.tx import release

log = get_logger(__name__)

T = TypeVar("T")

# Headers worth keeping with a stored event; API-KEY and API-SIGNATURE are credentials.
STORED_HEADERS = ("API-TIMESTAMP", "Content-Type", "User-Agent")


# One events row as inserted (`worker.store.events.insert_events`); built by `event_row`. A
# plain tuple, so that the ingress process can hand it over as it is (`worker.ingest.link`).
EventRow = tuple[str, str | None, str | None, str | None, bytes, str, str, str, str | None]
EVENT_ROW_RECEIVED_AT = 6  # index of received_at in an EventRow
EVENT_ROW_STATUS = 7  # index of status in an EventRow


def event_row(
    event_id: str,
    event_type: str | None,
    reference_id: str | None,
    transaction_id: str | None,
    body: bytes,
    headers: Mapping[str, str],
    received_at: str,
    status: str = "pending",
) -> EventRow:
    """The row of one received event; only the `STORED_HEADERS` of `headers` are kept."""
    return (
        event_id,
        event_type,
        reference_id,
        transaction_id,
        body,
        json.dumps({k: headers[k] for k in STORED_HEADERS if k in headers}),
        received_at,
        status,
        None if status == "pending" else received_at,
    )


@dataclass
class _Insert:
    row: EventRow
    future: asyncio.Future[bool]


def database(conn: Connection) -> Database:
    """The store's database around a command's own connection, on either engine."""
    if isinstance(conn, PgConnection):
        return PgDatabase(conn)
    assert isinstance(conn, sqlite3.Connection)
    return sqlite_utils.Database(conn, execute_plugins=False)


# SQLite: IMMEDIATE, so that the write lock is taken before any read.
_BEGIN_WRITE = {"sqlite": "BEGIN IMMEDIATE", "postgres": "BEGIN"}


@contextmanager
def transaction(db: Database) -> Iterator[Database]:
    """One write transaction (`_BEGIN_WRITE`)."""
    db.conn.execute(_BEGIN_WRITE[dialect(db)])
    atcommit.open_queue(db.conn)
    try:
        yield db
        journal.append_queued(db)
    except BaseException:
        atcommit.close_queue(db.conn)
        if db.conn.in_transaction:
            db.conn.execute("ROLLBACK")
        raise
    db.conn.execute("COMMIT")


def schema_version(db: Db) -> int:
    """The schema version recorded in `meta` (0 for an empty database)."""
    if not has_table(db, "meta"):
        return 0
    row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    return int(row[0]) if row else 0


def migrate(db: Database, *, others_serving: bool | Callable[[], bool] = False) -> int:
    """Apply pending migrations, each with its version record in one transaction.

    `others_serving` (or its answer, asked only when a migration is due): `serve` instances
    hold the database (a rolling upgrade): a schema that needs migrating is refused
    (`SchemaUpgradeRefused`), the schema left as it is.
    See docs/postgresql.md, "Upgrading several instances".
    """
    with transaction(db):
        db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
        current = schema_version(db)
    if current > SCHEMA_VERSION:
        raise SchemaTooNew(
            f"database schema version {current} is newer than this depositd supports "
            f"({SCHEMA_VERSION}); upgrade depositd"
        )
    due = 0 < current < SCHEMA_VERSION
    if due and (others_serving() if callable(others_serving) else others_serving):
        raise SchemaUpgradeRefused(
            f"database schema version {current} needs migrating to {SCHEMA_VERSION}, and"
            " another depositd serve of an older version is running on it; stop every"
            " instance, then start this version (the first one started migrates)"
        )
    for version in range(current, SCHEMA_VERSION):
        with transaction(db):
            MIGRATIONS[version](db)
            if version == 0:
                set_meta(db, CREATED_AT, utc_now())
            set_meta(db, "schema_version", str(version + 1))
        log.info("schema migrated", version=version + 1)
    return SCHEMA_VERSION


_BUSY_TIMEOUT_S = 5.0
_CHECKPOINT_EVERY = 50  # commits between two WAL checkpoints
_EMPTY_WAL_WAIT_S = 2.0  # how long `Store.empty_wal` waits for the reads and writes in flight


class _LostTransaction(StorageError):
    """SQLite rolled the whole group transaction back after an error."""


@dataclass
class _Job:
    fn: Callable[[Database], Any]
    future: asyncio.Future[Any]
    start_by: float = 0.0  # loop time after which the job may open a transaction of its own


# (future, succeeded, result or exception): settled only once the transaction is committed.
_Settled = tuple["asyncio.Future[Any]", bool, Any]


def _in_savepoint(db: Database, fn: Callable[[Database], Any]) -> tuple[bool, Any]:
    """Run `fn` under a savepoint of the open transaction: (True, result), or (False, the
    exception) with `fn`'s writes undone; `_LostTransaction` when SQLite dropped the transaction.
    """
    conn = db.conn
    conn.execute("SAVEPOINT job")
    queued = atcommit.mark(conn)
    try:
        result = fn(db)
        release(conn, "job")  # inside: a statement of `fn` sent without waiting fails here
    except Exception as exc:
        atcommit.drop_after(conn, queued)
        if not conn.in_transaction:
            raise _LostTransaction(f"transaction rolled back: {exc}") from exc
        conn.execute("ROLLBACK TO job")
        release(conn, "job")
        if isinstance(exc, StoreError):
            error = StorageError(str(exc))
            error.__cause__ = exc
            return False, error
        if isinstance(exc, StopIteration):  # a future refuses it (it would end a coroutine)
            wrapped = RuntimeError(f"StopIteration raised: {exc}")
            wrapped.__cause__ = exc
            return False, wrapped
        return False, exc
    return True, result


def _not_stored(exc: BaseException) -> StorageError:
    """A webhook row's failure as the StorageError its delivery is answered 503 for."""
    if isinstance(exc, StorageError):
        return exc
    error = StorageError(f"not stored: {exc!r}")
    error.__cause__ = exc
    return error


def _fail_waiters(
    inserts: list[_Insert], inline: list[_Job], threaded: list[_Job], error: StorageError
) -> None:
    """Every waiter of a round that did not commit gets `error` (unless answered already)."""
    for future in (*(i.future for i in inserts), *(job.future for job in (*inline, *threaded))):
        if not future.done():
            future.set_exception(error)


class Store:
    """The SQLite store: group commit on one write connection, reads on their own thread.

    Writes are grouped: everything queued while a transaction is built and committed (webhook
    inserts, `write_inline` and `write` jobs) goes into the next one, each part under its own
    savepoint, so one fsync serves them all and one part failing undoes that part only. The
    statements of inserts and inline jobs, and the COMMIT, run on the event loop: they are
    short, and a second thread would wait for the GIL once per statement while the loop is busy
    (measured: that, not the disk, was what limited ingestion). The writer thread runs `write`
    jobs (which may be slow; their transaction then commits there too), and WAL checkpoints run
    on the reader thread.
    """

    def __init__(self, path: Path | str, *, synchronous: str = "FULL") -> None:
        self.path = Path(path)
        self.where = str(self.path)  # what logs and status show: the file, or the masked URL
        self.synchronous = synchronous
        self.commits = 0  # write transactions committed; tests and metrics read it
        # Rounds that fail open an outage, logged in a few lines; the next commit closes it.
        self.outage = Outage(self.where)
        self._writer: concurrent.futures.ThreadPoolExecutor | None = None
        self._reader: concurrent.futures.ThreadPoolExecutor | None = None
        self._wdb: Database | None = None
        self._rdb: Database | None = None
        self._inserts: list[_Insert] = []
        self._inline: list[_Job] = []
        self._threaded: list[_Job] = []
        self._work = asyncio.Event()
        self._driver: asyncio.Task[None] | None = None
        self._closing = False
        self._checkpoint: asyncio.Future[None] | None = None
        self._others_serving: bool | None = None  # `open`'s: other instances hold it

    # --- lifecycle ----------------------------------------------------------------------

    async def open(self, *, others_serving: bool | None = None) -> None:
        """Open both connections and apply migrations; `SchemaTooNew` for a newer database,
        `SchemaUpgradeRefused` for an older one while others serve on it (see `migrate`):
        `others_serving` as `serve` knows it from its lock, None (a command) to look now."""
        self._others_serving = others_serving
        loop = asyncio.get_running_loop()
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="store-w")
        self._reader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="store-r")
        try:
            await loop.run_in_executor(self._writer, self._open_writer)
            await loop.run_in_executor(self._reader, self._open_reader)
        except BaseException:
            await self.close()
            raise
        self._closing = False
        self._work = asyncio.Event()
        self._driver = asyncio.create_task(self._drive(), name="store-writer")

    def _open_writer(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = connect(self.path, synchronous=self.synchronous)
            self._wdb = sqlite_utils.Database(conn, execute_plugins=False)
            migrate(self._wdb, others_serving=self._others_now())
            # BEGIN runs on the event loop: waiting for another process's write lock is done
            # there with asyncio.sleep (see `_begin`), never inside SQLite's busy handler.
            conn.execute("PRAGMA busy_timeout = 0")
            # Commits run on the loop: the checkpoints (page copies and an fsync of the
            # database) run on the reader thread instead, see `_start_checkpoint`.
            conn.execute("PRAGMA wal_autocheckpoint = 0")
        except StoreError as exc:
            raise StorageError(f"cannot open database {self.path}: {exc}") from exc
        except OSError as exc:
            raise StorageError(f"cannot open database {self.path}: {exc.strerror}") from exc

    def _others_now(self) -> bool | Callable[[], bool]:
        """`open`'s answer, or how to look: a `serve` holding the database's lock file."""
        if self._others_serving is not None:
            return self._others_serving
        from worker.store.servelock import serving  # the lock file beside the database

        return lambda: bool(serving(self.path))

    def _open_reader(self) -> None:
        try:
            conn = connect(self.path, synchronous=self.synchronous)
            self._rdb = sqlite_utils.Database(conn, execute_plugins=False)
        except StoreError as exc:
            raise StorageError(f"cannot open database {self.path}: {exc}") from exc

    async def close(self) -> None:
        """Finish the queued writes (the commit in flight included), then close."""
        loop = asyncio.get_running_loop()
        if self._driver is not None:
            self._closing = True
            self._work.set()
            driver, self._driver = self._driver, None
            await driver
        self.outage.stop()
        if self._writer is not None:
            writer, self._writer = self._writer, None
            await loop.run_in_executor(writer, self._close_db, self._wdb)
            writer.shutdown(wait=True)
            self._wdb = None
        if self._checkpoint is not None:
            await asyncio.wait([self._checkpoint])
        if self._reader is not None:
            reader, self._reader = self._reader, None
            await loop.run_in_executor(reader, self._close_db, self._rdb)
            reader.shutdown(wait=True)
            self._rdb = None

    @staticmethod
    def _close_db(db: Database | None) -> None:
        if db is not None:
            db.close()

    @property
    def is_open(self) -> bool:
        """True between `open` and `close`."""
        return self._driver is not None and not self._closing

    # --- writes ---------------------------------------------------------------------------

    async def write(self, fn: Callable[[Database], T]) -> T:
        """Run `fn(db)` on the writer thread inside the next group transaction; returns its result
        once committed.

        A SQLite failure becomes `StorageError`; any other exception from `fn` undoes `fn`'s
        writes and propagates unchanged.
        """
        return await self._enqueue(self._threaded, fn)

    async def write_inline(self, fn: Callable[[Database], T], *, ride_along_s: float = 0.0) -> T:
        """Like `write`, but `fn` runs on the event loop: for short CPU-bound work that must
        not pay a thread hand-off per statement (the processor's batches). Never blocking I/O.

        With `ride_along_s`, `fn` waits up to that long for a transaction that other writes
        (webhook inserts) open anyway, instead of adding a commit of its own.
        """
        return await self._enqueue(self._inline, fn, ride_along_s)

    async def _enqueue(
        self, queue: list[_Job], fn: Callable[[Database], T], wait_s: float = 0.0
    ) -> T:
        self._require_open()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        queue.append(_Job(fn, future, loop.time() + wait_s if wait_s > 0 else 0.0))
        self._work.set()
        return await future

    def queue_event(self, row: EventRow) -> asyncio.Future[bool]:
        """Queue one `event_row` for the next group transaction, without waiting: the future
        says True (new) or False (known eventId) once committed, or holds the `StorageError`.
        Concurrent rows share one transaction (group commit).
        """
        self._require_open()
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._inserts.append(_Insert(row, future))
        self._work.set()
        # A cancelled waiter (client gone) is skipped when the outcome is handed out; the
        # insert itself still commits with its batch.
        return future

    def _require_open(self) -> None:
        if self._driver is None or self._closing or self._wdb is None:
            raise StorageError("store is closed")

    async def _drive(self) -> None:
        """One group transaction after another while anything is queued."""
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            start_by = min((job.start_by for job in self._inline), default=None)
            if self._inserts or self._threaded or (start_by is not None and start_by <= now):
                await self._round()
                # Let the waiters just answered run (and queue more) before the next one.
                await asyncio.sleep(0)
                continue
            if self._closing:
                if not self._inline:
                    return
                await self._round()
                continue
            self._work.clear()
            if start_by is None:
                await self._work.wait()
            else:  # only jobs riding along with the next inserts: wait for them, or time out
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._work.wait(), start_by - now)

    async def _round(self) -> None:
        """One group transaction of everything queued; the writer outlives any failure of it."""
        inserts, self._inserts = self._inserts, []
        inline, self._inline = self._inline, []
        threaded, self._threaded = self._threaded, []
        try:
            await self._cycle(inserts, inline, threaded)
        except Exception as exc:  # a bug: fail this round's waiters, but keep the writer
            log.exception("group transaction crashed")
            _fail_waiters(inserts, inline, threaded, StorageError(f"write failed: {exc}"))

    async def _cycle(
        self, inserts: list[_Insert], inline: list[_Job], threaded: list[_Job]
    ) -> None:
        db = self._wdb
        assert db is not None and self._writer is not None
        settled: list[_Settled] = []
        try:
            await self._begin(db)
            if inserts:
                settled += self._insert_all(db, inserts)
            for job in inline:
                settled.append((job.future, *_in_savepoint(db, job.fn)))
            if not threaded:
                # The fsync (~0.3 ms) blocks the loop, which costs less than handing the
                # connection to a thread: getting the GIL back from a busy loop takes longer.
                settled += self._finish(threaded)
            else:
                finishing = asyncio.get_running_loop().run_in_executor(
                    self._writer, self._finish, threaded
                )
                try:
                    settled += await asyncio.shield(finishing)
                except asyncio.CancelledError:
                    # The writer thread owns the connection until it returns: never touch it.
                    await asyncio.wait([finishing])
                    raise
        except BaseException as exc:
            self._fail_round(db, exc, inserts, inline, threaded)
            if not isinstance(exc, Exception):
                raise
            return
        self._settle(settled)

    def _fail_round(
        self,
        db: Database | None,
        exc: BaseException,
        inserts: list[_Insert],
        inline: list[_Job],
        threaded: list[_Job],
    ) -> None:
        """A round that did not commit: roll back what is open, and every waiter gets the error."""
        if db is not None:
            atcommit.close_queue(db.conn)
        if db is not None and self._can_roll_back(db):
            try:
                db.conn.execute("ROLLBACK")
            except StoreError as failed:  # the next BEGIN then fails, and says so
                log.error("rollback failed", error=str(failed))
        text = str(exc) if isinstance(exc, StorageError) else f"write failed: {exc}"
        error = StorageUnavailable(text)
        error.__cause__ = exc
        _fail_waiters(inserts, inline, threaded, error)
        if isinstance(exc, Exception):
            self.outage.failed(text, refused=len(inserts))

    @staticmethod
    def _can_roll_back(db: Database) -> bool:
        return db.conn.in_transaction

    def _settle(self, settled: list[_Settled]) -> None:
        """The round committed: count it, and hand each waiter its result or its exception."""
        self.commits += 1
        self.outage.recovered()
        if self.commits % _CHECKPOINT_EVERY == 0 and self._checkpoint is None:
            self._start_checkpoint()
        for future, ok, value in settled:
            if future.done():
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

    def _start_checkpoint(self) -> None:
        """Copy the WAL into the database on the reader thread, off the event loop."""
        if self._reader is None:
            return
        self._checkpoint = asyncio.get_running_loop().run_in_executor(
            self._reader, self._run_checkpoint
        )
        self._checkpoint.add_done_callback(self._checkpoint_done)

    def _run_checkpoint(self) -> None:
        if self._rdb is not None:
            self._rdb.conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    def _checkpoint_done(self, future: asyncio.Future[None]) -> None:
        self._checkpoint = None
        if not future.cancelled() and future.exception() is not None:
            log.warning("checkpoint failed", error=str(future.exception()))

    async def _begin(self, db: Database) -> None:
        """BEGIN IMMEDIATE, waiting (without blocking the loop) while another process writes."""
        delay, deadline = 0.001, time.monotonic() + _BUSY_TIMEOUT_S
        while True:
            try:
                db.conn.execute("BEGIN IMMEDIATE")
                atcommit.open_queue(db.conn)
                return
            except StoreBusy as exc:
                if time.monotonic() > deadline:
                    raise StorageError(str(exc)) from exc
            except StoreError as exc:
                raise StorageError(str(exc)) from exc
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)

    def _finish(self, jobs: list[_Job]) -> list[_Settled]:
        """On the writer thread: the `write` jobs, then COMMIT."""
        db = self._wdb
        assert db is not None
        settled: list[_Settled] = [(job.future, *_in_savepoint(db, job.fn)) for job in jobs]
        try:
            # The round's journal entries, last: no other lock is taken after the journal's.
            journal.append_queued(db)
            db.conn.execute("COMMIT")
        except StoreError as exc:
            raise StorageError(str(exc)) from exc
        return settled

    def _insert_all(self, db: Database, inserts: list[_Insert]) -> list[_Settled]:
        """The round's webhook rows under one savepoint; if that fails, each row under its own,
        so that one row SQLite refuses fails only its own delivery."""
        ok, result = _in_savepoint(db, lambda d: self._insert_batch(d, inserts))
        if ok:
            return [(i.future, True, new) for i, new in zip(inserts, result, strict=True)]
        if len(inserts) == 1:
            return [(inserts[0].future, False, _not_stored(result))]
        settled: list[_Settled] = []
        for item in inserts:
            ok, result = _in_savepoint(db, partial(self._insert_batch, batch=[item]))
            if ok:
                settled.append((item.future, True, result[0]))
            else:
                settled.append((item.future, False, _not_stored(result)))
        return settled

    @staticmethod
    def _insert_batch(db: Database, batch: Sequence[_Insert]) -> list[bool]:
        results = insert_events(db, [item.row for item in batch])
        if any(results):
            set_meta_unless_busy(db, "last_webhook_at", str(batch[-1].row[EVENT_ROW_RECEIVED_AT]))
        return results

    async def durability(self) -> dict[str, Any]:
        """What an acknowledged (committed) delivery survives (`worker.store.durability`)."""
        return sqlite_durability(self.synchronous)

    async def empty_wal(self) -> bool:
        """Copy the WAL into the database and truncate it, so that no page as it was before
        the last commits (values retention removed) stays in the WAL file. On a connection of
        its own, waiting at most `_EMPTY_WAL_WAIT_S` for the reads and writes in flight; False
        when they kept it from completing now."""
        self._require_open()
        return await asyncio.to_thread(self._empty_wal)

    def _empty_wal(self) -> bool:
        try:
            with contextlib.closing(connect(self.path, synchronous=self.synchronous)) as conn:
                conn.execute(f"PRAGMA busy_timeout = {int(_EMPTY_WAL_WAIT_S * 1000)}")
                busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
        except StoreError as exc:
            raise StorageError(f"WAL not emptied: {exc}") from exc
        return int(busy) == 0

    # --- reads ----------------------------------------------------------------------------

    async def read(self, fn: Callable[[Database], T]) -> T:
        """Run `fn(db)` on the read connection (its own thread); sees committed data only."""
        if self._reader is None or self._rdb is None:
            raise StorageError("store is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._reader, self._run_read, fn)

    def _run_read(self, fn: Callable[[Database], T]) -> T:
        db = self._rdb
        if db is None:
            raise StorageError("store is closed")
        try:
            # A read transaction gives fn one consistent snapshot across its queries.
            with db.atomic():
                return fn(db)
        except StoreError as exc:
            raise StorageError(str(exc)) from exc
