"""The store on both engines: group commit, duplicate detection, failures; and SQLite's own
schema, migrations and locking."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import sqlite_utils

from worker.errors import SchemaTooNew, StorageError
from worker.store import sqlitestore as store_mod
from worker.store.errors import StoreError
from worker.store.events import pending_events
from worker.store.meta import get_meta, set_meta
from worker.store.sqlitestore import SCHEMA_VERSION, EventRow, Store, event_row

TABLES = {"meta", "events", "deposits", "facts", "actions", "ledger", "alerts", "addresses"}


def _insert(s: Store, event_id: str, **kw: str) -> asyncio.Future[bool]:
    """One event queued when the returned task first runs (as a request handler would)."""
    row = event_row(
        event_id,
        kw.get("event_type", "DEPOSIT_WHITELIST_REQUIRED"),
        "tx-1",
        "tx-1",
        b'{"eventId": "%s"}' % event_id.encode(),
        {"API-TIMESTAMP": "1", "API-KEY": "k", "API-SIGNATURE": "s", "X-Other": "o"},
        "2026-01-01T00:00:00.000Z",
    )

    async def queued() -> bool:
        return await s.queue_event(row)

    return asyncio.ensure_future(queued())


async def test_open_creates_every_table_with_wal_and_version(tmp_path: Path) -> None:
    """Opening a new file creates the design's tables in WAL mode and records the version."""
    s = Store(tmp_path / "sub" / "d.db", synchronous="NORMAL")
    await s.open()
    await s.close()
    db = sqlite_utils.Database(tmp_path / "sub" / "d.db")
    assert set(db.table_names()) >= TABLES
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert get_meta(db, "schema_version") == str(SCHEMA_VERSION)
    events_cols = {c.name for c in db["events"].columns}
    assert events_cols == {
        "seq",
        "event_id",
        "event_type",
        "reference_id",
        "transaction_id",
        "body",
        "headers",
        "received_at",
        "status",
        "error",
        "processed_at",
    }
    db.close()


async def test_synchronous_pragma_applied(sqlite_store: Store) -> None:
    """The write connection runs with synchronous=FULL by default (2 = FULL)."""
    value = await sqlite_store.write(lambda db: db.execute("PRAGMA synchronous").fetchone()[0])
    assert value == 2


async def test_reopen_is_idempotent_and_keeps_data(tmp_path: Path) -> None:
    """Re-opening an up-to-date database applies nothing and keeps its rows."""
    path = tmp_path / "d.db"
    s = Store(path)
    await s.open()
    assert await _insert(s, "e1")
    await s.close()
    s = Store(path)
    await s.open()
    rows = await s.read(lambda db: db.execute("SELECT event_id FROM events").fetchall())
    await s.close()
    assert [r[0] for r in rows] == ["e1"]


