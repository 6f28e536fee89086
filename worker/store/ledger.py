"""The ledger table (one row per booked deposit): every statement on it.

Each function runs inside the caller's transaction (`Store.write` jobs).
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

from worker.clock import utc_now
from worker.provider import canonical
from worker.store.db import Db
from worker.store.pg import dialect, is_postgres
from worker.store.tx import conn_of, select_among


def is_booked(db: Db, transaction_id: str) -> bool:
    """Does the ledger hold the deposit?"""
    found = conn_of(db).execute("SELECT 1 FROM ledger WHERE transaction_id=?", (transaction_id,))
    return found.fetchone() is not None


def lock_tx_hash(db: Db, tx_hash: str) -> None:
    """Hold the txHash (case-blind) to the end of the transaction: on PostgreSQL two instances
    booking two ids of one txHash at the same moment take turns, so the second reads the
    first's ledger row before it decides (`likely_duplicate_of`). Nothing on SQLite, whose
    write lock orders every write transaction already. The two-key lock space is not the one
    of the deposit locks (`deposits.lock_deposit`)."""
    if is_postgres(db):
        # Not waited for: the server runs the statements of a pipeline in order, so the next
        # statement (the ledger read) starts once the lock is held.
        db.execute("SELECT pg_advisory_xact_lock(1, hashtext(lower(?)))", [tx_hash])


def likely_duplicate_of(
    db: Db,
    *,
    transaction_id: str,
    tx_hash: str,
    amount: str | None,
    currency: str | None,
    to_address: str | None,
) -> str | None:
    """The transactionId of a booked deposit with the same txHash (case-blind; the deposit's
    when its ledger row has none), amount (as a number: "100.00" is "100"), currency and
    receiving address (both case-blind, blanks around ignored; an address not known on either
    side counts as the same) under another id, if any."""
    # The second part: a deposit booked before its txHash was known has none in its ledger
    # row; its deposit row holds the hash learnt since. Each part reads an index of ledger.
    rows = db.execute(
        "SELECT l.transaction_id, l.amount, l.currency, d.to_address FROM ledger l"
        " LEFT JOIN deposits d ON d.transaction_id = l.transaction_id"
        " WHERE lower(l.tx_hash) = lower(?) AND l.transaction_id <> ?"
        " UNION ALL"
        " SELECT l.transaction_id, l.amount, l.currency, d.to_address FROM ledger l"
        " JOIN deposits d ON d.transaction_id = l.transaction_id"
        " WHERE l.tx_hash IS NULL AND lower(d.tx_hash) = lower(?) AND l.transaction_id <> ?"
        " ORDER BY 1",
        [tx_hash, transaction_id, tx_hash, transaction_id],
    ).fetchall()
    for other, booked_amount, booked_currency, booked_to in rows:
        if (
            _same_amount(booked_amount, amount)
            and _same_text(booked_currency, currency)
            and _same_address(booked_to, to_address)
        ):
            return str(other)
    return None


def _same_amount(a: object, b: object) -> bool:
    if a is None or b is None:
        return a is None and b is None
    try:
        return Decimal(str(a)) == Decimal(str(b))
    except ArithmeticError:
        return str(a) == str(b)


def _same_text(a: object, b: object) -> bool:
    # Currencies and addresses in their canonical forms (`worker.provider.canonical`), the
    # ledger's as well as the deposit's; a row booked before values were made canonical where
    # they enter is read into that form.
    return bool(canonical.code(a) == canonical.code(b))


def _same_address(a: object, b: object) -> bool:
    # A deposit known from its webhook alone has no toAddress (the webhook does not carry it):
    # an address not known tells the two deposits apart no more than an equal one does.
    # Compared case-blind, although a base58 address is case-sensitive: two addresses that
    # differ in case alone hold the booking for a person rather than book the money twice.
    if canonical.address(a) is None or canonical.address(b) is None:
        return True
    return _same_text(a, b)


def insert_booking(
    db: Db,
    *,
    transaction_id: str,
    wallet_id: int | None,
    wallet_name: str | None,
    currency: str | None,
    network: str | None,
    amount: str | None,
    from_address: str | None,
    tx_hash: str | None,
    trigger: str,
) -> bool:
    """Write the deposit's ledger row unless it exists; False when it was already booked."""
    return book_once(
        db,
        transaction_id=transaction_id,
        wallet_id=wallet_id,
        wallet_name=wallet_name,
        currency=currency,
        network=network,
        amount=amount,
        from_address=from_address,
        tx_hash=tx_hash,
        trigger=trigger,
    )()


