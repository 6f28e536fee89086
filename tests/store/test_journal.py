"""The journal table: entries chained by hash on both engines, refused edits, the proof of an
entry up to a head, the ledger rows adopted by the migration, and appends of two PostgreSQL
connections in one order."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import sqlite_utils

from tests.support.pgcluster import Cluster
from worker.errors import StorageError
from worker.store import journal
from worker.store.errors import StoreError, StoreIntegrityError
from worker.store.pg import PgDatabase
from worker.store.pg import connect as pg_connect
from worker.store.pgstore import PgStore
from worker.store.schema import MIGRATIONS
from worker.store.sqlitestore import Store, connect, migrate


async def test_entries_chain_and_read_back_as_appended(store: Store) -> None:
    def write(db: sqlite_utils.Database) -> list[journal.Entry]:
        first = journal.append(db, journal.BOOKED, "tx-1", {"amount": "12.50", "n": 1})
        rest = journal.append_many(
            db,
            [(journal.SUBMITTED, "tx-1", {"fields": ["name"]}), (journal.HELD, "tx-2", {})],
        )
        return [first, *rest]

    written = await store.write(write)
    assert [e.seq for e in written] == [1, 2, 3]
    assert written[0].prev_hash == journal.GENESIS
    assert written[1].prev_hash == written[0].hash and written[2].prev_hash == written[1].hash
    read = await store.read(lambda db: list(journal.entries(db)))
    assert read == written
    assert journal.chain_problem(read) is None
    assert await store.read(journal.head) == journal.Head(3, written[2].hash)
    about = await store.read(lambda db: journal.entries_about(db, "tx-1"))
    assert [e.seq for e in about] == [1, 2]
    # Money stays text: the amount reads back as written, not as a number.
    assert read[0].body == {"amount": "12.50", "n": 1}


async def test_the_engine_refuses_to_edit_or_delete_an_entry(store: Store) -> None:
    await store.write(lambda db: journal.append(db, journal.BOOKED, "tx-1", {"amount": "1"}))
    for sql in ("UPDATE journal SET body = '{}'", "DELETE FROM journal"):
        with pytest.raises((StoreError, StorageError), match="append-only") as caught:
            await store.write(lambda db, sql=sql: db.execute(sql))
        # A trigger's refusal, the same error on both engines.
        refused = caught.value if isinstance(caught.value, StoreError) else caught.value.__cause__
        assert isinstance(refused, StoreIntegrityError), repr(refused)
    assert await store.read(lambda db: len(list(journal.entries(db)))) == 1


def test_a_changed_entry_or_a_gap_is_named() -> None:
    entries: list[journal.Entry] = []
    prev = journal.GENESIS
    for seq in range(1, 5):
        digest = journal.digest_of(seq, "t", "booked", f"tx-{seq}", {"amount": str(seq)})
        entries.append(
            journal.Entry(
                seq,
                "t",
                "booked",
                f"tx-{seq}",
                {"amount": str(seq)},
                digest,
                prev,
                journal.chain(prev, digest),
            )
        )
        prev = entries[-1].hash
    assert journal.chain_problem(entries) is None
    edited = list(entries)
    edited[1] = journal.Entry(**{**edited[1].__dict__, "body": {"amount": "99"}})
    assert journal.chain_problem(edited) == "journal entry 2: its content does not match its digest"
    assert journal.chain_problem([entries[0], *entries[2:]]) == (
        "journal entry 2 is missing (the next one is 3)"
    )
    # An entry rebuilt with its own digest and hash still breaks the next one's link.
    body = {"amount": "99"}
    digest = journal.digest_of(2, "t", "booked", "tx-2", body)
    rebuilt = journal.Entry(
        2,
        "t",
        "booked",
        "tx-2",
        body,
        digest,
        entries[0].hash,
        journal.chain(entries[0].hash, digest),
    )
    assert journal.chain_problem([entries[0], rebuilt, *entries[2:]]) == (
        "journal entry 3: it does not follow entry 2 (hash chain broken)"
    )


async def test_a_proof_shows_an_entry_in_the_chain_up_to_a_head(store: Store) -> None:
    def write(db: sqlite_utils.Database) -> None:
        journal.append_many(db, [(journal.BOOKED, f"tx-{n}", {"n": n}) for n in range(1, 8)])

    await store.write(write)
    head = await store.read(journal.head)
    assert head is not None and head.seq == 7
    mine = await store.read(lambda db: journal.entries_about(db, "tx-3"))
    proof = await store.read(lambda db: journal.proof(db, 3, head))
    assert journal.check_proof(proof, mine) is None
    changed = journal.Entry(**{**mine[0].__dict__, "body": {"n": 4}})
    assert "does not match its digest" in str(journal.check_proof(proof, [changed]))
    other_head = dict(proof, head=f"7:{'f' * 64}")
    assert (
        journal.check_proof(other_head, mine)
        == f"the proof's chain does not end at the head 7:{'f' * 64}"
    )
    skipped = dict(
        proof, digests=proof["digests"][:3] + proof["digests"][4:], head=f"6:{head.hash}"
    )
    assert journal.check_proof(skipped, mine) is not None


def test_a_head_parses_from_what_it_prints() -> None:
    head = journal.Head(12, "ab" * 32)
    assert journal.Head.parse(str(head)) == head
    for bad in ("12", "x:" + "ab" * 32, "12:abc", "12:" + "zz" * 32):
        with pytest.raises(ValueError, match=r"SEQ:HASH|hex"):
            journal.Head.parse(bad)


def test_the_migration_adopts_the_ledger_rows_booked_before_it(tmp_path: Path) -> None:
    conn = connect(tmp_path / "d.db")
    db = sqlite_utils.Database(conn)
    db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
    before = MIGRATIONS.index(next(m for m in MIGRATIONS if m.__name__ == "_migrate_journal"))
    for step in MIGRATIONS[:before]:
        step(db)
    db.execute(f"INSERT INTO meta (key, value) VALUES ('schema_version', '{before}')")
    for n, at in ((2, "2026-01-02T00:00:00Z"), (1, "2026-01-01T00:00:00Z")):
        db.execute(
            "INSERT INTO ledger (transaction_id, wallet_id, currency, amount, booked_at, trigger)"
            " VALUES (?, 7, 'USDT', ?, ?, 'credited')",
            [f"tx-{n}", f"{n}.10", at],
        )
    conn.commit()
    migrate(db)
    adopted = list(journal.entries(db))
    assert [(e.kind, e.subject) for e in adopted] == [("adopted", "tx-1"), ("adopted", "tx-2")]
    assert adopted[0].body["amount"] == "1.10" and adopted[0].body["wallet_id"] == 7
    assert journal.adopt_ledger(db) == 0  # once
    conn.close()


async def test_two_postgres_connections_append_one_chain(pg_cluster: Cluster) -> None:
    """PostgreSQL: an instance appending waits for another's open transaction that appended,
    then chains after its entry."""
    url = pg_cluster.create_database()
    try:
        store = PgStore(url)
        await store.open()
        await store.close()
        one, two = PgDatabase(pg_connect(url)), PgDatabase(pg_connect(url))
        try:
            one.execute("BEGIN")
            journal.append(one, journal.BOOKED, "tx-1", {})  # type: ignore[arg-type]
            done: list[journal.Entry] = []

            def second() -> None:
                two.execute("BEGIN")
                done.append(journal.append(two, journal.BOOKED, "tx-2", {}))  # type: ignore[arg-type]
                two.execute("COMMIT")

            thread = threading.Thread(target=second)
            thread.start()
            thread.join(0.5)
            assert done == [], "the second append did not wait for the first"
            one.execute("COMMIT")
            thread.join(10)
            assert not thread.is_alive(), "the second append never went on"
            assert done[0].seq == 2
            assert journal.chain_problem(journal.entries(one)) is None  # type: ignore[arg-type]
        finally:
            one.close()
            two.close()
    finally:
        pg_cluster.drop_database(url)
