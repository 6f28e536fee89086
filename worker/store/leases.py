"""The leases table: named leases held by one instance until a time (the scheduler's leader).

Acquiring and renewing are one statement (an upsert whose update applies only when the caller
holds the lease already or it has expired), so two instances racing for a lease cannot both win,
on SQLite and on PostgreSQL alike. Times are ISO 8601 UTC strings from `worker.clock`: the
instances are assumed to agree on the time within a small skew (NTP), well under a lease.
"""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass
from typing import Any

from worker.store.db import Db


def default_instance_id() -> str:
    """`<hostname>:<pid>:<random>`: unique per process, readable in `status` and logs."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


@dataclass(frozen=True)
class Lease:
    """Who holds a lease, since when and until when (ISO 8601 UTC)."""

    name: str
    holder: str
    acquired_at: str
    expires_at: str

    def as_json(self) -> dict[str, Any]:
        """For `status --json`."""
        return {
            "holder": self.holder,
            "since": self.acquired_at,
            "expires": self.expires_at,
        }


def acquire(db: Db, name: str, holder: str, *, now: str, until: str) -> Lease:
    """Take the lease `name` for `holder` until `until` if it is free, expired at `now` or
    held by `holder` already (renewed: its acquired time stays); returns who holds it now."""
    db.execute(
        "INSERT INTO leases (name, holder, expires_at, acquired_at) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (name) DO UPDATE SET holder = excluded.holder,"
        " expires_at = excluded.expires_at,"
        " acquired_at = CASE WHEN leases.holder = excluded.holder THEN leases.acquired_at"
        " ELSE excluded.acquired_at END"
        " WHERE leases.holder = excluded.holder OR leases.expires_at < ?",
        [name, holder, until, now, now],
    )
    found = get_lease(db, name)
    assert found is not None  # inserted or kept by the statement above
    return found


def release(db: Db, name: str, holder: str) -> bool:
    """Give the lease up (a clean stop: another instance takes it at once); False when
    `holder` did not hold it."""
    cur = db.execute("DELETE FROM leases WHERE name = ? AND holder = ?", [name, holder])
    return int(cur.rowcount) == 1


def get_lease(db: Db, name: str) -> Lease | None:
    """The lease `name` as recorded (possibly expired), or None."""
    row = db.execute(
        "SELECT name, holder, acquired_at, expires_at FROM leases WHERE name = ?", [name]
    ).fetchone()
    return None if row is None else Lease(str(row[0]), str(row[1]), str(row[2]), str(row[3]))


# The lease of the instance that runs the scheduler's jobs (`worker.schedule.leader`).
SCHEDULER_LEASE = "scheduler"


def clear_leases(db: Db) -> None:
    """Forget every lease (the only instance starting: whoever held them is gone)."""
    db.execute("DELETE FROM leases")
