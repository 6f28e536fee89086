"""PostgreSQL's own part: one schema for both engines, migrations once, several instances on one
database (a delivery stored once, an event claimed by one), and an outage survived."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import pgcluster
from tests.support.pgcluster import ENV_URL, Cluster
from worker.errors import StorageError
from worker.store import operator
from worker.store.database import table_columns
from worker.store.events import pending_events
from worker.store.meta import probe
from worker.store.pg import PgDatabase, connect, placeholders
from worker.store.pgstore import PgStore
from worker.store.sqlitestore import SCHEMA_VERSION, Store, event_row, schema_version


def _row(event_id: str, transaction_id: str | None = "tx-1") -> tuple[object, ...]:
    body = b'{"eventId": "%s"}' % event_id.encode()
    return event_row(
        event_id, "X", transaction_id, transaction_id, body, {}, "2026-01-01T00:00:00.000Z"
    )


@pytest.fixture
def pg_url(pg_cluster: Cluster) -> Iterator[str]:
    """A fresh empty database."""
    url = pg_cluster.create_database()
    yield url
    pg_cluster.drop_database(url)


async def test_both_engines_have_the_same_tables_and_columns(pg_url: str, tmp_path: Path) -> None:
    """A migrated PostgreSQL database has exactly the tables and columns of a SQLite one."""
    stores: list[Store] = [Store(tmp_path / "d.db"), PgStore(pg_url)]
    found = []
    for store in stores:
        await store.open()
        found.append(await store.read(table_columns))
        assert await store.read(schema_version) == SCHEMA_VERSION
        await store.close()
    assert found[0] == found[1]


async def test_instances_starting_together_migrate_once(pg_url: str) -> None:
    """Four instances opening an empty database at once: all start, the schema is made once."""
    stores = [PgStore(pg_url) for _ in range(4)]
    await asyncio.gather(*(s.open() for s in stores))
    try:
        versions = await asyncio.gather(*(s.read(schema_version) for s in stores))
        assert versions == [SCHEMA_VERSION] * 4
    finally:
        await asyncio.gather(*(s.close() for s in stores))


async def test_a_delivery_sent_to_two_instances_is_stored_once(pg_url: str) -> None:
    """The same eventIds arriving at two instances at once: each stored once, the other copy
    answered as a duplicate."""
    a, b = PgStore(pg_url), PgStore(pg_url)
    await a.open()
    await b.open()
    try:
        ids = [f"e{i}" for i in range(50)]
        first = [a.queue_event(_row(i)) for i in ids]  # type: ignore[arg-type]
        second = [b.queue_event(_row(i)) for i in ids]  # type: ignore[arg-type]
        results = await asyncio.gather(*first, *second)
        assert sum(results) == 50
        assert [x or y for x, y in zip(results[:50], results[50:], strict=True)] == [True] * 50
        count = await a.read(lambda db: db.execute("SELECT COUNT(*) FROM events").fetchone()[0])
        assert count == 50
    finally:
        await a.close()
        await b.close()


def test_one_deposit_is_claimed_by_one_instance_at_a_time(pg_url: str) -> None:
    """While one instance's batch holds a deposit's first event, another's batch takes neither
    that event nor the deposit's later ones; other deposits stay free for it."""
    asyncio.run(_seed(pg_url, [("e1", "tx-a"), ("e2", "tx-a"), ("e3", "tx-b"), ("e4", None)]))
    one, two = PgDatabase(connect(pg_url)), PgDatabase(connect(pg_url))
    try:
        one.execute("BEGIN")
        first = pending_events(one, limit=1)  # type: ignore[arg-type]
        assert [e.event_id for e in first] == ["e1"]
        two.execute("BEGIN")
        second = pending_events(two, limit=10)  # type: ignore[arg-type]
        assert [e.event_id for e in second] == ["e3", "e4"]
        one.execute("UPDATE events SET status = 'processed' WHERE event_id = 'e1'")
        one.execute("COMMIT")
        two.execute("COMMIT")
        two.execute("BEGIN")
        assert [e.event_id for e in pending_events(two, limit=10)] == ["e2", "e3", "e4"]  # type: ignore[arg-type]
        two.execute("ROLLBACK")
    finally:
        one.close()
        two.close()


