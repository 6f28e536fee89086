"""The operator_actions table (what operators did in the console and `depositd submit`):
every statement on it.

Each function runs inside the caller's transaction (`Store.write` jobs) or on a reader.
"""

from __future__ import annotations

from typing import Any

from worker.clock import utc_now
from worker.store import journal
from worker.store.db import Db


def record(db: Db, kind: str, subject: str, *, note: str, outcome: str, remote: str | None) -> int:
    """Record one operator action with its time and note, and its OPERATOR journal entry in
    the same transaction (docs/audit.md); its id."""
    (action_id,) = db.execute(
        "INSERT INTO operator_actions (at, kind, subject, note, outcome, remote)"
        " VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
        [utc_now(), kind, subject, note, outcome, remote],
    ).fetchone()
    body = {"action": kind, "by": remote, "note": note, "outcome": outcome}
    journal.append_at_commit(db, journal.OPERATOR, subject, body)
    return int(action_id)


def recent(db: Db, *, subject: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
    """The latest operator actions, newest first, about one subject when given."""
    if subject is None:
        rows = db.execute("SELECT * FROM operator_actions ORDER BY id DESC LIMIT ?", [limit])
    else:
        rows = db.execute(
            "SELECT * FROM operator_actions WHERE subject=? ORDER BY id DESC LIMIT ?",
            [subject, limit],
        )
    return [dict(r) for r in rows]
