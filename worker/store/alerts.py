"""The alerts table (what each channel was sent): every statement on it.

Each function runs inside the caller's transaction (`Store.write` jobs).
"""

from __future__ import annotations

import sqlite3
from typing import Any

from worker.store.tx import Db

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
