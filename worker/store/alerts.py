"""The alerts table (what each channel was sent): every statement on it.

Each function runs inside the caller's transaction (`Store.write` jobs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from worker.clock import utc_now
from worker.store.db import Db


def claim_alert(
    db: Db,
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


def renew_alert_claims(db: Db, dedupe_keys: Sequence[str], instance: str, until: str) -> int:
    """Extend `instance`'s claims on these channels' rows (a send still in flight); returns
    how many it still holds."""
    held = 0
    for key in dedupe_keys:
        cur = db.execute(
            "UPDATE alerts SET lease_until=? WHERE dedupe_key=? AND claimed_by=?"
            " AND lease_until IS NOT NULL AND status != 'sent'",
            [until, key, instance],
        )
        held += int(cur.rowcount)
    return held


def record_send(
    db: Db,
    dedupe_key: str,
    *,
    status: str,
    error: str | None,
    instance: str = "",
) -> bool:
    """Record one send to a channel: its status, one more attempt, the error or the time sent;
    the claim ends. Only while `instance` holds the channel's claim: False (nothing written)
    when another instance took it over, which then sends and records it itself."""
    cur = db.execute(
        "UPDATE alerts SET status=?, attempts=attempts+1, last_error=?, sent_at=?,"
        " lease_until=NULL WHERE dedupe_key=? AND claimed_by=?",
        [status, error, None if error is not None else utc_now(), dedupe_key, instance],
    )
    return int(cur.rowcount) == 1


def release_claims(db: Db) -> int:
    """Let any instance send every claimed alert at once (the only instance starting)."""
    cur = db.execute("UPDATE alerts SET lease_until=NULL WHERE lease_until IS NOT NULL")
    return int(cur.rowcount)


# --- reads and commands outside the outbox ---


def failed_alerts(conn: Db) -> list[Any]:
    """The alerts that could not be sent, in id order."""
    return conn.execute("SELECT * FROM alerts WHERE status = 'failed' ORDER BY id").fetchall()


def requeue_failed_alerts(conn: Db) -> None:
    """Alerts that could not be sent back to pending."""
    conn.execute("UPDATE alerts SET status='pending' WHERE status='failed'")


def get_alert(db: Db, alert_id: int) -> dict[str, Any] | None:
    """One alert row (one channel) by id."""
    row = db.execute("SELECT * FROM alerts WHERE id=?", [alert_id]).fetchone()
    return None if row is None else dict(row)


def requeue_alert(db: Db, alert_id: int) -> bool:
    """One failed alert row back to pending; False when it is not failed."""
    cur = db.execute(
        "UPDATE alerts SET status='pending' WHERE id=? AND status='failed'", [alert_id]
    )
    return cur.rowcount == 1


def alerts_of(db: Db, transaction_id: str) -> list[dict[str, Any]]:
    """Every channel's alert row of one deposit, in id order."""
    rows = db.execute("SELECT * FROM alerts WHERE transaction_id=? ORDER BY id", [transaction_id])
    return [dict(r) for r in rows]


def count_failed(db: Db) -> int:
    """How many alerts could not be sent."""
    return int(db.execute("SELECT COUNT(*) FROM alerts WHERE status='failed'").fetchone()[0])


def snapshot(db: Db) -> tuple[Any, ...]:
    """Figures that change whenever an alert is queued or sent."""
    return tuple(
        db.execute(
            "SELECT COUNT(*), SUM(CASE WHEN status='sent' THEN 1 ELSE 0 END) FROM alerts"
        ).fetchone()
    )
