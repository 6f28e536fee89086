"""The alerts table (what each channel was sent): every statement on it.

Each function runs inside the caller's transaction (`Store.write` jobs).
"""

from __future__ import annotations

import sqlite3
from typing import Any

import sqlite_utils

from worker.clock import utc_now
from worker.store.tx import Db


def claim_alert(
    db: sqlite_utils.Database,
    dedupe_key: str,
    *,
    transaction_id: str,
    condition: str,
    severity: str,
    channel: str,
    instance: str = "",
    now: str | None = None,
    until: str | None = None,
) -> bool:
    """Add the channel's alert row unless it exists, and claim it for `instance` until
    `until`: False when it was sent already, or another instance is sending it (its claim not
    lapsed), so that several instances send each (deposit, trigger, rule, channel) once."""
    now = now or utc_now()
    db.execute(
        "INSERT INTO alerts (dedupe_key, transaction_id, condition, severity,"
        " channel, status, attempts, created_at) VALUES (?,?,?,?,?, 'pending', 0, ?)"
        " ON CONFLICT (dedupe_key) DO NOTHING",
        [dedupe_key, transaction_id, condition, severity, channel, now],
    )
    cur = db.execute(
        "UPDATE alerts SET claimed_by=?, lease_until=? WHERE dedupe_key=? AND status != 'sent'"
        " AND (lease_until IS NULL OR lease_until < ? OR claimed_by = ?)",
        [instance, until or now, dedupe_key, now, instance],
    )
    return int(cur.rowcount) == 1


def record_send(
    db: sqlite_utils.Database, dedupe_key: str, *, status: str, error: str | None
) -> None:
    """Record one send to a channel: its status, one more attempt, the error or the time sent;
    the claim ends."""
    db.execute(
        "UPDATE alerts SET status=?, attempts=attempts+1, last_error=?, sent_at=?,"
        " lease_until=NULL WHERE dedupe_key=?",
        [status, error, None if error is not None else utc_now(), dedupe_key],
    )


def release_claims(db: Db) -> int:
    """Let any instance send every claimed alert at once (the only instance starting)."""
    cur = db.execute("UPDATE alerts SET lease_until=NULL WHERE lease_until IS NOT NULL")
    return int(cur.rowcount)


# --- reads and commands outside the outbox ---


def failed_alerts(conn: sqlite3.Connection) -> list[Any]:
    """The alerts that could not be sent, in id order."""
    return conn.execute("SELECT * FROM alerts WHERE status = 'failed' ORDER BY id").fetchall()


def requeue_failed_alerts(conn: sqlite3.Connection) -> None:
    """Alerts that could not be sent back to pending."""
    conn.execute("UPDATE alerts SET status='pending' WHERE status='failed'")


def count_failed(db: Db) -> int:
    """How many alerts could not be sent."""
    return int(db.execute("SELECT COUNT(*) FROM alerts WHERE status='failed'").fetchone()[0])


def snapshot(db: Db) -> tuple[Any, ...]:
    """Figures that change whenever an alert is queued or sent."""
    return tuple(db.execute("SELECT COUNT(*), SUM(status='sent') FROM alerts").fetchone())
