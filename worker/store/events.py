"""The `events` table: the inbox of received webhook deliveries, in receive order."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from worker.clock import utc_now
from worker.store.db import Database, Db
from worker.store.pg import InsertRows, PgConnection, is_postgres

EVENT_STATUSES = ("pending", "processed", "ignored", "failed")

_LISTED_COLUMNS = (
    "SELECT seq, event_id, event_type, reference_id, transaction_id, received_at, status,"
    " processed_at, error FROM events"
)


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
    headers: str | None = None  # the `STORED_HEADERS` as JSON

    def signed_at(self) -> int | None:
        """The delivery's API-TIMESTAMP (the provider's clock when it sent it), if stored."""
        if not self.headers:
            return None
        try:
            value = json.loads(self.headers).get("API-TIMESTAMP")
            return int(value) if isinstance(value, str) and value.isdigit() else None
        except (ValueError, AttributeError):
            return None

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
            headers=dict(row).get("headers"),
        )


# --- receiving ---------------------------------------------------------------------------

# SQLite: one statement per row, new when it inserted one.
_INSERT_EVENT = (
    "INSERT INTO events (event_id, event_type, reference_id, transaction_id, body,"
    " headers, received_at, status, processed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (event_id) DO NOTHING"
)
# PostgreSQL: all rows at once (one round trip), a row new when it returns its eventId.
_INSERT_EVENTS = InsertRows(
    "INSERT INTO events (event_id, event_type, reference_id, transaction_id, body,"
    " headers, received_at, status, processed_at) VALUES ",
    "(?, ?, ?, ?, ?, ?, ?, ?, ?)",
    " ON CONFLICT (event_id) DO NOTHING RETURNING event_id",
)


def insert_events(db: Database, rows: Sequence[Sequence[Any]]) -> list[bool]:
    """Insert received events (`worker.store.sqlitestore.event_row` each) unless their eventId is
    stored; per row, whether it was new (the first of two equal eventIds only)."""
    conn = db.conn
    if isinstance(conn, PgConnection):
        # In statements of many rows, inserted in their order: of two rows with one eventId the
        # first is the one inserted, as when each row is a statement of its own.
        inserted = {r[0] for r in conn.insert_returning(_INSERT_EVENTS, rows)}
        new = []
        for row in rows:
            new.append(row[0] in inserted)
            inserted.discard(row[0])
        return new
    cursor = conn.cursor()
    results = []
    for row in rows:
        cursor.execute(_INSERT_EVENT, row)
        results.append(cursor.rowcount == 1)
    return results


# --- processing --------------------------------------------------------------------------


_PENDING = (
    "SELECT seq, event_id, event_type, reference_id, transaction_id, body, received_at,"
    " status, error, headers FROM events WHERE status = 'pending' ORDER BY seq LIMIT ?"
)


def pending_events(db: Database, *, limit: int = 100) -> list[StoredEvent]:
    """Pending events in receive order; on PostgreSQL, those this transaction claimed (see
    `_claim_pending`)."""
    if is_postgres(db):
        rows = _claim_pending(db, limit)
    else:
        rows = db.conn.execute(_PENDING, (limit,)).fetchall()
    # Positional construction: this runs once per processed event.
    return [
        StoredEvent(r[0], r[1], r[2], r[3], r[4], bytes(r[5]), r[6], r[7], r[8], r[9]) for r in rows
    ]


# One statement, one round trip: the pending rows locked (`FOR UPDATE SKIP LOCKED`), an advisory
# lock tried once per deposit among them (`won`), and for each deposit won the first pending
# event up to the last row locked that this statement did not lock (`cut`: another instance
# holds it; `skipped`: the pending rows up to the last one locked that this statement did not
# lock, read in one pass, not once per deposit). CTEs with a locking clause or a volatile
# function, and a MATERIALIZED one, are evaluated once, in full.
_CLAIM = (
    "WITH claimed AS (SELECT seq, event_id, event_type, reference_id, transaction_id, body,"
    " received_at, status, error, headers FROM events WHERE status = 'pending' ORDER BY seq LIMIT ?"
    " FOR UPDATE SKIP LOCKED),"
    " ids AS (SELECT transaction_id, MIN(seq) AS first FROM claimed"
    " WHERE transaction_id IS NOT NULL GROUP BY transaction_id),"
    " won AS MATERIALIZED (SELECT transaction_id FROM (SELECT transaction_id FROM ids"
    " ORDER BY first) AS o WHERE pg_try_advisory_xact_lock(hashtext(transaction_id))),"
    " skipped AS MATERIALIZED (SELECT transaction_id, seq FROM events WHERE status = 'pending'"
    " AND seq <= (SELECT MAX(seq) FROM claimed) AND seq NOT IN (SELECT seq FROM claimed)),"
    " cut AS (SELECT s.transaction_id, MIN(s.seq) AS seq FROM skipped s"
    " JOIN won w ON w.transaction_id = s.transaction_id GROUP BY s.transaction_id)"
    " SELECT c.seq, c.event_id, c.event_type, c.reference_id, c.transaction_id, c.body,"
    " c.received_at, c.status, c.error, c.headers FROM claimed c LEFT JOIN cut"
    " ON cut.transaction_id = c.transaction_id WHERE c.transaction_id IS NULL"
    " OR (c.transaction_id IN (SELECT transaction_id FROM won)"
    " AND (cut.seq IS NULL OR c.seq < cut.seq)) ORDER BY c.seq"
)


def _claim_pending(db: Database, limit: int) -> list[Any]:
    """Pending events claimed by this transaction until it ends, in receive order, such that
    no other instance applies the same deposit's facts meanwhile, nor out of order.

    The rows are locked (`FOR UPDATE SKIP LOCKED`: those another instance holds are passed
    over), and each deposit under a transaction-scoped advisory lock on its transactionId. A
    deposit is left for later when another instance holds its lock, and its events from the
    first one another instance holds on: its events are applied in receive order by one
    instance at a time. One statement (`_CLAIM`).

    The pending rows are read in the order of their index (`events_pending`), up to `limit`:
    bitmap scans are off for the claim. Where the server's statistics said few events were
    pending (taken while the inbox was empty, or none yet in a new database), it read all the
    pending rows of a backlog, bodies and all, and sorted them, for every batch.
    """
    conn = db.conn
    conn.execute("SET LOCAL enable_bitmapscan = off")  # sent with the claim: no round trip
    cursor = conn.execute(_CLAIM, (limit,))
    conn.execute("SET LOCAL enable_bitmapscan TO DEFAULT")
    return list(cursor.fetchall())


def event_status(db: Db, seq: int) -> str | None:
    """The status of one stored event."""
    row = db.execute("SELECT status FROM events WHERE seq = ?", [seq]).fetchone()
    return None if row is None else str(row[0])


def mark_events(db: Database, marks: Sequence[tuple[int, str, str | None]]) -> None:
    """Mark many events at once: (seq, status, error) each, one processed_at for all."""
    for _, status, _ in marks:
        if status not in EVENT_STATUSES or status == "pending":
            raise ValueError(f"cannot mark an event {status!r}")
    now = utc_now()
    if is_postgres(db):
        # One statement for all (its arrays each a parameter); an event marked twice takes its
        # last mark, as it would marked one statement at a time.
        last = {seq: (status, error) for seq, status, error in marks}
        if last:
            db.conn.execute(
                _MARK_ALL,
                [
                    now,
                    [str(seq) for seq in last],
                    [m[0] for m in last.values()],
                    [m[1] for m in last.values()],
                ],
            )
        return
    db.conn.executemany(
        "UPDATE events SET status = ?, error = ?, processed_at = ? WHERE seq = ?",
        [(status, error, now, seq) for seq, status, error in marks],
    )


_MARK_ALL = (
    "UPDATE events SET status = m.status, error = m.error, processed_at = ?::text"
    " FROM unnest(?::text[], ?::text[], ?::text[]) AS m(seq, status, error)"
    " WHERE events.seq = m.seq::bigint"
)


def delete_done_before(db: Db, cutoff: str) -> int:
    """Delete processed/ignored events received before `cutoff`; returns how many."""
    cur = db.execute(
        "DELETE FROM events WHERE status IN ('processed','ignored') AND received_at < ?",
        [cutoff],
    )
    return int(cur.rowcount)


# --- status and metrics ------------------------------------------------------------------


def oldest_pending_received_at(db: Db) -> str | None:
    """receivedAt of the oldest pending event (processing lag)."""
    row = db.execute(
        "SELECT received_at FROM events WHERE status = 'pending' ORDER BY seq LIMIT 1"
    ).fetchone()
    return None if row is None else str(row[0])


def open_depths(db: Db) -> dict[str, int]:
    """How many events are pending and failed (a status with none is left out)."""
    return {
        str(status): int(count)
        for status, count in db.execute(
            "SELECT status, COUNT(*) FROM events WHERE status IN ('pending', 'failed')"
            " GROUP BY status"
        )
    }


def count_pending(db: Db) -> int:
    """How many events wait to be processed."""
    return int(db.execute("SELECT COUNT(*) FROM events WHERE status='pending'").fetchone()[0])


def count_failed(db: Db) -> int:
    """How many events failed."""
    return int(db.execute("SELECT COUNT(*) FROM events WHERE status='failed'").fetchone()[0])


def last_received_at(db: Db) -> str | None:
    """receivedAt of the newest stored event."""
    value = db.execute("SELECT MAX(received_at) FROM events").fetchone()[0]
    return None if value is None else str(value)


def snapshot(db: Db) -> tuple[tuple[Any, ...], ...]:
    """Figures that change whenever the inbox does."""
    return (
        tuple(db.execute("SELECT COUNT(*), MAX(seq) FROM events").fetchone()),
        tuple(
            db.execute(
                "SELECT COUNT(*), SUM(CASE WHEN status='pending' THEN 1 ELSE 0 END) FROM events"
            ).fetchone()
        ),
    )


# --- commands ----------------------------------------------------------------------------


def requeue_event(conn: Db, event_id: str) -> bool:
    """Put one stored event back to pending; False when there is no such event."""
    cur = conn.execute(
        "UPDATE events SET status='pending', error=NULL, processed_at=NULL WHERE event_id=?",
        [event_id],
    )
    return cur.rowcount != 0


def requeue_failed_events(conn: Db) -> int:
    """Every failed event back to pending; returns how many."""
    return int(
        conn.execute(
            "UPDATE events SET status='pending', error=NULL WHERE status='failed'"
        ).rowcount
    )


def page_events(
    db: Db, *, status: str | None, event_type: str | None, limit: int, offset: int
) -> list[dict[str, Any]]:
    """One page of stored events (without the body), newest first, filtered when given."""
    where: list[str] = []
    params: list[Any] = []
    if status:
        where.append("status = ?")
        params.append(status)
    if event_type:
        where.append("event_type = ?")
        params.append(event_type)
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    rows = db.execute(
        f"{_LISTED_COLUMNS}{clause} ORDER BY seq DESC LIMIT ? OFFSET ?", [*params, limit, offset]
    )
    return [dict(r) for r in rows]


def get_event(db: Db, event_id: str) -> dict[str, Any] | None:
    """One stored event (without the body) by its eventId."""
    row = db.execute(f"{_LISTED_COLUMNS} WHERE event_id = ?", [event_id]).fetchone()
    return None if row is None else dict(row)


def stored_body(conn: Db, event_id: str) -> bytes | str | None:
    """The raw body of a stored event as stored (bytes; text when written as text), or None."""
    row = conn.execute("SELECT body FROM events WHERE event_id = ?", [event_id]).fetchone()
    return None if row is None else row["body"]


def status_of(conn: Db, event_id: str) -> str | None:
    """The status of a stored event by its eventId, or None when not stored."""
    row = conn.execute("SELECT status FROM events WHERE event_id = ?", [event_id]).fetchone()
    return None if row is None else str(row[0])


def _filter(
    failed: bool, types: Sequence[str] | None, since: str | None
) -> tuple[list[str], list[Any]]:
    where: list[str] = []
    params: list[Any] = []
    if failed:
        where.append("status = 'failed'")
    if types:
        where.append(f"event_type IN ({', '.join('?' for _ in types)})")
        params.extend(types)
    if since is not None:
        where.append("received_at >= ?")
        params.append(since)
    return where, params


def list_events(
    conn: Db,
    *,
    failed: bool = False,
    types: Sequence[str] | None = None,
    since: str | None = None,
    limit: int | None = None,
) -> list[Any]:
    """Stored events (without the body) oldest first: only failed ones, of `types`, received
    at or after `since` (stored format) when given; `limit`: the newest that many of them."""
    where, params = _filter(failed, types, since)
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    if limit is None:
        return conn.execute(f"{_LISTED_COLUMNS}{clause} ORDER BY seq", params).fetchall()
    rows = conn.execute(
        f"{_LISTED_COLUMNS}{clause} ORDER BY seq DESC LIMIT ?", [*params, limit]
    ).fetchall()
    return rows[::-1]


def events_after(
    conn: Db,
    after: int,
    *,
    failed: bool = False,
    types: Sequence[str] | None = None,
    since: str | None = None,
) -> list[Any]:
    """The events stored after `seq` `after` that match, oldest first (as `list_events`)."""
    where, params = _filter(failed, types, since)
    where.append("seq > ?")
    query = f"{_LISTED_COLUMNS} WHERE {' AND '.join(where)} ORDER BY seq"
    return conn.execute(query, [*params, after]).fetchall()


def events_of(db: Db, transaction_id: str | None = None) -> list[dict[str, Any]]:
    """Stored events (without the body) in receive order, of one deposit when given."""
    sql = "SELECT seq, event_id, event_type, reference_id, transaction_id, received_at,"
    sql += " status, error FROM events"
    if transaction_id is None:
        return [dict(r) for r in db.execute(sql + " ORDER BY seq")]
    return [
        dict(r) for r in db.execute(sql + " WHERE transaction_id=? ORDER BY seq", [transaction_id])
    ]
