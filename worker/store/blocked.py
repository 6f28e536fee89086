"""Reads of the `deposits` table for the watch on BLOCKED deposits (support may release them)."""

from __future__ import annotations

import json

import sqlite_utils

from worker.clock import ms_from_iso


def blocked_since(db: sqlite_utils.Database) -> list[tuple[str, int]]:
    """Every blocked deposit and the provider's time (epoch ms) of the fact that blocked it
    (the deposit's last update when no such time is recorded), oldest first."""
    out: list[tuple[str, int]] = []
    for tx, times, updated_at in db.execute(
        "SELECT transaction_id, fact_time, updated_at FROM deposits WHERE state = 'blocked'"
        " ORDER BY updated_at, transaction_id"
    ).fetchall():
        known = json.loads(times) if isinstance(times, str) and times else {}
        since = known.get("credit_status") if isinstance(known, dict) else None
        out.append((str(tx), int(since) if since is not None else ms_from_iso(updated_at)))
    return out
