"""The `waits` table: deposits waiting on a person, one row per wait (docs/rules.md, "Deadlines").

A wait starts (`started_at`, this machine's clock in epoch ms) when a deposit comes to wait on a
person: it needs payer details and depositd submits nothing by itself (`needs_details`), the
provider rejected the details sent (`rejected`), it is BLOCKED (`blocked`), or its booking is
held for a decision (`held`: a fixed field in conflict, a likely duplicate). It ends
(`ended_at`) once the deposit no longer waits for that reason; `escalated_at` records the one
alert past the deadline. Each function runs inside the caller's transaction.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from worker.store.database import has_table
from worker.store.db import Db
from worker.store.tx import conn_of

# What a deposit waits on (the tracked state it waits in, and a booking held for a decision).
REASONS = ("needs_details", "rejected", "blocked", "held")
HELD = "held"

# Whether the wait `w` (joined with its deposit `d`) still holds: the deposit is still in the
# state it waits in, or (held) a conflict of it is still undecided. One text for every query.
_WAITING = (
    "((w.reason = 'held' AND EXISTS (SELECT 1 FROM conflicts c"
    " WHERE c.transaction_id = w.transaction_id AND c.decided_at IS NULL))"
    " OR (w.reason <> 'held' AND COALESCE(d.state, '') = w.reason))"
)
_COLUMNS = (
    "w.id, w.transaction_id, w.reason, w.started_at, w.severity, w.channels, w.escalated_at,"
    " d.wallet_id, d.wallet_name"
)


@dataclass(frozen=True)
class Wait:
    """One open wait, with the wallet of its deposit (which rule set's deadline applies)."""

    id: int
    transaction_id: str
    reason: str
    started_at: int
    severity: str
    channels: tuple[str, ...] | None
    escalated_at: int | None
    wallet_id: int | None
    wallet_name: str | None

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> Wait:
        """A wait from a row of `_COLUMNS`."""
        channels = json.loads(row[5]) if row[5] else None
        return cls(
            id=int(row[0]),
            transaction_id=str(row[1]),
            reason=str(row[2]),
            started_at=int(row[3]),
            severity=str(row[4]),
            channels=tuple(channels) if channels else None,
            escalated_at=None if row[6] is None else int(row[6]),
            wallet_id=None if row[7] is None else int(row[7]),
            wallet_name=row[8],
        )


def start_wait(
    db: Db,
    transaction_id: str,
    reason: str,
    *,
    now: int,
    severity: str,
    channels: Sequence[str] | None,
    again: bool,
) -> bool:
    """Record that the deposit starts to wait for `reason`, announced by an alert of
    `severity` to `channels` (None: every configured one). A wait of that reason still open
    is ended first when `again` (a new rejection is a new wait), else kept (a second conflict
    while held waits on the same decision). True when a wait was started."""
    if again:
        end_waits(db, transaction_id, reason, now=now)
    elif open_wait_of(db, transaction_id, reason):
        return False
    conn_of(db).execute(
        "INSERT INTO waits (transaction_id, reason, started_at, severity, channels)"
        " VALUES (?, ?, ?, ?, ?)",
        [transaction_id, reason, now, severity, json.dumps(list(channels)) if channels else None],
    )
    return True


def open_wait_of(db: Db, transaction_id: str, reason: str) -> bool:
    """Whether the deposit has an open wait for `reason`."""
    row = (
        conn_of(db)
        .execute(
            "SELECT 1 FROM waits WHERE transaction_id = ? AND reason = ? AND ended_at IS NULL",
            [transaction_id, reason],
        )
        .fetchone()
    )
    return row is not None


def end_waits(db: Db, transaction_id: str, reason: str, *, now: int) -> None:
    """End the deposit's open waits for `reason` (it no longer waits for it)."""
    conn_of(db).execute(
        "UPDATE waits SET ended_at = ? WHERE transaction_id = ? AND reason = ?"
        " AND ended_at IS NULL",
        [now, transaction_id, reason],
    )


def due_candidates(db: Db, *, started_by: int) -> list[Wait]:
    """Open waits not escalated yet that started at `started_by` or before, oldest first:
    those the shortest deadline may have passed for (an index of the open waits, never a scan
    of the deposits)."""
    rows = (
        conn_of(db)
        .execute(
            f"SELECT {_COLUMNS} FROM waits w LEFT JOIN deposits d"
            " ON d.transaction_id = w.transaction_id"
            " WHERE w.ended_at IS NULL AND w.escalated_at IS NULL AND w.started_at <= ?"
            " ORDER BY w.started_at, w.id",
            [started_by],
        )
        .fetchall()
    )
    return [Wait.from_row(r) for r in rows]


def over(db: Db, *, limit: int) -> list[int]:
    """The ids of open waits whose deposit no longer waits for their reason."""
    rows = (
        conn_of(db)
        .execute(
            "SELECT w.id FROM waits w LEFT JOIN deposits d ON d.transaction_id = w.transaction_id"
            # In the order of `waits_open`: a walk of the open waits alone.
            f" WHERE w.ended_at IS NULL AND NOT {_WAITING} ORDER BY w.started_at, w.id LIMIT ?",
            [limit],
        )
        .fetchall()
    )
    return [int(r[0]) for r in rows]


def still_waiting(db: Db, wait_id: int) -> bool:
    """Whether the open wait `wait_id` still holds (read inside the write that acts on it)."""
    row = (
        conn_of(db)
        .execute(
            "SELECT 1 FROM waits w LEFT JOIN deposits d ON d.transaction_id = w.transaction_id"
            f" WHERE w.id = ? AND w.ended_at IS NULL AND {_WAITING}",
            [wait_id],
        )
        .fetchone()
    )
    return row is not None


def end_wait(db: Db, wait_id: int, *, now: int) -> bool:
    """End one wait; False when it had ended already."""
    cursor = conn_of(db).execute(
        "UPDATE waits SET ended_at = ? WHERE id = ? AND ended_at IS NULL", [now, wait_id]
    )
    return bool(cursor.rowcount)


def mark_escalated(db: Db, wait_id: int, *, now: int) -> bool:
    """Record the alert past the deadline of an open wait; False when it was recorded already
    (or the wait ended), so each wait is escalated once."""
    cursor = conn_of(db).execute(
        "UPDATE waits SET escalated_at = ? WHERE id = ? AND escalated_at IS NULL"
        " AND ended_at IS NULL",
        [now, wait_id],
    )
    return bool(cursor.rowcount)


def open_waits_of(db: Db, transaction_ids: Sequence[str]) -> dict[str, list[Wait]]:
    """The open waits of these deposits, by transactionId (oldest first)."""
    ids = list(dict.fromkeys(transaction_ids))
    found: dict[str, list[Wait]] = {}
    conn = conn_of(db)
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        marks = ",".join("?" * len(chunk))
        for row in conn.execute(
            f"SELECT {_COLUMNS} FROM waits w LEFT JOIN deposits d"
            " ON d.transaction_id = w.transaction_id"
            f" WHERE w.ended_at IS NULL AND w.transaction_id IN ({marks})"
            " ORDER BY w.started_at, w.id",
            chunk,
        ).fetchall():
            wait = Wait.from_row(row)
            found.setdefault(wait.transaction_id, []).append(wait)
    return found


def count_overdue(db: Db) -> int:
    """How many waits are past their deadline (alerted again) and still open (none before the
    table exists)."""
    if not has_table(db, "waits"):
        return 0
    row = db.execute(
        "SELECT COUNT(*) FROM waits WHERE ended_at IS NULL AND escalated_at IS NOT NULL"
        " AND started_at >= 0"  # the open waits alone, through `waits_open`
    ).fetchone()
    return int(row[0])