# The row unless the deposit is booked: one statement, whose outcome is read only when asked
# (on PostgreSQL in pipeline mode it is not waited for until then). PostgreSQL types the values
# of a SELECT list itself: they are cast to the columns' types.
_BOOK_ONCE = {
    "sqlite": "INSERT INTO ledger (transaction_id, wallet_id, wallet_name, currency,"
    " network, amount, from_address, tx_hash, booked_at, trigger)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
    "postgres": "INSERT INTO ledger (transaction_id, wallet_id, wallet_name, currency,"
    " network, amount, from_address, tx_hash, booked_at, trigger)"
    " VALUES (?::text, ?::bigint, ?::text, ?::text, ?::text, ?::text, ?::text, ?::text,"
    " ?::text, ?::text) ON CONFLICT DO NOTHING",
}


def book_once(
    db: Db,
    *,
    transaction_id: str,
    wallet_id: int | None,
    wallet_name: str | None,
    currency: str | None,
    network: str | None,
    amount: str | None,
    from_address: str | None,
    tx_hash: str | None,
    trigger: str,
    booked_at: str | None = None,
) -> Callable[[], bool]:
    """Write the deposit's ledger row unless it exists (`booked_at`: now when None); returns
    what says whether it was written (asked when needed). The caller has decided it may be
    booked (the act kind `book`: credited, no conflict, not a likely duplicate)."""
    sql = _BOOK_ONCE[dialect(db)]
    values = [transaction_id, wallet_id, wallet_name, currency, network, amount, from_address]
    values += [tx_hash, booked_at or utc_now(), trigger]
    cursor = conn_of(db).execute(sql, values)
    return lambda: cursor.rowcount == 1


# The row unless the deposit is booked, has a decision on being a duplicate, or shares its
# txHash with another booked deposit (the ledger's hash, or the hash its deposit learnt since):
# a superset of `likely_duplicate_of`, which compares amounts as numbers and addresses and
# currencies case-blind in Python. A batch sends it without waiting and reads at its end
# whether every row was written; when one was not, the batch is applied again one event at a
# time, where `likely_duplicate_of` tells a likely duplicate (held) from another output of the
# same transaction (booked).
#
# On SQLite one statement per booking. On PostgreSQL one for all of a batch's bookings (its
# arrays, a column's values each, one parameter each: `_all_values`): a statement does not see
# the rows it inserts itself, so a row is also passed over when an earlier one of the same
# statement has its txHash under another transactionId, written or not. It then writes no row
# that the statement run once per booking, in order, would not, and when it writes them all,
# they are the same rows; when it writes fewer, the batch is applied again as above. Each
# `OFFSET 0` keeps its NOT EXISTS a lookup per booking by the indexes, as in the statement for
# one booking (made a join, the plan kept for the prepared statement, made while the tables
# were small, read the whole ledger per batch once it had grown), and a deposit is read by its
# key.
# (SQLite takes `ON CONFLICT` after an `INSERT ... SELECT` only when the SELECT has a WHERE,
# as here: without one it reads the ON as a join's.)
_BOOK_UNLESS_DUPLICATE = {
    "sqlite": "INSERT INTO ledger (transaction_id, wallet_id, wallet_name, currency,"
    " network, amount, from_address, tx_hash, booked_at, trigger)"
    " SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?"
    " WHERE NOT EXISTS (SELECT 1 FROM conflicts WHERE transaction_id = ? AND field = ?"
    " AND decided_at IS NOT NULL)"
    " AND NOT EXISTS (SELECT 1 FROM ledger WHERE lower(tx_hash) = lower(?)"
    " AND transaction_id <> ?)"
    " AND NOT EXISTS (SELECT 1 FROM ledger l JOIN deposits d ON d.transaction_id = l.transaction_id"
    " WHERE l.tx_hash IS NULL AND lower(d.tx_hash) = lower(?) AND l.transaction_id <> ?)"
    " ON CONFLICT DO NOTHING",
    "postgres": "WITH u AS (SELECT * FROM unnest(?::text[], ?::text[], ?::text[], ?::text[],"
    " ?::text[], ?::text[], ?::text[], ?::text[], ?::text[]) WITH ORDINALITY"
    " AS u(transaction_id, wallet_id, wallet_name, currency, network, amount, from_address,"
    " tx_hash, trigger, n)),"
    # The transactionIds of the earlier bookings of the statement with the same txHash.
    " v AS (SELECT u.*, min(u.transaction_id) OVER earlier AS first_tx,"
    " max(u.transaction_id) OVER earlier AS last_tx FROM u WINDOW earlier AS"
    " (PARTITION BY lower(u.tx_hash) ORDER BY u.n"
    " ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING))"
    " INSERT INTO ledger (transaction_id, wallet_id, wallet_name, currency,"
    " network, amount, from_address, tx_hash, booked_at, trigger)"
    " SELECT v.transaction_id, v.wallet_id::bigint, v.wallet_name, v.currency, v.network,"
    " v.amount, v.from_address, v.tx_hash, ?::text, v.trigger FROM v"
    " WHERE (v.first_tx IS NULL"
    " OR (v.first_tx = v.transaction_id AND v.last_tx = v.transaction_id))"
    " AND NOT EXISTS (SELECT 1 FROM conflicts WHERE transaction_id = v.transaction_id"
    " AND field = ?::text AND decided_at IS NOT NULL OFFSET 0)"
    " AND NOT EXISTS (SELECT 1 FROM ledger WHERE lower(tx_hash) = lower(v.tx_hash)"
    " AND transaction_id <> v.transaction_id OFFSET 0)"
    " AND NOT EXISTS (SELECT 1 FROM ledger l WHERE l.tx_hash IS NULL"
    " AND l.transaction_id <> v.transaction_id AND lower((SELECT d.tx_hash FROM deposits d"
    " WHERE d.transaction_id = l.transaction_id)) = lower(v.tx_hash) OFFSET 0)"
    " ORDER BY v.n ON CONFLICT DO NOTHING",
}
# `_all_values`' arrays, in the order of the statement's.
_ALL_COLUMNS = (
    "transaction_id",
    "wallet_id",
    "wallet_name",
    "currency",
    "network",
    "amount",
    "from_address",
    "tx_hash",
    "trigger",
)


