"""The `deposits` table: the tracked state of each deposit, keyed by transactionId."""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from worker.clock import ms_from_iso
from worker.store.db import Database, Db
from worker.store.pg import InsertRows, Row, is_postgres
from worker.store.tx import conn_of, insert_rows, select_among

# The key of the `fact_time` column that holds the provider's time of the credit (its clock,
# the one its daily settlement report is cut by): the UTC day the ledger row belongs to.
CREDIT_DAY_TIME = "credit_provider"


def get_deposit_row(db: Db, transaction_id: str) -> dict[str, Any] | None:
    """The `deposits` row of a transaction, or None."""
    conn = conn_of(db)
    row = conn.execute(
        "SELECT * FROM deposits WHERE transaction_id = ?", (transaction_id,)
    ).fetchone()
    return None if row is None else _as_dict(row)


def get_deposit_rows(db: Db, transaction_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The `deposits` rows of many transactions at once, by transactionId (missing: absent)."""
    return deposit_rows_sent(db, transaction_ids)()


def deposit_rows_sent(
    db: Db, transaction_ids: Sequence[str]
) -> Callable[[], dict[str, dict[str, Any]]]:
    """`get_deposit_rows`, its statements sent now and their rows read when the returned
    function is called (on PostgreSQL in pipeline mode, statements sent meanwhile share the
    round trip)."""
    ids = list(dict.fromkeys(transaction_ids))
    cursors = select_among(db, "SELECT * FROM deposits WHERE transaction_id", ids)

    def rows() -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        for cursor in cursors:
            for row in cursor.fetchall():
                found[row["transaction_id"]] = _as_dict(row)
        return found

    return rows


def upsert_deposit_row(db: Database, row: Mapping[str, Any]) -> None:
    """Insert or update a `deposits` row (keyed by transaction_id)."""
    columns = tuple(row)
    db.conn.execute(_upsert_deposit(columns).sql, [row[c] for c in columns])


def upsert_deposit_rows(db: Db, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert or update many `deposits` rows, one `executemany` per set of columns."""
    by_columns: dict[tuple[str, ...], list[list[Any]]] = {}
    for row in rows:
        columns = tuple(row)
        by_columns.setdefault(columns, []).append([row[c] for c in columns])
    for columns, values in by_columns.items():
        insert_rows(db, _upsert_deposit(columns), values)


@functools.lru_cache(maxsize=16)
def _upsert_deposit(columns: tuple[str, ...]) -> InsertRows:
    updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c != "transaction_id")
    return InsertRows(
        f"INSERT INTO deposits ({', '.join(columns)}) VALUES ",
        f"({', '.join('?' for _ in columns)})",
        f" ON CONFLICT (transaction_id) DO UPDATE SET {updates}",
        key=(columns.index("transaction_id"),),
    )


def is_tracked(db: Db, transaction_id: str) -> bool:
    """Whether the deposit has a row."""
    row = db.execute("SELECT 1 FROM deposits WHERE transaction_id=?", [transaction_id]).fetchone()
    return row is not None


def in_states(db: Db, states: Sequence[str]) -> list[str]:
    """The transactionIds of the deposits in `states`, least recently updated first."""
    marks = ",".join("?" for _ in states)
    return [
        r[0]
        for r in db.execute(
            f"SELECT transaction_id FROM deposits WHERE state IN ({marks})"
            " ORDER BY updated_at, transaction_id",
            list(states),
        ).fetchall()
    ]


def detail_candidates(
    db: Db, states: Sequence[str], *, without_tx_hash: Sequence[str] = ()
) -> list[tuple[str, str, int]]:
    """(transactionId, state, last change in epoch ms) of the deposits in `states`, and of
    those in `without_tx_hash` whose txHash, amount, currency or network is not known yet (a
    booking waits for them), least recently updated first: what the detail poll chooses from
    (docs/polling.md)."""
    marks = ",".join("?" for _ in states)
    hashless = ",".join("?" for _ in without_tx_hash) or "NULL"
    return [
        (str(tx), str(state), ms_from_iso(updated_at))
        for tx, state, updated_at in db.execute(
            f"SELECT transaction_id, state, updated_at FROM deposits WHERE state IN ({marks})"
            f" OR (state IN ({hashless})"
            " AND (tx_hash IS NULL OR amount IS NULL OR currency IS NULL OR network IS NULL))"
            " ORDER BY updated_at, transaction_id",
            [*states, *without_tx_hash],
        ).fetchall()
    ]


def blocked_since(db: Db) -> list[tuple[str, int]]:
    """Every blocked deposit and the provider's time (epoch ms) of the fact that blocked it
    (the deposit's last update when no such time is recorded), oldest first; for the watch on
    BLOCKED deposits (support may release them)."""
    conn = conn_of(db)
    out: list[tuple[str, int]] = []
    for tx, times, updated_at in conn.execute(
        "SELECT transaction_id, fact_time, updated_at FROM deposits WHERE state = 'blocked'"
        " ORDER BY updated_at, transaction_id"
    ).fetchall():
        known = json.loads(times) if isinstance(times, str) and times else {}
        since = known.get("credit_status") if isinstance(known, dict) else None
        out.append((str(tx), int(since) if since is not None else ms_from_iso(updated_at)))
    return out