async def test_migrations_run_in_order_with_their_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new migration is applied to an existing database, recorded in the same transaction."""
    path = tmp_path / "d.db"
    s = Store(path)
    await s.open()
    await s.close()

    def add_column(db: sqlite_utils.Database) -> None:
        db.execute("ALTER TABLE deposits ADD COLUMN note TEXT")

    def broken(db: sqlite_utils.Database) -> None:
        db.execute("CREATE TABLE half_done (x)")
        raise StoreError("boom")

    monkeypatch.setattr(store_mod, "MIGRATIONS", [*store_mod.MIGRATIONS, add_column, broken])
    monkeypatch.setattr(store_mod, "SCHEMA_VERSION", SCHEMA_VERSION + 2)
    s = Store(path)
    with pytest.raises(StorageError, match="boom"):
        await s.open()
    db = sqlite_utils.Database(path)
    # The good migration stuck with its version; the broken one left nothing behind.
    assert get_meta(db, "schema_version") == str(SCHEMA_VERSION + 1)
    assert "note" in {c.name for c in db["deposits"].columns}
    assert "half_done" not in db.table_names()
    db.close()


async def test_a_version_1_database_is_brought_up_to_date(tmp_path: Path) -> None:
    """A database written before version 2 keeps its rows and gains the version 2 indexes."""
    path = tmp_path / "d.db"
    db = sqlite_utils.Database(path)
    db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
    store_mod.MIGRATIONS[0](db)
    set_meta(db, "schema_version", "1")
    db.execute(
        "INSERT INTO actions (event_id, trigger, action) VALUES ('e1', 'needs_details', 'x')"
    )
    db.conn.commit()
    db.close()
    s = Store(path)
    await s.open()
    await s.close()
    db = sqlite_utils.Database(path)
    assert get_meta(db, "schema_version") == str(SCHEMA_VERSION) == str(len(store_mod.MIGRATIONS))
    assert "actions_event" in {i.name for i in db["actions"].indexes}
    assert db["operator_actions"].exists()
    assert "facts_unchanged" in {i.name for i in db["facts"].indexes}
    assert db.execute("SELECT event_id FROM actions").fetchall() == [("e1",)]
    db.close()


async def test_newer_schema_is_refused(tmp_path: Path) -> None:
    """A database written by a newer depositd is refused with a clear message."""
    path = tmp_path / "d.db"
    s = Store(path)
    await s.open()
    await s.write(lambda db: set_meta(db, "schema_version", str(SCHEMA_VERSION + 5)))
    await s.close()
    with pytest.raises(SchemaTooNew) as info:
        await Store(path).open()
    assert str(info.value) == (
        f"database schema version {SCHEMA_VERSION + 5} is newer than this depositd supports "
        f"({SCHEMA_VERSION}); upgrade depositd"
    )


async def test_duplicate_event_id_is_detected(store: Store) -> None:
    """The second insert of an eventId reports False and stores nothing new."""
    assert await _insert(store, "e1") is True
    assert await _insert(store, "e1") is False
    count = await store.read(lambda db: db.execute("SELECT COUNT(*) FROM events").fetchone()[0])
    assert count == 1


async def test_duplicates_inside_one_group_commit(store: Store) -> None:
    """Two copies of one eventId in the same batch: exactly one is new."""
    results = await asyncio.gather(*(_insert(store, "same") for _ in range(20)))
    assert sorted(results) == [False] * 19 + [True]


async def test_group_commit_uses_fewer_commits_than_inserts(store: Store) -> None:
    """Many concurrent inserts share transactions: fewer commits than inserts, all stored."""
    before = store.commits
    results = await asyncio.gather(*(_insert(store, f"e{i}") for i in range(500)))
    assert all(results)
    commits = store.commits - before
    assert 1 <= commits < 100
    events = await store.read(lambda db: pending_events(db, limit=1000))
    assert [e.event_id for e in events] == [f"e{i}" for i in range(500)]  # receive order


async def test_only_harmless_headers_are_stored(store: Store) -> None:
    """API-KEY and API-SIGNATURE are never stored with the event."""
    await _insert(store, "e1")
    headers = await store.read(lambda db: db.execute("SELECT headers FROM events").fetchone()[0])
    assert headers == '{"API-TIMESTAMP": "1"}'


async def test_write_rolls_back_on_error(store: Store) -> None:
    """An exception inside write() leaves nothing behind and propagates unchanged."""

    def fail(db: sqlite_utils.Database) -> None:
        set_meta(db, "k", "v")
        raise KeyError("mine")

    with pytest.raises(KeyError, match="mine"):
        await store.write(fail)
    assert await store.read(lambda db: get_meta(db, "k")) is None


async def test_sqlite_failure_becomes_storage_error(store: Store) -> None:
    """A SQLite error inside write() is reported as StorageError."""
    with pytest.raises(StorageError):
        await store.write(lambda db: db.execute("INSERT INTO nowhere VALUES (1)"))


async def test_closed_store_raises_storage_error(tmp_path: Path) -> None:
    """Inserting into a closed store fails with StorageError (ingress answers 503)."""
    s = Store(tmp_path / "d.db")
    await s.open()
    await s.close()
    with pytest.raises(StorageError):
        await _insert(s, "e1")


async def test_close_finishes_queued_inserts(tmp_path: Path) -> None:
    """Inserts queued before close() are committed before the connection closes."""
    path = tmp_path / "d.db"
    s = Store(path)
    await s.open()
    futures = [_insert(s, f"e{i}") for i in range(50)]
    await asyncio.sleep(0)  # let every insert enqueue
    await s.close()
    assert all(await asyncio.gather(*futures))
    db = sqlite_utils.Database(path)
    assert db.execute("SELECT COUNT(*) FROM events").fetchone()[0] == 50
    db.close()


def fill_disk(db: sqlite_utils.Database) -> None:
    """Cap the write connection at its current size: the next growth is SQLITE_FULL."""
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    db.execute(f"PRAGMA max_page_count = {pages}")


async def test_full_disk_fails_inserts_then_recovers(sqlite_store: Store) -> None:
    """A full disk makes inserts fail with StorageError; once space is back they succeed."""
    store = sqlite_store
    await store.write(fill_disk)
    big = "x" * 200_000
    with pytest.raises(StorageError, match="full"):
        await store.write(lambda db: set_meta(db, "big", big))
    await store.write(lambda db: db.execute("PRAGMA max_page_count = 1073741823"))
    assert await _insert(store, "after") is True


async def test_inline_job_shares_the_commit_of_the_inserts(store: Store) -> None:
    """An inline job queued with inserts runs after them in the same transaction: one commit."""
    before = store.commits
    inserts = [_insert(store, f"e{i}") for i in range(5)]
    seen = asyncio.ensure_future(
        store.write_inline(lambda db: db.execute("SELECT COUNT(*) FROM events").fetchone()[0])
    )
    assert all(await asyncio.gather(*inserts))
    assert await seen == 5
    assert store.commits - before == 1


async def test_failing_jobs_do_not_fail_the_inserts_beside_them(store: Store) -> None:
    """A job that raises undoes only its own writes; inserts in the same transaction commit."""

    def broken(db: sqlite_utils.Database) -> None:
        set_meta(db, "half", "done")
        raise KeyError("mine")

    def bad_sql(db: sqlite_utils.Database) -> None:
        db.execute("INSERT INTO nowhere VALUES (1)")

    before = store.commits
    results = await asyncio.gather(
        _insert(store, "e1"),
        store.write(broken),
        store.write_inline(bad_sql),
        _insert(store, "e2"),
        return_exceptions=True,
    )
    assert results[0] is True and results[3] is True
    assert isinstance(results[1], KeyError)
    assert isinstance(results[2], StorageError)
    assert store.commits - before == 1
    assert await store.read(lambda db: get_meta(db, "half")) is None
    count = await store.read(lambda db: db.execute("SELECT COUNT(*) FROM events").fetchone()[0])
    assert count == 2


async def test_a_row_sqlite_refuses_fails_alone(store: Store) -> None:
    """One row of a round that SQLite cannot take (a lone surrogate in its eventId) fails its
    own delivery only; the rows committed beside it are stored."""

    def row(event_id: str) -> EventRow:
        return event_row(event_id, "X", None, None, b"{}", {}, "2026-01-01T00:00:00.000Z")

    before = store.commits
    ids = [f"e{i}" for i in range(5)] + ["bad-\ud800"] + [f"f{i}" for i in range(5)]
    queued = [store.queue_event(row(i)) for i in ids]  # all in the same round
    results = await asyncio.gather(*queued, return_exceptions=True)
    assert results[:5] == [True] * 5 and results[6:] == [True] * 5
    assert isinstance(results[5], StorageError)
    assert store.commits - before == 1
    count = await store.read(lambda db: db.execute("SELECT COUNT(*) FROM events").fetchone()[0])
    assert count == 10


async def test_the_writer_outlives_any_failure_of_a_round(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job raising StopIteration (which no future takes), or a round crashing outright,
    fails that round's waiters with an error; the writer goes on and later writes commit."""
    with pytest.raises(RuntimeError, match="StopIteration"):
        await store.write_inline(lambda db: next(iter([])))
    assert await _insert(store, "after-stop") is True

    async def crash(*args: Any) -> None:
        raise RuntimeError("a bug in the round")  # outside the round's own error handling

    with monkeypatch.context() as patched:
        patched.setattr(type(store), "_cycle", crash)
        results = await asyncio.gather(
            _insert(store, "lost"), store.write(lambda db: 1), return_exceptions=True
        )
    assert [type(r) for r in results] == [StorageError, StorageError]
    assert await _insert(store, "after-crash") is True
    ids = await store.read(
        lambda db: [r[0] for r in db.execute("SELECT event_id FROM events ORDER BY seq")]
    )
    assert ids == ["after-stop", "after-crash"]


