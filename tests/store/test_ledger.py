"""The ledger table: each booking's row as `ledger` and reconciliation read it, booked once on
both engines, the likely-duplicate match, and the reads by day, period and currency."""

from __future__ import annotations

import threading
from decimal import Decimal
from typing import Any

import pytest
import sqlite_utils

from tests.support.pgcluster import Cluster
from worker.store import ledger
from worker.store.pg import PgDatabase
from worker.store.pg import connect as pg_connect
from worker.store.pgstore import PgStore
from worker.store.sqlitestore import Store

BOOKING: dict[str, Any] = {
    "wallet_id": 1001,
    "wallet_name": "Main",
    "currency": "USDT",
    "network": "TRON",
    "amount": "12.50",
    "from_address": "TFrom",
    "tx_hash": "0xAbC",
    "trigger": "credited",
}


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The booking times handed out, in order (set `clock[:] = [...]`)."""
    times: list[str] = []
    monkeypatch.setattr(ledger, "utc_now", lambda: times.pop(0))
    return times


def row_of(found: Any) -> dict[str, Any]:
    return {k: found[k] for k in ("transaction_id", *BOOKING, "booked_at")}


async def test_a_booking_is_written_once_with_every_field(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The row holds wallet, currency, network, amount, fromAddress, txHash, the time and the
    trigger; a second booking of the deposit is refused and changes nothing."""
    monkeypatch.setattr(ledger, "utc_now", lambda: "2026-11-20T10:00:00.000Z")

    def book(db: sqlite_utils.Database, **changes: Any) -> bool:
        return ledger.book_once(db, transaction_id="tx-1", **{**BOOKING, **changes})()

    assert await store.write(book) is True
    monkeypatch.setattr(ledger, "utc_now", lambda: "2026-11-21T10:00:00.000Z")
    assert await store.write(lambda db: book(db, amount="99", trigger="completed")) is False
    [row] = await store.read(ledger.all_booked)
    assert row_of(row) == {
        "transaction_id": "tx-1",
        **BOOKING,
        "booked_at": "2026-11-20T10:00:00.000Z",
    }
    assert await store.read(lambda db: ledger.is_booked(db, "tx-1")) is True
    assert await store.read(lambda db: ledger.is_booked(db, "tx-2")) is False


async def test_the_same_txhash_under_another_id_is_a_likely_duplicate(store: Store) -> None:
    """Same txHash (any case), amount (as a number: "12.5" is "12.50"), currency (any case) and
    receiving address under another id: the booked id is named; any of them different, or the
    same id, is no duplicate."""

    def seed(db: sqlite_utils.Database) -> None:
        for tx, to in (("tx-b", "TTo"), ("tx-a", "TTo"), ("tx-z", "TOther")):
            db.execute("INSERT INTO deposits (transaction_id, to_address) VALUES (?, ?)", [tx, to])
            ledger.lock_tx_hash(db, "0xabc")
            ledger.insert_booking(db, transaction_id=tx, **BOOKING)

    await store.write(seed)

    def ask(db: sqlite_utils.Database) -> list[str | None]:
        def other(**changes: Any) -> str | None:
            asked = {
                "transaction_id": "tx-new",
                "tx_hash": "0XABC",
                "amount": "12.50",
                "currency": "usdt",
                "to_address": "TTo",
                **changes,
            }
            return ledger.likely_duplicate_of(db, **asked)

        return [
            other(),
            other(transaction_id="tx-a"),
            other(amount="12.5"),
            other(amount="12.51"),
            other(currency="USDC"),
            other(to_address="TElse"),
            other(tx_hash="0xabd"),
            other(to_address="TOther"),
        ]

    assert await store.read(ask) == ["tx-a", "tx-b", "tx-a", None, None, None, None, "tx-z"]


