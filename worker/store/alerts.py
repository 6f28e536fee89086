"""The alerts table (what each channel was sent): every statement on it.

Each function runs inside the caller's transaction (`Store.write` jobs).
"""

from __future__ import annotations

import sqlite_utils

from worker.clock import utc_now


def claim_alert(
    db: sqlite_utils.Database,
    dedupe_key: str,
    *,
    transaction_id: str,
    condition: str,
    severity: str,
    channel: str,
) -> str:
    """Add the channel's alert row unless it exists; its status (`sent`: already taken)."""
    db.execute(
        "INSERT OR IGNORE INTO alerts (dedupe_key, transaction_id, condition, severity,"
        " channel, status, attempts, created_at) VALUES (?,?,?,?,?, 'pending', 0, ?)",
        [dedupe_key, transaction_id, condition, severity, channel, utc_now()],
    )
    return str(
        db.execute("SELECT status FROM alerts WHERE dedupe_key=?", [dedupe_key]).fetchone()[0]
    )


def record_send(
    db: sqlite_utils.Database, dedupe_key: str, *, status: str, error: str | None
) -> None:
    """Record one send to a channel: its status, one more attempt, the error or the time sent."""
    db.execute(
        "UPDATE alerts SET status=?, attempts=attempts+1, last_error=?, sent_at=?"
        " WHERE dedupe_key=?",
        [status, error, None if error is not None else utc_now(), dedupe_key],
    )


# --- reads and commands outside the outbox ---