async def _seed(url: str, events: list[tuple[str, str | None]]) -> None:
    store = PgStore(url)
    await store.open()
    try:
        for event_id, transaction_id in events:
            assert await store.queue_event(_row(event_id, transaction_id))  # type: ignore[arg-type]
    finally:
        await store.close()


async def test_an_outage_fails_writes_and_reads_then_the_store_recovers(
    pg_cluster: Cluster, pg_url: str
) -> None:
    """While the server is down, deliveries and reads fail with StorageError (503, never
    200); once it is back, the same store stores and reads again on its own."""
    if os.environ.get(ENV_URL):
        pytest.skip(f"{ENV_URL} names a server this test cannot stop")
    store = PgStore(pg_url)
    await store.open()
    try:
        assert await store.queue_event(_row("before")) is True  # type: ignore[arg-type]
        await asyncio.to_thread(pg_cluster.stop)
        try:
            with pytest.raises(StorageError):
                await store.queue_event(_row("during"))  # type: ignore[arg-type]
            with pytest.raises(StorageError):
                await store.read(probe)
        finally:
            await asyncio.to_thread(pg_cluster.start)
        for _ in range(100):  # the back-off lets an attempt through within seconds
            try:
                assert await store.queue_event(_row("after")) is True  # type: ignore[arg-type]
                break
            except StorageError:
                await asyncio.sleep(0.1)
        await store.read(probe)
        ids = await store.read(
            lambda db: [r[0] for r in db.execute("SELECT event_id FROM events ORDER BY seq")]
        )
        assert ids == ["before", "after"]
    finally:
        await store.close()


async def test_a_connection_left_in_pipeline_mode_is_opened_again(pg_url: str) -> None:
    """The server going away while a pipeline is busy can leave the writer's connection open
    but in pipeline mode outside any pipeline block ("cannot exit pipeline mode while busy"),
    where every later statement is refused ("PQsendQuery not allowed in pipeline mode"): the
    store counts it as lost and connects again, instead of answering 503 until a restart."""
    store = PgStore(pg_url)
    await store.open()
    try:
        assert await store.queue_event(_row("before")) is True  # type: ignore[arg-type]
        wedged = store._wlink.db
        assert wedged is not None
        wedged.conn.raw.pgconn.enter_pipeline_mode()
        assert await store.queue_event(_row("after")) is True  # type: ignore[arg-type]
        assert store._wlink.db is not wedged
        ids = await store.read(
            lambda db: [r[0] for r in db.execute("SELECT event_id FROM events ORDER BY seq")]
        )
        assert ids == ["before", "after"]
    finally:
        await store.close()


def test_the_password_is_never_in_an_error() -> None:
    """A refused connection's error names the server with the URL's password masked."""
    url = "postgresql://depositd:s3cret-pw@127.0.0.1:1/depositd"
    with pytest.raises(Exception) as caught:
        connect(url)
    assert "s3cret-pw" not in str(caught.value)
    assert "***" in str(caught.value)


def test_only_the_placeholders_of_a_statement_are_rewritten() -> None:
    """A statement runs on PostgreSQL as written, its `?` placeholders numbered (a `?` inside
    quotes kept as it is, and a `%` anywhere)."""
    sql = placeholders("INSERT INTO t (a) VALUES (?) ON CONFLICT DO NOTHING RETURNING a, 'a%', '?'")
    assert sql == "INSERT INTO t (a) VALUES ($1) ON CONFLICT DO NOTHING RETURNING a, 'a%', '?'"
    sql = placeholders("SELECT 1 FROM t WHERE x IS NOT DISTINCT FROM ? AND y LIKE 'a%' AND z = ?")
    assert sql == "SELECT 1 FROM t WHERE x IS NOT DISTINCT FROM $1 AND y LIKE 'a%' AND z = $2"


