"""Rows written together on PostgreSQL (`InsertRows`: the rows of an INSERT sent as statements of
many rows, the rows of one INSERT added one after another sent together) end up as the same rows,
in the same order, with the same failures, as one statement per row; on both engines."""

from __future__ import annotations

import time

import pytest

from worker.store import ledger
from worker.store.db import Database
from worker.store.errors import StoreIntegrityError
from worker.store.pg import InsertRows
from worker.store.sqlitestore import Store
from worker.store.tx import add_row, conn_of, insert_rows, savepoint

# More than the largest statement (256 rows) and no power of two: several statements of
# different sizes.
MANY = 301


async def _meta(store: Store, prefix: str) -> list[tuple[str, str]]:
    def read(db: Database) -> list[tuple[str, str]]:
        rows = db.execute(
            "SELECT key, value FROM meta WHERE key LIKE ? ORDER BY key", [f"{prefix}%"]
        ).fetchall()
        return [(str(r[0]), str(r[1])) for r in rows]

    return await store.read(read)


async def test_an_insert_run_for_many_rows_keeps_the_first_of_a_key_and_counts_the_rows(
    store: Store,
) -> None:
    """ON CONFLICT DO NOTHING: a key given twice keeps its first row, as row by row."""
    rows = [(f"k{i:04d}", str(i)) for i in range(MANY)] + [("k0000", "again"), ("k0300", "x")]
    insert = InsertRows(
        "INSERT INTO meta (key, value) VALUES ", "(?, ?)", " ON CONFLICT (key) DO NOTHING"
    )
    await store.write_inline(lambda db: insert_rows(db, insert, rows))
    found = await _meta(store, "k")
    assert found == [(f"k{i:04d}", str(i)) for i in range(MANY)]


async def test_an_update_of_a_key_given_twice_takes_the_last_row(store: Store) -> None:
    """ON CONFLICT DO UPDATE with a key given twice in the rows: the later row wins, as row by
    row (never the server's refusal to update a row twice in one statement)."""

    insert = InsertRows(
        "INSERT INTO meta (key, value) VALUES ",
        "(?, ?)",
        " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        key=(0,),
    )

    def write(db: Database) -> None:
        # Four rows: what one statement of many rows would take.
        insert_rows(db, insert, [("u1", "first"), ("u1", "last"), ("u2", "b"), ("u0", "a")])
        insert_rows(db, insert, [(f"u{i}", f"v{i}") for i in range(3, 3 + MANY)])

    await store.write_inline(write)
    found = dict(await _meta(store, "u"))
    assert (found["u0"], found["u1"], found["u2"]) == ("a", "last", "b")
    assert len(found) == 3 + MANY and found[f"u{2 + MANY}"] == f"v{2 + MANY}"


async def test_inserts_run_one_after_another_are_written_in_order_between_other_statements(
    store: Store,
) -> None:
    """Rows of one INSERT added one by one, with a read in between: the read sees the rows
    added before it, and every row is written once, ids in the order the rows were added."""
    insert = InsertRows(
        "INSERT INTO operator_actions (at, kind, subject, outcome) VALUES ", "(?, ?, ?, ?)"
    )

    def write(db: Database) -> int:
        for i in range(5):
            add_row(db, insert, ["t", "a", f"s{i}", "o"])
        seen = int(conn_of(db).execute("SELECT COUNT(*) FROM operator_actions").fetchone()[0])
        for i in range(5, MANY):
            add_row(db, insert, ["t", "a", f"s{i}", "o"])
        return seen

    assert await store.write_inline(write) == 5

    def read(db: Database) -> list[str]:
        rows = db.execute("SELECT subject FROM operator_actions ORDER BY id").fetchall()
        return [str(r[0]) for r in rows]

    assert await store.read(read) == [f"s{i}" for i in range(MANY)]


async def test_a_row_refused_among_inserts_sent_together_fails_its_own_savepoint(
    store: Store,
) -> None:
    """A row the database refuses (a key already there), among rows of one INSERT added one
    after another: the block of its savepoint fails and is undone; the rows before the
    savepoint stay."""
    insert = InsertRows("INSERT INTO meta (key, value) VALUES ", "(?, ?)")

    def write(db: Database) -> bool:
        conn = conn_of(db)
        add_row(db, insert, ["s-before", "1"])
        try:
            with savepoint(conn, "block"):
                conn.execute("SELECT 1").fetchone()  # waited for: nothing else sent since
                add_row(db, insert, ["s-in", "2"])
                add_row(db, insert, ["s-before", "3"])  # refused: the key is there
                add_row(db, insert, ["s-after", "4"])
        except StoreIntegrityError:
            return True
        return False

    assert await store.write_inline(write) is True
    assert await _meta(store, "s-") == [("s-before", "1")]


