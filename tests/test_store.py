"""The SQLite store: schema, migrations, group commit, duplicate detection, failures."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import sqlite_utils

from worker import store as store_mod
from worker.errors import SchemaTooNew, StorageError
from worker.store import SCHEMA_VERSION, Store, get_meta, pending_events, set_meta

TABLES = {"meta", "events", "deposits", "facts", "actions", "ledger", "alerts", "addresses"}


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    """An open store on a fresh file."""
    s = Store(tmp_path / "depositd.db")
    await s.open()
    yield s
    await s.close()


def _insert(s: Store, event_id: str, **kw: str) -> asyncio.Future[bool]:
    return asyncio.ensure_future(
        s.insert_event(
            event_id,
            kw.get("event_type", "DEPOSIT_WHITELIST_REQUIRED"),
            "tx-1",
            "tx-1",
            b'{"eventId": "%s"}' % event_id.encode(),
            {"API-TIMESTAMP": "1", "API-KEY": "k", "API-SIGNATURE": "s", "X-Other": "o"},
            "2026-01-01T00:00:00.000Z",
        )
    )


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


async def test_synchronous_pragma_applied(store: Store) -> None:
    """The write connection runs with synchronous=FULL by default (2 = FULL)."""
    value = await store.write(lambda db: db.execute("PRAGMA synchronous").fetchone()[0])
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
        raise sqlite3.OperationalError("boom")

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


async def test_full_disk_fails_inserts_then_recovers(store: Store) -> None:
    """A full disk makes inserts fail with StorageError; once space is back they succeed."""
    await store.write(fill_disk)
    big = "x" * 200_000
    with pytest.raises(StorageError, match="full"):
        await store.write(lambda db: set_meta(db, "big", big))
    await store.write(lambda db: db.execute("PRAGMA max_page_count = 1073741823"))
    assert await _insert(store, "after") is True