async def test_values_not_known_match_only_values_not_known(store: Store) -> None:
    """In the likely-duplicate match, an amount or currency not known (NULL, as rows of older
    versions may hold) is the same only as one not known either; an amount that is no number
    is compared as written."""

    def seed(db: sqlite_utils.Database) -> None:
        for tx, hash_, amount, currency in (
            ("tx-none", "0xnone", None, None),
            ("tx-text", "0xtext", "n/a", "USDT"),
        ):
            db.execute("INSERT INTO deposits (transaction_id, to_address) VALUES (?, 'TTo')", [tx])
            booking = {**BOOKING, "tx_hash": hash_, "amount": amount, "currency": currency}
            ledger.insert_booking(db, transaction_id=tx, **booking)

    await store.write(seed)

    def ask(db: sqlite_utils.Database) -> list[str | None]:
        def other(tx_hash: str, amount: str | None, currency: str | None) -> str | None:
            return ledger.likely_duplicate_of(
                db,
                transaction_id="tx-new",
                tx_hash=tx_hash,
                amount=amount,
                currency=currency,
                to_address="TTo",
            )

        return [
            other("0xnone", None, None),
            other("0xnone", "12.50", None),
            other("0xnone", None, "USDT"),
            other("0xtext", "n/a", "USDT"),
            other("0xtext", "12.50", "USDT"),
        ]

    assert await store.read(ask) == ["tx-none", None, None, "tx-text", None]


def test_insert_booking_says_whether_it_wrote(db: sqlite_utils.Database, clock: list[str]) -> None:
    """The first booking writes the row; the second returns False and keeps the first."""
    clock[:] = ["2026-11-20T10:00:00.000Z", "2026-11-20T11:00:00.000Z"]
    with db.conn:
        assert ledger.insert_booking(db, transaction_id="tx-1", **BOOKING) is True
        assert (
            ledger.insert_booking(db, transaction_id="tx-1", **{**BOOKING, "amount": "1"}) is False
        )
    [row] = ledger.all_booked(db)
    assert row_of(row) == {
        "transaction_id": "tx-1",
        **BOOKING,
        "booked_at": "2026-11-20T10:00:00.000Z",
    }


def book_at(db: sqlite_utils.Database, clock: list[str], *rows: tuple[str, str, str, str]) -> None:
    """(transactionId, booked_at, currency, amount) per booking."""
    with db.conn:
        for tx, at, currency, amount in rows:
            clock.append(at)
            ledger.insert_booking(
                db, transaction_id=tx, **{**BOOKING, "currency": currency, "amount": amount}
            )


def ids(rows: Any) -> list[str]:
    return [r["transaction_id"] for r in rows]


def test_reads_by_time_day_and_period(db: sqlite_utils.Database, clock: list[str]) -> None:
    """Since a time (included), on a day (paged), between two days (both included), all: in
    booking order, ties by transactionId; the count and the snapshot follow each booking."""
    assert ledger.count_booked(db) == 0
    empty = ledger.snapshot(db)
    book_at(
        db,
        clock,
        ("tx-d", "2026-11-21T00:00:00.000Z", "USDT", "1"),
        ("tx-c", "2026-11-20T23:59:59.999Z", "USDT", "2"),
        ("tx-b", "2026-11-20T08:00:00.000Z", "USDT", "3"),
        ("tx-a", "2026-11-20T08:00:00.000Z", "USDT", "4"),
        ("tx-e", "2026-11-19T12:00:00.000Z", "USDT", "5"),
        ("tx-f", "2026-11-22T12:00:00.000Z", "USDT", "6"),
    )
    assert ledger.count_booked(db) == 6
    assert ledger.snapshot(db) != empty
    assert ids(ledger.all_booked(db)) == ["tx-e", "tx-a", "tx-b", "tx-c", "tx-d", "tx-f"]
    assert ids(ledger.booked_since(db.conn)) == ["tx-e", "tx-a", "tx-b", "tx-c", "tx-d", "tx-f"]
    assert ids(ledger.booked_since(db.conn, "2026-11-20T23:59:59.999Z")) == ["tx-c", "tx-d", "tx-f"]
    day = "2026-11-20"
    assert ids(ledger.booked_on_day(db, day, limit=10, offset=0)) == ["tx-a", "tx-b", "tx-c"]
    assert ids(ledger.booked_on_day(db, day, limit=1, offset=1)) == ["tx-b"]
    assert ids(ledger.booked_on_day(db, day, limit=5, offset=2)) == ["tx-c"]
    assert ids(ledger.booked_between(db, "2026-11-20", "2026-11-21")) == [
        "tx-a",
        "tx-b",
        "tx-c",
        "tx-d",
    ]
    assert ids(ledger.booked_between(db, "2026-11-19", "2026-11-19")) == ["tx-e"]
    assert ledger.booked_on_day(db, day, limit=1, offset=0)[0]["amount"] == "4"
    # The export's chunks: after a (booked_at, transactionId) key, ties cut in the middle.
    chunk = ledger.booked_between_after(db, "2026-11-20", "2026-11-21", None, limit=1)
    assert ids(chunk) == ["tx-a"]
    after = (chunk[0]["booked_at"], chunk[0]["transaction_id"])
    assert ids(ledger.booked_between_after(db, "2026-11-20", "2026-11-21", after, limit=2)) == [
        "tx-b",
        "tx-c",
    ]
    last = ("2026-11-20T23:59:59.999Z", "tx-c")
    assert ids(ledger.booked_between_after(db, "2026-11-19", "2026-11-21", last, limit=9)) == [
        "tx-d"
    ]


