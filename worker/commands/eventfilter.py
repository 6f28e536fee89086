"""`depositd events --type T --since ISO --limit N --follow`: which stored events to print."""

from __future__ import annotations

import argparse
import sqlite3
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

EVENT_COLUMNS = (
    "SELECT seq, event_id, event_type, reference_id, transaction_id, received_at, status,"
    " processed_at, error FROM events"
)
FOLLOW_EVERY_S = 1.0


def parse_time(value: str, *, what: str) -> str:
    """An ISO 8601 time as the stored format (UTC, milliseconds, Z); ValueError if unusable."""
    if not value.strip():
        raise ValueError(f"is empty (leave {what} out for no limit)")
    try:
        moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError("is not an ISO 8601 time, e.g. 2026-01-31T12:00:00Z") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    try:
        utc = moment.astimezone(UTC)
    except OverflowError:  # e.g. 0001-01-01T00:00:00+01:00 is in year 0 in UTC
        raise ValueError("is out of range once converted to UTC") from None
    return utc.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def event_filter(args: argparse.Namespace) -> tuple[list[str], list[Any]]:
    """SQL conditions and their parameters for --failed, --type and --since."""
    where: list[str] = []
    params: list[Any] = []
    if getattr(args, "failed", False):
        where.append("status = 'failed'")
    types: Sequence[str] | None = getattr(args, "type", None)
    if types:
        where.append(f"event_type IN ({', '.join('?' for _ in types)})")
        params.extend(types)
    since = getattr(args, "since", None)
    if since is not None:
        where.append("received_at >= ?")
        params.append(parse_time(since, what="--since"))
    return where, params


def select_events(conn: sqlite3.Connection, args: argparse.Namespace) -> list[Any]:
    """The events to print first, oldest first (`--limit N`: the newest N of them)."""
    where, params = event_filter(args)
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    limit = getattr(args, "limit", None)
    if limit is None:
        return conn.execute(f"{EVENT_COLUMNS}{clause} ORDER BY seq", params).fetchall()
    rows = conn.execute(
        f"{EVENT_COLUMNS}{clause} ORDER BY seq DESC LIMIT ?", [*params, limit]
    ).fetchall()
    return rows[::-1]


def follow(
    conn: sqlite3.Connection,
    args: argparse.Namespace,
    after: int,
    emit: Callable[[Any], None],
) -> int:
    """Print events stored after `seq` `after`, checking every second, until interrupted."""
    where, params = event_filter(args)
    where.append("seq > ?")
    query = f"{EVENT_COLUMNS} WHERE {' AND '.join(where)} ORDER BY seq"
    try:
        while True:
            for row in conn.execute(query, [*params, after]).fetchall():
                emit(row)
                after = row["seq"]
            time.sleep(FOLLOW_EVERY_S)
    except KeyboardInterrupt:
        return 0
