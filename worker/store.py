"""The SQLite store: schema, migrations and one writer thread with group commit.

Every write runs on a single thread that owns the write connection, so the event loop never
waits on disk and SQLite never sees two writers from this process. Webhook inserts that arrive
while a commit is in flight are queued and committed together in the next transaction (group
commit): one fsync for many events, no fixed delay. Reads use their own connection and thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import sqlite3
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import sqlite_utils

from worker.errors import SchemaTooNew, StorageError
from worker.logs import get_logger

log = get_logger(__name__)

T = TypeVar("T")

EVENT_STATUSES = ("pending", "processed", "ignored", "failed")

_SCHEMA_V1 = """
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id TEXT UNIQUE NOT NULL,
    event_type TEXT,
    reference_id TEXT,
    transaction_id TEXT,
    body BLOB NOT NULL,
    headers TEXT,
    received_at TEXT,
    status TEXT NOT NULL DEFAULT 'pending',
    error TEXT,
    processed_at TEXT
);
CREATE INDEX IF NOT EXISTS events_status ON events (status, seq);
CREATE INDEX IF NOT EXISTS events_transaction ON events (transaction_id);
CREATE TABLE IF NOT EXISTS deposits (
    transaction_id TEXT PRIMARY KEY,
    wallet_id INTEGER,
    wallet_name TEXT,
    currency TEXT,
    network TEXT,
    amount TEXT,
    from_address TEXT,
    to_address TEXT,
    tx_hash TEXT,
    status TEXT,
    white_list_status TEXT,
    credit_status TEXT,
    fail_message TEXT,
    state TEXT,
    emitted TEXT,
    whitelisted INTEGER,
    fact_time INTEGER,
    source TEXT,
    created_at TEXT,
    updated_at TEXT
);
CREATE INDEX IF NOT EXISTS deposits_state ON deposits (state);
CREATE TABLE IF NOT EXISTS facts (
    id INTEGER PRIMARY KEY,
    transaction_id TEXT,
    source TEXT,
    event_id TEXT,
    observed_at INTEGER,
    fact TEXT,
    changed INTEGER,
    recorded_at TEXT
);
CREATE INDEX IF NOT EXISTS facts_transaction ON facts (transaction_id);
CREATE TABLE IF NOT EXISTS actions (
    id INTEGER PRIMARY KEY,
    transaction_id TEXT,
    event_id TEXT,
    trigger TEXT,
    rule_set TEXT,
    rule_set_version TEXT,
    rule TEXT,
    action TEXT,
    params TEXT,
    idempotency_key TEXT,
    status TEXT,
    attempts INTEGER,
    next_attempt_at TEXT,
    outcome TEXT,
    created_at TEXT,
    updated_at TEXT
);
CREATE INDEX IF NOT EXISTS actions_status ON actions (status, next_attempt_at);
CREATE INDEX IF NOT EXISTS actions_transaction ON actions (transaction_id);
CREATE TABLE IF NOT EXISTS ledger (
    transaction_id TEXT PRIMARY KEY,
    wallet_id INTEGER,
    wallet_name TEXT,
    currency TEXT,
    network TEXT,
    amount TEXT,
    from_address TEXT,
    tx_hash TEXT,
    booked_at TEXT,
    trigger TEXT
);
CREATE TABLE IF NOT EXISTS alerts (
    id INTEGER PRIMARY KEY,
    dedupe_key TEXT UNIQUE,
    transaction_id TEXT,
    condition TEXT,
    severity TEXT,
    channel TEXT,
    status TEXT,
    attempts INTEGER,
    last_error TEXT,
    created_at TEXT,
    sent_at TEXT
);
CREATE TABLE IF NOT EXISTS addresses (
    id TEXT PRIMARY KEY,
    wallet_id INTEGER,
    wallet_address TEXT,
    network TEXT,
    memo TEXT,
    status TEXT,
    fail_message TEXT,
    profile TEXT,
    created_at TEXT,
    updated_at TEXT
);
"""


def _migrate_v1(db: sqlite_utils.Database) -> None:
    for statement in _SCHEMA_V1.split(";"):
        if statement.strip():
            db.execute(statement)


# MIGRATIONS[i] brings a database from version i to version i + 1. Append only.
MIGRATIONS: list[Callable[[sqlite_utils.Database], None]] = [_migrate_v1]
SCHEMA_VERSION = len(MIGRATIONS)

# Headers worth keeping with a stored event; API-KEY and API-SIGNATURE are credentials.
STORED_HEADERS = ("API-TIMESTAMP", "Content-Type", "User-Agent")


def utc_now() -> str:
    """Now as ISO 8601 UTC with milliseconds and a Z."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class StoredEvent:
    """One row of the inbox."""

    seq: int
    event_id: str
    event_type: str | None
    reference_id: str | None
    transaction_id: str | None
    body: bytes
    received_at: str | None
    status: str
    error: str | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> StoredEvent:
        """Build from an `events` row."""
        return cls(
            seq=row["seq"],
            event_id=row["event_id"],
            event_type=row["event_type"],
            reference_id=row["reference_id"],
            transaction_id=row["transaction_id"],
            body=bytes(row["body"]),
            received_at=row["received_at"],
            status=row["status"],
            error=row["error"],
        )


