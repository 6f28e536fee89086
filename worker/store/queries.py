"""Synchronous helpers on depositd's tables, for `Store.write`/`Store.read` jobs and the CLI.

Each works on the `sqlite_utils.Database` it is given, inside the caller's transaction.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlite_utils

from worker.clock import utc_now

EVENT_STATUSES = ("pending", "processed", "ignored", "failed")


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
    rows = db.conn.execute(
        "SELECT seq, event_id, event_type, reference_id, transaction_id, body, received_at,"
        " status, error FROM events WHERE status = 'pending' ORDER BY seq LIMIT ?",
        (limit,),
    ).fetchall()
    # Positional construction: this runs once per processed event.
    return [StoredEvent(r[0], r[1], r[2], r[3], r[4], bytes(r[5]), r[6], r[7], r[8]) for r in rows]


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


def mark_events(db: sqlite_utils.Database, marks: Sequence[tuple[int, str, str | None]]) -> None:
    """Mark many events at once: (seq, status, error) each, one processed_at for all."""
    for _, status, _ in marks:
        if status not in EVENT_STATUSES or status == "pending":
            raise ValueError(f"cannot mark an event {status!r}")
    now = utc_now()
    db.conn.executemany(
        "UPDATE events SET status = ?, error = ?, processed_at = ? WHERE seq = ?",
        [(status, error, now, seq) for seq, status, error in marks],
    )


def get_deposit_row(db: sqlite_utils.Database, transaction_id: str) -> dict[str, Any] | None:
    """The `deposits` row of a transaction, or None."""
    row = db.conn.execute(
        "SELECT * FROM deposits WHERE transaction_id = ?", (transaction_id,)
    ).fetchone()
    return None if row is None else _as_dict(row)


def upsert_deposit_row(db: sqlite_utils.Database, row: Mapping[str, Any]) -> None:
    """Insert or update a `deposits` row (keyed by transaction_id)."""
    columns = tuple(row)
    db.conn.execute(_upsert_deposit_sql(columns), [row[c] for c in columns])


@functools.lru_cache(maxsize=16)
def _upsert_deposit_sql(columns: tuple[str, ...]) -> str:
    updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c != "transaction_id")
    return (
        f"INSERT INTO deposits ({', '.join(columns)})"
        f" VALUES ({', '.join('?' for _ in columns)})"
        f" ON CONFLICT (transaction_id) DO UPDATE SET {updates}"
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


def poll_fact_repeats(
    db: sqlite_utils.Database, transaction_id: str, fact: Mapping[str, Any]
) -> bool:
    """Whether a poll fact saying exactly `fact` is recorded for the deposit since (and with) the
    last fact that changed it (history and detail polls alternate, each repeating itself)."""
    row = db.conn.execute(
        "SELECT 1 FROM facts WHERE transaction_id = ? AND source = 'poll' AND fact = ?"
        " AND id >= (SELECT COALESCE(MAX(id), 0) FROM facts"
        " WHERE transaction_id = ? AND changed = 1) LIMIT 1",
        (transaction_id, json.dumps(fact, sort_keys=True), transaction_id),
    ).fetchone()
    return row is not None


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