def test_booked_among_reads_past_its_batches(db: sqlite_utils.Database, clock: list[str]) -> None:
    """Of 1,200 ids asked at once, exactly the booked ones come back, whatever their place."""
    booked = ["tx-0000", "tx-0499", "tx-0500", "tx-0999", "tx-1000", "tx-1199"]
    book_at(db, clock, *((tx, "2026-11-20T00:00:00.000Z", "USDT", "1") for tx in booked))
    asked = [f"tx-{i:04d}" for i in range(1200)]
    assert ledger.booked_among(db, asked) == set(booked)
    assert ledger.booked_among(db, ["tx-0001"]) == set()
    assert ledger.booked_among(db, []) == set()


def test_sums_by_currency_are_exact(db: sqlite_utils.Database, clock: list[str]) -> None:
    """Per currency, exactly (no float), an unknown amount left out, currencies in order."""
    book_at(
        db,
        clock,
        ("tx-1", "2026-11-20T00:00:00.000Z", "USDT", "0.1"),
        ("tx-2", "2026-11-20T00:00:01.000Z", "USDT", "0.2"),
        ("tx-3", "2026-11-20T00:00:02.000Z", "BTC", "0.00000001"),
        ("tx-4", "2026-11-20T00:00:03.000Z", "BTC", "1"),
    )
    with db.conn:
        clock.append("2026-11-20T00:00:04.000Z")
        ledger.insert_booking(db, transaction_id="tx-5", **{**BOOKING, "amount": None})
    sums = ledger.sums_by_currency(db)
    assert sums == {"BTC": Decimal("1.00000001"), "USDT": Decimal("0.3")}
    assert list(sums) == ["BTC", "USDT"]
    assert str(sums["USDT"]) == "0.3"


async def test_two_bookings_of_one_txhash_take_turns_on_postgres(pg_cluster: Cluster) -> None:
    """PostgreSQL: while one instance holds a txHash to book it, another booking the same
    txHash (in another case) waits for it, so it reads the first's ledger row before deciding
    whether it is a duplicate."""
    url = pg_cluster.create_database()
    try:
        store = PgStore(url)
        await store.open()
        await store.close()
        one, two = PgDatabase(pg_connect(url)), PgDatabase(pg_connect(url))
        try:
            one.execute("BEGIN")
            ledger.lock_tx_hash(one, "0xabc")  # type: ignore[arg-type]
            ledger.insert_booking(one, transaction_id="tx-1", **BOOKING)  # type: ignore[arg-type]
            seen: list[str | None] = []

            def second() -> None:
                two.execute("BEGIN")
                ledger.lock_tx_hash(two, "0xABC")  # type: ignore[arg-type]
                seen.append(
                    ledger.likely_duplicate_of(
                        two,  # type: ignore[arg-type]
                        transaction_id="tx-2",
                        tx_hash="0xabc",
                        amount=BOOKING["amount"],
                        currency="USDT",
                        to_address=None,
                    )
                )
                two.execute("COMMIT")

            thread = threading.Thread(target=second)
            thread.start()
            thread.join(0.5)
            assert seen == [], "the second booking did not wait for the first"
            one.execute("COMMIT")
            thread.join(10)
            assert not thread.is_alive(), "the second booking never went on"
            assert seen == ["tx-1"]
        finally:
            one.close()
            two.close()
    finally:
        pg_cluster.drop_database(url)