@dataclass
class _Insert:
    row: dict[str, Any]
    future: asyncio.Future[bool]


def connect(path: Path, *, synchronous: str = "FULL", readonly: bool = False) -> sqlite3.Connection:
    """A connection with depositd's pragmas (WAL, synchronous, busy timeout, Row factory)."""
    if readonly:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=5.0)
    else:
        conn = sqlite3.connect(str(path), timeout=5.0, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA busy_timeout = 5000")
    if not readonly:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
    return conn


@contextmanager
def transaction(db: sqlite_utils.Database) -> Iterator[sqlite_utils.Database]:
    """One write transaction; BEGIN IMMEDIATE so the write lock is taken before any read."""
    db.conn.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        if db.conn.in_transaction:
            db.conn.execute("ROLLBACK")
        raise
    db.conn.execute("COMMIT")


def schema_version(db: sqlite_utils.Database) -> int:
    """The schema version recorded in `meta` (0 for an empty database)."""
    if not db["meta"].exists():
        return 0
    row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    return int(row[0]) if row else 0


def migrate(db: sqlite_utils.Database) -> int:
    """Apply pending migrations, each with its version record in one transaction."""
    with transaction(db):
        db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
        current = schema_version(db)
    if current > SCHEMA_VERSION:
        raise SchemaTooNew(
            f"database schema version {current} is newer than this depositd supports "
            f"({SCHEMA_VERSION}); upgrade depositd"
        )
    for version in range(current, SCHEMA_VERSION):
        with transaction(db):
            MIGRATIONS[version](db)
            set_meta(db, "schema_version", str(version + 1))
        log.info("schema migrated", version=version + 1)
    return SCHEMA_VERSION


# --- synchronous helpers, usable inside `Store.write`/`Store.read` and by the CLI --------------


def get_meta(db: sqlite_utils.Database, key: str) -> str | None:
    """A value of the `meta` table."""
    row = db.execute("SELECT value FROM meta WHERE key = ?", [key]).fetchone()
    return None if row is None else str(row[0])


def set_meta(db: sqlite_utils.Database, key: str, value: str) -> None:
    """Set a value of the `meta` table."""
    db.execute(
        "INSERT INTO meta (key, value) VALUES (?, ?)"
        " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        [key, value],
    )


def pending_events(db: sqlite_utils.Database, *, limit: int = 100) -> list[StoredEvent]:
    """Pending events in receive order."""
    rows = db.execute(
        "SELECT * FROM events WHERE status = 'pending' ORDER BY seq LIMIT ?", [limit]
    ).fetchall()
    return [StoredEvent.from_row(_as_dict(r)) for r in rows]


def event_status(db: sqlite_utils.Database, seq: int) -> str | None:
    """The status of one stored event."""
    row = db.execute("SELECT status FROM events WHERE seq = ?", [seq]).fetchone()
    return None if row is None else str(row[0])


def mark_event(db: sqlite_utils.Database, seq: int, status: str, error: str | None = None) -> None:
    """Mark an event processed, ignored, failed (with the error) or pending again."""
    if status not in EVENT_STATUSES:
        raise ValueError(f"unknown event status {status!r}")
    processed_at = None if status == "pending" else utc_now()
    db.execute(
        "UPDATE events SET status = ?, error = ?, processed_at = ? WHERE seq = ?",
        [status, error, processed_at, seq],
    )


def get_deposit_row(db: sqlite_utils.Database, transaction_id: str) -> dict[str, Any] | None:
    """The `deposits` row of a transaction, or None."""
    row = db.execute("SELECT * FROM deposits WHERE transaction_id = ?", [transaction_id]).fetchone()
    return None if row is None else _as_dict(row)


def upsert_deposit_row(db: sqlite_utils.Database, row: Mapping[str, Any]) -> None:
    """Insert or update a `deposits` row (keyed by transaction_id)."""
    columns = list(row)
    updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c != "transaction_id")
    db.execute(
        f"INSERT INTO deposits ({', '.join(columns)})"
        f" VALUES ({', '.join('?' for _ in columns)})"
        f" ON CONFLICT (transaction_id) DO UPDATE SET {updates}",
        [row[c] for c in columns],
    )