# The txHashes of a batch's bookings held at once, in one order for every instance (two
# instances locking two hashes in opposite orders would deadlock).
_LOCK_TX_HASHES = (
    "SELECT COUNT(pg_advisory_xact_lock(1, hashtext(h))) FROM (SELECT DISTINCT lower(x) AS h"
    " FROM unnest(?::text[]) AS x ORDER BY 1) AS hashes"
)


def book_all_unless_duplicate(
    db: Db,
    bookings: list[dict[str, Any]],
    *,
    decision_field: str,
    booked_at: str | None = None,
) -> Callable[[], bool]:
    """Each booking's row (`book_once`'s values; each with a txHash, which PostgreSQL's one
    statement relies on to see the bookings before it; all booked at `booked_at`, now when
    None) unless the deposit is booked, has a decision on its `decision_field` conflict, or
    another booked deposit has its txHash (`_BOOK_UNLESS_DUPLICATE`'s checks).
    Their txHashes are locked first (`lock_tx_hash`), all in one statement. Nothing is waited
    for: returns what says whether every row was written (when not, the caller finds out why
    the slow way)."""
    now = booked_at or utc_now()
    if is_postgres(db):
        # Not waited for: the server runs the statements of a pipeline in order.
        conn_of(db).execute(_LOCK_TX_HASHES, [[b["tx_hash"] for b in bookings]])
        cursor = conn_of(db).execute(
            _BOOK_UNLESS_DUPLICATE["postgres"], _all_values(bookings, now, decision_field)
        )
    else:
        cursor = conn_of(db).executemany(
            _BOOK_UNLESS_DUPLICATE["sqlite"],
            [_unless_values(b, now, decision_field) for b in bookings],
        )
    return lambda: cursor.rowcount == len(bookings)


def _all_values(bookings: list[dict[str, Any]], now: str, decision_field: str) -> list[Any]:
    """The parameters of `_BOOK_UNLESS_DUPLICATE["postgres"]`: a column's values each (as
    text), the time, the decision's field."""
    columns: list[Any] = [
        [None if b[c] is None else str(b[c]) for b in bookings] for c in _ALL_COLUMNS
    ]
    return [*columns, now, decision_field]


