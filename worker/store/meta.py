"""The `meta` table: the service's own records (schema version, start and stop, last polls)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from worker.store.db import Db
from worker.store.pg import is_postgres

# The long-running tasks of `serve` down, by instance (JSON; `worker.service.supervise`).
TASKS_DOWN = "tasks_down"
# When the store's schema was first created (ISO 8601 UTC); absent in stores created before
# it was recorded. A daily job's start-up catch-up asks it (`worker.schedule.jobs.missed_run`).
CREATED_AT = "created_at"


def get_meta(db: Db, key: str) -> str | None:
    """A value of the `meta` table."""
    row = db.execute("SELECT value FROM meta WHERE key = ?", [key]).fetchone()
    return None if row is None else str(row[0])


def set_meta(db: Db, key: str, value: str) -> None:
    """Set a value of the `meta` table."""
    db.execute(
        "INSERT INTO meta (key, value) VALUES (?, ?)"
        " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        [key, value],
    )


def set_meta_unless_busy(db: Db, key: str, value: str) -> bool:
    """Set a value that any instance may set to much the same value at any time (the last
    webhook's time): on PostgreSQL it is skipped while another instance's open transaction is
    setting it, instead of waiting for that transaction's row lock (which would make the
    instances' group commits wait for each other). False when skipped."""
    if is_postgres(db):
        row = db.execute("SELECT pg_try_advisory_xact_lock(hashtext(?))", [f"meta:{key}"])
        if not row.fetchone()[0]:
            return False
    set_meta(db, key, value)
    return True


def existed_at(db: Db, moment: str) -> bool:
    """Whether the store was there at `moment` (ISO 8601 UTC): created before it, or created
    before its creation time was recorded."""
    created = get_meta(db, CREATED_AT)
    return created is None or created <= moment


def all_meta(conn: Db) -> dict[str, str]:
    """Every key of the `meta` table with its value."""
    return {r["key"]: r["value"] for r in conn.execute("SELECT key, value FROM meta")}


def probe(db: Db) -> None:
    """Read one row: raises when the database does not answer a read."""
    db.execute("SELECT 1 FROM meta LIMIT 1").fetchall()


# Webhook deliveries refused in a row for their signature or API key, none accepted since
# (worker.ingest.secret_watch writes it; `status` and the console show it).
WEBHOOK_AUTH_REFUSED = "webhook_auth_refused"


def auth_refusal_streak(meta: Mapping[str, Any]) -> dict[str, Any] | None:
    """The stored streak (`refused`, `since`, `alertedAt`) from the meta rows, or None."""
    raw = meta.get(WEBHOOK_AUTH_REFUSED)
    if not raw:
        return None
    value: dict[str, Any] = json.loads(raw)
    return value