async def test_cancelled_waiter_still_commits_and_the_writer_goes_on(store: Store) -> None:
    """A delivery whose waiter is cancelled (client gone) is still stored; later ones work."""
    task = _insert(store, "gone")
    await asyncio.sleep(0)  # queued
    task.cancel()
    assert await _insert(store, "next") is True
    ids = await store.read(lambda db: [r[0] for r in db.execute("SELECT event_id FROM events")])
    assert ids == ["gone", "next"]


async def test_another_writer_is_waited_for_without_blocking_the_loop(tmp_path: Path) -> None:
    """While another process holds the write lock, inserts wait and the event loop runs on."""
    path = tmp_path / "d.db"
    s = Store(path)
    await s.open()
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        pending = _insert(s, "e1")
        started = asyncio.get_running_loop().time()
        await asyncio.sleep(0.1)
        assert asyncio.get_running_loop().time() - started < 0.5  # the loop was not blocked
        assert not pending.done()
    finally:
        other.execute("COMMIT")
        other.close()
    assert await pending is True
    await s.close()


async def test_ride_along_job_waits_for_inserts_then_alone(store: Store) -> None:
    """A ride-along inline job joins the next inserts' commit, or commits alone after its wait."""
    before = store.commits
    job = asyncio.ensure_future(store.write_inline(lambda db: 1, ride_along_s=5.0))
    await asyncio.sleep(0.05)
    assert not job.done()
    assert await _insert(store, "e1") is True
    assert await job == 1
    assert store.commits - before == 1
    alone = asyncio.ensure_future(store.write_inline(lambda db: 2, ride_along_s=0.05))
    assert await asyncio.wait_for(alone, 2) == 2


async def test_ledger_ties_are_listed_in_transaction_id_order(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deposits booked in the same millisecond list in a stable order on both engines."""
    from worker.store import ledger

    monkeypatch.setattr(ledger, "utc_now", lambda: "2026-01-01T00:00:00.000Z")

    def book(db: sqlite_utils.Database) -> None:
        for tx in ("tx-b", "tx-a", "tx-c"):
            ledger.insert_booking(
                db,
                transaction_id=tx,
                wallet_id=1,
                wallet_name="w",
                currency="USDT",
                network="TRC20",
                amount="1.00",
                from_address="a",
                tx_hash=f"h-{tx}",
                trigger="credited",
            )

    await store.write(book)
    rows = await store.read(ledger.all_booked)
    assert [r["transaction_id"] for r in rows] == ["tx-a", "tx-b", "tx-c"]