def insert_fact_row(
    db: sqlite_utils.Database,
    *,
    transaction_id: str,
    source: str,
    event_id: str | None,
    observed_at: int | None,
    fact: Mapping[str, Any],
    changed: bool,
) -> int:
    """Record one fact, applied or not; returns its id."""
    cur = db.execute(
        "INSERT INTO facts (transaction_id, source, event_id, observed_at, fact, changed,"
        " recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
        [
            transaction_id,
            source,
            event_id,
            observed_at,
            json.dumps(fact, sort_keys=True),
            int(changed),
            utc_now(),
        ],
    )
    return int(cur.lastrowid or 0)


def queue_depths(db: sqlite_utils.Database) -> dict[str, int]:
    """Counts for status output: events by status, actions by status, alerts not yet sent."""
    depths: dict[str, int] = {}
    for status, count in db.execute("SELECT status, COUNT(*) FROM events GROUP BY status"):
        depths[f"events_{status}"] = int(count)
    for status, count in db.execute("SELECT status, COUNT(*) FROM actions GROUP BY status"):
        depths[f"actions_{status}"] = int(count)
    row = db.execute("SELECT COUNT(*) FROM alerts WHERE status != 'sent'").fetchone()
    depths["alerts_unsent"] = int(row[0])
    return depths


def oldest_pending_received_at(db: sqlite_utils.Database) -> str | None:
    """receivedAt of the oldest pending event (processing lag)."""
    row = db.execute(
        "SELECT received_at FROM events WHERE status = 'pending' ORDER BY seq LIMIT 1"
    ).fetchone()
    return None if row is None else str(row[0])


def deposits_by_state(db: sqlite_utils.Database) -> dict[str, int]:
    """How many deposits are in each tracked state."""
    return {
        str(state): int(count)
        for state, count in db.execute("SELECT state, COUNT(*) FROM deposits GROUP BY state")
    }


def _as_dict(row: Any) -> dict[str, Any]:
    if isinstance(row, sqlite3.Row):
        return dict(zip(row.keys(), row, strict=True))
    raise TypeError("connection must use sqlite3.Row")


def _resolve_all(
    futures: list[asyncio.Future[bool]], results: list[bool] | None, exc: StorageError | None
) -> None:
    for n, future in enumerate(futures):
        if future.done():
            continue
        if results is None:
            future.set_exception(exc or StorageError("insert failed"))
        else:
            future.set_result(results[n])


