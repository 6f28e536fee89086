"""The actions table (the outbox): every statement on it, on the database the caller gives.

Each function runs inside the caller's transaction (`Store.write`/`Store.read` jobs).
"""

from __future__ import annotations

import sqlite3
from typing import Any

from worker.store.tx import Db

# --- reads and commands outside the outbox ---


def alert_with_trigger_queued(db: Db, transaction_id: str, trigger: str) -> bool:
    """Whether an alert about the deposit with this trigger was ever queued (in any status)."""
    row = db.execute(
        "SELECT 1 FROM actions WHERE transaction_id=? AND action='alert' AND trigger=?",
        [transaction_id, trigger],
    ).fetchone()
    return row is not None


def held_booking(db: Db, transaction_id: str) -> Any:
    """The first booking skipped as held by a conflict (trigger, rule_set, rule_set_version,
    rule, event_id), or None."""
    return db.execute(
        "SELECT trigger, rule_set, rule_set_version, rule, event_id FROM actions"
        " WHERE transaction_id=? AND action='book' AND status='skipped' AND outcome LIKE 'held:%'"
        " ORDER BY id LIMIT 1",
        [transaction_id],
    ).fetchone()


def set_rule(db: Db, action_id: int, rule_set: Any, rule_set_version: Any, rule: Any) -> None:
    """Record which rule set, version and rule an action row came from."""
    db.execute(
        "UPDATE actions SET rule_set=?, rule_set_version=?, rule=? WHERE id=?",
        [rule_set, rule_set_version, rule, action_id],
    )


def actions_of(db: Db, transaction_id: str) -> list[Any]:
    """Every action row of one deposit, in id order."""
    return db.execute(
        "SELECT * FROM actions WHERE transaction_id = ? ORDER BY id", [transaction_id]
    ).fetchall()


def all_actions(db: Db) -> list[Any]:
    """Every action row, in id order."""
    return db.execute("SELECT * FROM actions ORDER BY id").fetchall()


def failed_with_events(conn: sqlite3.Connection) -> list[Any]:
    """The failed actions with the type and receive time of their event, in id order."""
    return conn.execute(
        "SELECT a.*, e.event_type, e.received_at FROM actions a"
        " LEFT JOIN events e ON e.event_id = a.event_id"
        " WHERE a.status = 'failed' ORDER BY a.id"
    ).fetchall()


def requeue_failed_actions(conn: sqlite3.Connection, now: str) -> int:
    """Failed actions back to pending, due `now` (same idempotency keys); returns how many."""
    return int(
        conn.execute(
            # Submissions the provider refused for the profile (10000102/10000103) wait for a
            # changed profile instead: the same payload would be refused again.
            "UPDATE actions SET status='pending', next_attempt_at=?, updated_at=?"
            " WHERE status='failed' AND NOT (action='submit_profile' AND outcome LIKE 'profile %')",
            [now, now],
        ).rowcount
    )


def count_open(db: Db) -> int:
    """How many actions are pending or running."""
    row = db.execute(
        "SELECT COUNT(*) FROM actions WHERE status IN ('pending','running')"
    ).fetchone()
    return int(row[0])


def count_failed(db: Db) -> int:
    """How many actions failed."""
    return int(db.execute("SELECT COUNT(*) FROM actions WHERE status='failed'").fetchone()[0])


def count_due(db: Db, now: str) -> int:
    """How many actions run now or are due by `now`."""
    row = db.execute(
        "SELECT COUNT(*) FROM actions WHERE status='running'"
        " OR (status='pending' AND next_attempt_at <= ?)",
        [now],
    ).fetchone()
    return int(row[0])


def snapshot(db: Db) -> tuple[Any, ...]:
    """Figures that change whenever an action row does."""
    return tuple(db.execute("SELECT COUNT(*), MAX(updated_at) FROM actions").fetchone())