async def test_a_refusal_read_while_later_statements_are_sent_is_undone_with_its_savepoint(
    store: Store,
) -> None:
    """A refused row whose error the connection reads while sending later statements of the
    same savepoint's block (on PostgreSQL, not at a wait): the block fails and is undone, and
    the transaction goes on and commits what came before it."""
    insert = InsertRows("INSERT INTO meta (key, value) VALUES ", "(?, ?)")

    def write(db: Database) -> bool:
        conn = conn_of(db)
        add_row(db, insert, ["f-before", "1"])
        conn.execute("SELECT 1").fetchone()
        try:
            with savepoint(conn, "block"):
                add_row(db, insert, ["f-before", "2"])  # refused: the key is there
                conn.execute("SELECT 1")  # sent with the row before it, not waited for
                time.sleep(0.2)  # the refusal arrives meanwhile
                conn.execute("SELECT 2")
                add_row(db, insert, ["f-after", "3"])
        except StoreIntegrityError:
            refused = True
        else:
            refused = False
        add_row(db, insert, ["f-later", "4"])
        return refused

    assert await store.write_inline(write) is True
    assert await _meta(store, "f-") == [("f-before", "1"), ("f-later", "4")]


async def test_a_block_that_raises_after_an_unread_refusal_is_undone_and_the_next_goes_on(
    store: Store,
) -> None:
    """Three blocks under one savepoint name, as the processor applies three events: the second
    sends a row the database refuses (not waited for) and then raises an error of its own. It
    fails and is undone; the third is applied and committed as if the second
    had never run (on PostgreSQL its ROLLBACK TO was skipped as aborted, the savepoint left
    open, and the third failed with "current transaction is aborted")."""
    insert = InsertRows("INSERT INTO meta (key, value) VALUES ", "(?, ?)")

    def write(db: Database) -> list[str]:
        conn = conn_of(db)
        add_row(db, insert, ["e-dup", "0"])
        outcomes = []
        for n in range(3):
            try:
                with savepoint(conn, "event"):
                    add_row(db, insert, [f"e-{n}", "ok"])
                    if n == 1:
                        conn.execute("INSERT INTO meta (key, value) VALUES ('e-dup', 'again')")
                        raise ValueError("the event's own failure")
            except Exception as exc:  # its own error, the refusal, or the transaction aborted
                outcomes.append(type(exc).__name__)
            else:
                outcomes.append("applied")
        return outcomes

    first, second, third = await store.write_inline(write)
    # SQLite refuses the row at once; PostgreSQL reads the refusal later, the block's own error
    # first.
    assert second in ("StoreIntegrityError", "ValueError")
    assert (first, third) == ("applied", "applied")
    assert await _meta(store, "e-") == [("e-0", "ok"), ("e-2", "ok"), ("e-dup", "0")]


@pytest.mark.parametrize("second_hash", ["0xABC", "0xabc"])
async def test_two_bookings_of_one_txhash_in_one_statement_write_only_the_first(
    store: Store, second_hash: str
) -> None:
    """A batch's bookings of two deposits with one txHash (case-blind): the first is written,
    the second is not, and what the batch checks says not every booking was written."""
    bookings = [
        {
            "transaction_id": tx,
            "wallet_id": 1001,
            "wallet_name": "w",
            "currency": "USDT",
            "network": "TRON",
            "amount": "10.5",
            "from_address": "TFrom",
            "tx_hash": tx_hash,
            "trigger": "credited",
        }
        for tx, tx_hash in (("b-1", "0xabc"), ("b-2", second_hash), ("b-3", "0xdef"))
    ]

    def write(db: Database) -> bool:
        written = ledger.book_all_unless_duplicate(db, bookings, decision_field="duplicate")
        return written()

    assert await store.write_inline(write) is False

    def read(db: Database) -> list[tuple[str, str]]:
        rows = db.execute("SELECT transaction_id, amount FROM ledger ORDER BY 1").fetchall()
        return [(str(r[0]), str(r[1])) for r in rows]

    assert await store.read(read) == [("b-1", "10.5"), ("b-3", "10.5")]