def test_missing_server_binaries_fail_naming_the_install_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without initdb on PATH or under /usr/lib/postgresql, the test cluster cannot start and
    says which command installs it (the suites then fail, never skip)."""
    monkeypatch.setattr(pgcluster.shutil, "which", lambda name: None)
    monkeypatch.setattr(pgcluster.glob, "glob", lambda pattern: [])
    with pytest.raises(pgcluster.MissingPostgres, match="apt-get install -y postgresql"):
        pgcluster.server_bin()


async def test_an_insert_says_the_key_it_generated(pg_url: str) -> None:
    """An insert into a table whose integer key is generated says the new row's id on
    PostgreSQL as on SQLite (an operator's console action, here)."""
    store = PgStore(pg_url)
    await store.open()
    try:

        def add(db: PgDatabase) -> int:
            return operator.record(db, "requeue", "event e1", note="n", outcome="o", remote=None)

        first, second = await store.write(add), await store.write(add)
        assert (first, second) == (1, 2)
        assert [r["id"] for r in await store.read(lambda db: operator.recent(db))] == [2, 1]
    finally:
        await store.close()


def test_a_deposit_event_held_elsewhere_stops_its_later_ones(pg_url: str) -> None:
    """While another instance holds one of a deposit's pending events, a batch takes that
    deposit's events before it and none after it (applied in receive order), and other
    deposits' events as usual."""
    asyncio.run(_seed(pg_url, [("e1", "tx-a"), ("e2", "tx-a"), ("e3", "tx-a"), ("e4", "tx-b")]))
    one, two = PgDatabase(connect(pg_url)), PgDatabase(connect(pg_url))
    try:
        one.execute("BEGIN")  # another instance's batch holding e2's row, not yet the deposit
        one.execute("SELECT seq FROM events WHERE event_id = 'e2' FOR UPDATE").fetchall()
        two.execute("BEGIN")
        taken = pending_events(two, limit=10)  # type: ignore[arg-type]
        assert [e.event_id for e in taken] == ["e1", "e4"]
        two.execute("ROLLBACK")
        one.execute("ROLLBACK")
    finally:
        one.close()
        two.close()


def test_processed_events_leave_the_claim_index_and_are_vacuumed_early(pg_url: str) -> None:
    """The claim has an index of the pending events alone (the processed ones leave it), and
    the events table is vacuumed after 2% of its rows changed: the dead versions that events
    leave when marked processed no longer pile up under the claim as the database grows."""
    asyncio.run(_seed(pg_url, [(f"e{n}", f"tx-{n}") for n in range(3)]))
    db = PgDatabase(connect(pg_url))
    try:
        db.execute(
            "INSERT INTO events (event_id, event_type, received_at, status, body, headers)"
            " SELECT 'old' || n, 'X', '2026-01-01T00:00:00.000Z', 'pending', 'x', '{}'"
            " FROM generate_series(1, 2000) AS n"
        )
        db.execute("UPDATE events SET status = 'processed' WHERE event_id LIKE 'old%'")
        index = db.execute("SELECT pg_get_indexdef('events_pending'::regclass)").fetchone()
        assert "(seq) WHERE (status = 'pending'::text)" in index[0]
        options = db.execute("SELECT reloptions FROM pg_class WHERE relname = 'events'").fetchone()
        assert "autovacuum_vacuum_scale_factor=0.02" in options[0]
        db.execute("BEGIN")
        assert [e.event_id for e in pending_events(db, limit=100)] == ["e0", "e1", "e2"]  # type: ignore[arg-type]
        db.execute("ROLLBACK")
    finally:
        db.close()