def _unless_values(booking: dict[str, Any], now: str, decision_field: str) -> list[Any]:
    tx, tx_hash, amount = booking["transaction_id"], booking["tx_hash"], booking["amount"]
    values = [tx, booking["wallet_id"], booking["wallet_name"], booking["currency"]]
    values += [booking["network"], amount, booking["from_address"], tx_hash, now]
    values += [booking["trigger"], tx, decision_field, tx_hash, tx, tx_hash, tx]
    return values


def booked_among(db: Db, transaction_ids: list[str]) -> set[str]:
    """Which of these deposits the ledger holds."""
    return booked_among_sent(db, transaction_ids)()


def booked_among_sent(db: Db, transaction_ids: list[str]) -> Callable[[], set[str]]:
    """`booked_among`, its statements sent now and read when the returned function is called
    (on PostgreSQL in pipeline mode, statements sent meanwhile share the round trip)."""
    cursors = select_among(
        db, "SELECT transaction_id FROM ledger WHERE transaction_id", transaction_ids
    )
    return lambda: {str(r[0]) for cursor in cursors for r in cursor.fetchall()}


# --- reads and commands outside the outbox ---


def booked_since(conn: Db, since: str | None = None) -> list[Any]:
    """Ledger rows booked at or after `since` (all when None), oldest booking first."""
    query = "SELECT * FROM ledger"
    params: list[Any] = []
    if since is not None:
        query += " WHERE booked_at >= ?"
        params.append(since)
    return conn.execute(query + " ORDER BY booked_at, transaction_id", params).fetchall()


def all_booked(db: Db) -> list[dict[str, Any]]:
    """Every ledger row in booking order, ties in transaction id order (the table's key: the
    same order on both engines, where PostgreSQL has no insertion order to read)."""
    return [dict(r) for r in db.execute("SELECT * FROM ledger ORDER BY booked_at, transaction_id")]


def booked_on_day(db: Db, day: str, *, limit: int, offset: int) -> list[dict[str, Any]]:
    """One page of the deposits booked on a UTC day (YYYY-MM-DD), in booking order."""
    rows = db.execute(
        "SELECT * FROM ledger WHERE substr(booked_at, 1, 10) = ? ORDER BY booked_at,"
        " transaction_id LIMIT ? OFFSET ?",
        [day, limit, offset],
    )
    return [dict(r) for r in rows]


def count_booked(db: Db) -> int:
    """How many deposits are booked."""
    return int(db.execute("SELECT COUNT(*) FROM ledger").fetchone()[0])


def snapshot(db: Db) -> tuple[Any, ...]:
    """Figures that change whenever a deposit is booked."""
    return tuple(db.execute("SELECT COUNT(*) FROM ledger").fetchone())


def booked_between(db: Db, first_day: str, last_day: str) -> list[dict[str, Any]]:
    """The deposits booked from one UTC day to another (YYYY-MM-DD, both included), in booking
    order."""
    rows = db.execute(
        "SELECT * FROM ledger WHERE substr(booked_at, 1, 10) BETWEEN ? AND ?"
        " ORDER BY booked_at, transaction_id",
        [first_day, last_day],
    )
    return [dict(r) for r in rows]


def booked_between_after(
    db: Db, first_day: str, last_day: str, after: tuple[str, str] | None, *, limit: int
) -> list[dict[str, Any]]:
    """`booked_between` a chunk at a time: the first `limit` rows after `after` (the
    (booked_at, transaction_id) of the previous chunk's last row; None: from the start)."""
    where, params = "", [first_day, last_day]
    if after is not None:
        where = " AND (booked_at > ? OR (booked_at = ? AND transaction_id > ?))"
        params += [after[0], after[0], after[1]]
    rows = db.execute(
        f"SELECT * FROM ledger WHERE substr(booked_at, 1, 10) BETWEEN ? AND ?{where}"
        " ORDER BY booked_at, transaction_id LIMIT ?",
        [*params, limit],
    )
    return [dict(r) for r in rows]


def sums_by_currency(conn: Db) -> dict[str, Decimal]:
    """The ledger's booked amounts summed per currency, exactly (`depositd migrate-store`
    compares them on both sides)."""
    sums: dict[str, Decimal] = {}
    for currency, amount in conn.execute("SELECT currency, amount FROM ledger").fetchall():
        if amount is not None:
            key = str(currency)
            sums[key] = sums.get(key, Decimal(0)) + Decimal(str(amount))
    return dict(sorted(sums.items()))