class Store:
    """The SQLite store: one writer thread (group commit) and one reader thread."""

    def __init__(self, path: Path | str, *, synchronous: str = "FULL") -> None:
        self.path = Path(path)
        self.synchronous = synchronous
        self.commits = 0  # write transactions committed; tests and metrics read it
        self._writer: concurrent.futures.ThreadPoolExecutor | None = None
        self._reader: concurrent.futures.ThreadPoolExecutor | None = None
        self._wdb: sqlite_utils.Database | None = None
        self._rdb: sqlite_utils.Database | None = None
        self._lock = threading.Lock()
        self._inserts: list[_Insert] = []
        self._flush_queued = False
        self._loop: asyncio.AbstractEventLoop | None = None

    # --- lifecycle ----------------------------------------------------------------------

    async def open(self) -> None:
        """Open both connections and apply migrations; `SchemaTooNew` for a newer database."""
        self._loop = asyncio.get_running_loop()
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="store-w")
        self._reader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="store-r")
        try:
            await self._loop.run_in_executor(self._writer, self._open_writer)
            await self._loop.run_in_executor(self._reader, self._open_reader)
        except BaseException:
            await self.close()
            raise

    def _open_writer(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = connect(self.path, synchronous=self.synchronous)
            self._wdb = sqlite_utils.Database(conn, execute_plugins=False)
            migrate(self._wdb)
        except sqlite3.Error as exc:
            raise StorageError(f"cannot open database {self.path}: {exc}") from exc
        except OSError as exc:
            raise StorageError(f"cannot open database {self.path}: {exc.strerror}") from exc

    def _open_reader(self) -> None:
        try:
            conn = connect(self.path, synchronous=self.synchronous)
            self._rdb = sqlite_utils.Database(conn, execute_plugins=False)
        except sqlite3.Error as exc:
            raise StorageError(f"cannot open database {self.path}: {exc}") from exc

    async def close(self) -> None:
        """Finish the queued writes (the commit in flight included), then close."""
        loop = asyncio.get_running_loop()
        if self._writer is not None:
            writer, self._writer = self._writer, None
            # The executor is FIFO on one thread: the close runs after every queued write.
            await loop.run_in_executor(writer, self._close_db, self._wdb)
            writer.shutdown(wait=True)
            self._wdb = None
        if self._reader is not None:
            reader, self._reader = self._reader, None
            await loop.run_in_executor(reader, self._close_db, self._rdb)
            reader.shutdown(wait=True)
            self._rdb = None

    @staticmethod
    def _close_db(db: sqlite_utils.Database | None) -> None:
        if db is not None:
            db.close()

    @property
    def is_open(self) -> bool:
        """True between `open` and `close`."""
        return self._writer is not None and self._wdb is not None

    # --- writes ---------------------------------------------------------------------------

    async def write(self, fn: Callable[[sqlite_utils.Database], T]) -> T:
        """Run `fn(db)` inside one transaction on the writer thread; its result is returned.

        A SQLite failure becomes `StorageError`; any other exception from `fn` rolls the
        transaction back and propagates unchanged.
        """
        writer = self._require_writer()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(writer, self._run_write, fn)

    def _run_write(self, fn: Callable[[sqlite_utils.Database], T]) -> T:
        db = self._wdb
        if db is None:
            raise StorageError("store is closed")
        # Webhook inserts queued meanwhile ride along: one commit (one fsync) serves both.
        batch = self._take_inserts()
        try:
            with transaction(db):
                inserted = self._insert_batch(db, batch) if batch else []
                result = fn(db)
        except sqlite3.Error as exc:
            self._commit_inserts(batch)  # on their own, so fn's failure is not theirs
            raise StorageError(str(exc)) from exc
        except BaseException:
            self._commit_inserts(batch)
            raise
        self.commits += 1
        self._deliver(batch, inserted)
        return result

    async def insert_event(
        self,
        event_id: str,
        event_type: str | None,
        reference_id: str | None,
        transaction_id: str | None,
        body: bytes,
        headers: Mapping[str, str],
        received_at: str,
        *,
        status: str = "pending",
    ) -> bool:
        """Store a raw webhook event durably; True if new, False for a known eventId.

        Concurrent calls share one transaction (group commit); each returns after the commit.
        """
        writer = self._require_writer()
        loop = asyncio.get_running_loop()
        row = {
            "event_id": event_id,
            "event_type": event_type,
            "reference_id": reference_id,
            "transaction_id": transaction_id,
            "body": body,
            "headers": json.dumps({k: headers[k] for k in STORED_HEADERS if k in headers}),
            "received_at": received_at,
            "status": status,
            "processed_at": None if status == "pending" else received_at,
        }
        item = _Insert(row, loop.create_future())
        with self._lock:
            self._inserts.append(item)
            schedule = not self._flush_queued
            self._flush_queued = True
        if schedule:
            writer.submit(self._flush_inserts)
        # The commit itself is not cancellable; shielding keeps a client disconnect from
        # turning an already-durable insert into an exception inside the writer callback.
        return await asyncio.shield(item.future)

    def _take_inserts(self) -> list[_Insert]:
        with self._lock:
            batch, self._inserts = self._inserts, []
            self._flush_queued = False
        return batch

    def _flush_inserts(self) -> None:
        self._commit_inserts(self._take_inserts())

    def _commit_inserts(self, batch: list[_Insert]) -> None:
        if not batch:
            return
        db = self._wdb
        try:
            if db is None:
                raise StorageError("store is closed")
            with transaction(db):
                results = self._insert_batch(db, batch)
        except (sqlite3.Error, StorageError) as exc:
            error = exc if isinstance(exc, StorageError) else StorageError(str(exc))
            self._deliver(batch, None, error)
            return
        self.commits += 1
        self._deliver(batch, results)

    def _deliver(
        self, batch: list[_Insert], results: list[bool] | None, error: StorageError | None = None
    ) -> None:
        """Hand the outcome to the waiters: one wake-up of the event loop per batch."""
        if not batch:
            return
        assert self._loop is not None
        futures = [item.future for item in batch]
        self._loop.call_soon_threadsafe(_resolve_all, futures, results, error)

    @staticmethod
    def _insert_batch(db: sqlite_utils.Database, batch: Sequence[_Insert]) -> list[bool]:
        results = []
        for item in batch:
            row = item.row
            cur = db.execute(
                "INSERT OR IGNORE INTO events (event_id, event_type, reference_id,"
                " transaction_id, body, headers, received_at, status, processed_at)"
                " VALUES (:event_id, :event_type, :reference_id, :transaction_id, :body,"
                " :headers, :received_at, :status, :processed_at)",
                row,
            )
            results.append(cur.rowcount == 1)
        if any(results):
            set_meta(db, "last_webhook_at", batch[-1].row["received_at"])
        return results

    def _require_writer(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._writer is None or self._wdb is None:
            raise StorageError("store is closed")
        return self._writer

    # --- reads ----------------------------------------------------------------------------

    async def read(self, fn: Callable[[sqlite_utils.Database], T]) -> T:
        """Run `fn(db)` on the read connection (its own thread); sees committed data only."""
        if self._reader is None or self._rdb is None:
            raise StorageError("store is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._reader, self._run_read, fn)

    def _run_read(self, fn: Callable[[sqlite_utils.Database], T]) -> T:
        db = self._rdb
        if db is None:
            raise StorageError("store is closed")
        try:
            # A read transaction gives fn one consistent snapshot across its queries.
            with db.atomic():
                return fn(db)
        except sqlite3.Error as exc:
            raise StorageError(str(exc)) from exc