def lock_deposit(db: Db, transaction_id: str) -> None:
    """Hold the deposit to the end of the transaction, waiting for another instance's
    transaction that holds it: on PostgreSQL the lock the processor's batches take on the
    deposits of their events (`events._claim_pending`), so that a fact applied on its own (a
    poll, a submission) or a decision reads the deposit only once such a batch has committed
    its row, and such a batch never starts on a deposit read by one of them before it ends
    (each would otherwise write back the row it read, dropping the other's change). Nothing
    on SQLite, whose write lock orders every write transaction already."""
    if is_postgres(db):
        db.execute("SELECT pg_advisory_xact_lock(hashtext(?))", [transaction_id]).fetchone()


def set_field(db: Db, transaction_id: str, name: str, value: Any, now: str) -> None:
    """Set one column of a deposit (a decided fixed field) and its updated_at."""
    db.execute(
        f"UPDATE deposits SET {name}=?, updated_at=? WHERE transaction_id=?",
        [value, now, transaction_id],
    )


def deposits_by_state(db: Db) -> dict[str, int]:
    """How many deposits are in each tracked state."""
    return {
        str(state): int(count)
        for state, count in db.execute("SELECT state, COUNT(*) FROM deposits GROUP BY state")
    }


def count_waiting_on_human(db: Db) -> int:
    """How many deposits wait on a person (details needed, rejected, blocked)."""
    row = db.execute(
        "SELECT COUNT(*) FROM deposits WHERE state IN ('needs_details','rejected','blocked')"
    ).fetchone()
    return int(row[0])


def list_deposits(conn: Db, state: str | None = None) -> list[Any]:
    """Every deposit row (of one state when given), oldest first."""
    query = "SELECT * FROM deposits"
    params: list[Any] = []
    if state:
        query += " WHERE state = ?"
        params.append(state)
    return conn.execute(query + " ORDER BY created_at, transaction_id", params).fetchall()


def waiting_on_human(db: Db, *, limit: int = 200) -> list[dict[str, Any]]:
    """Deposits waiting on a person (details needed, rejected, blocked, failed), oldest change
    first."""
    rows = db.execute(
        "SELECT * FROM deposits WHERE state IN ('needs_details','rejected','blocked','failed')"
        " ORDER BY updated_at, transaction_id LIMIT ?",
        [limit],
    )
    return [dict(r) for r in rows]


def networks_among(db: Db, networks: Sequence[str]) -> set[str]:
    """Which of `networks` some deposit is on (a scan of the deposits: for a command's check of
    names it does not know otherwise, not for a loop)."""
    if not networks:
        return set()
    marks = ",".join("?" for _ in networks)
    rows = db.execute(
        f"SELECT DISTINCT network FROM deposits WHERE network IN ({marks})", list(networks)
    ).fetchall()
    return {str(r[0]) for r in rows}


def held_for_decision(db: Db, *, limit: int = 200) -> list[dict[str, Any]]:
    """Deposits whose booking is held for a decision (an undecided conflict or likely
    duplicate: `depositd resolve`), oldest change first."""
    rows = db.execute(
        "SELECT * FROM deposits WHERE transaction_id IN"
        " (SELECT transaction_id FROM conflicts WHERE decided_at IS NULL)"
        " ORDER BY updated_at, transaction_id LIMIT ?",
        [limit],
    )
    return [dict(r) for r in rows]


def page_deposits(db: Db, state: str | None, *, limit: int, offset: int) -> list[dict[str, Any]]:
    """One page of deposits (of one state when given), latest change first."""
    where, params = ("WHERE state = ?", [state]) if state else ("", [])
    rows = db.execute(
        f"SELECT * FROM deposits {where} ORDER BY updated_at DESC, transaction_id LIMIT ? OFFSET ?",
        [*params, limit, offset],
    )
    return [dict(r) for r in rows]


def snapshot(db: Db) -> tuple[Any, ...]:
    """Figures that change whenever a deposit does."""
    return tuple(db.execute("SELECT COUNT(*), MAX(updated_at) FROM deposits").fetchone())


def _as_dict(row: Any) -> dict[str, Any]:
    if isinstance(row, sqlite3.Row | Row):
        return dict(zip(row.keys(), row, strict=True))
    raise TypeError("connection must use sqlite3.Row")


def search_deposits(db: Db, text: str, *, limit: int) -> list[dict[str, Any]]:
    """Deposits whose transactionId is `text`, or whose txHash, source or receiving address is
    `text` whatever its case (a hash or an EVM address is pasted in either), latest change
    first."""
    rows = db.execute(
        "SELECT * FROM deposits WHERE transaction_id = ? OR lower(tx_hash) = lower(?)"
        " OR lower(from_address) = lower(?) OR lower(to_address) = lower(?)"
        " ORDER BY updated_at DESC, transaction_id LIMIT ?",
        [text, text, text, text, limit],
    )
    return [dict(r) for r in rows]


def completed_not_booked(db: Db, *, limit: int, offset: int) -> list[dict[str, Any]]:
    """Deposits credited or completed at the provider that the ledger does not hold (no rule
    booked them, or their booking waits: a conflict, a failed action), longest waiting first."""
    rows = db.execute(
        "SELECT d.* FROM deposits d LEFT JOIN ledger l ON l.transaction_id = d.transaction_id"
        " WHERE d.state IN ('credited', 'completed') AND l.transaction_id IS NULL"
        " ORDER BY d.updated_at, d.transaction_id LIMIT ? OFFSET ?",
        [limit, offset],
    )
    return [dict(r) for r in rows]
