"""`depositd events --type T --since ISO --limit N --follow`: which stored events to print."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from worker.store.db import Connection
from worker.store.events import events_after, list_events

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


def _filter(args: argparse.Namespace) -> dict[str, Any]:
    """The event filter of --failed, --type and --since (ValueError for an unusable --since)."""
    since = getattr(args, "since", None)
    types: Sequence[str] | None = getattr(args, "type", None)
    return {
        "failed": bool(getattr(args, "failed", False)),
        "types": types,
        "since": None if since is None else parse_time(since, what="--since"),
    }


def select_events(conn: Connection, args: argparse.Namespace) -> list[Any]:
    """The events to print first, oldest first (`--limit N`: the newest N of them)."""
    return list_events(conn, **_filter(args), limit=getattr(args, "limit", None))


def follow(
    conn: Connection,
    args: argparse.Namespace,
    after: int,
    emit: Callable[[Any], None],
) -> int:
    """Print events stored after `seq` `after`, checking every second, until interrupted."""
    selected = _filter(args)
    try:
        while True:
            for row in events_after(conn, after, **selected):
                emit(row)
                after = row["seq"]
            time.sleep(FOLLOW_EVERY_S)
    except KeyboardInterrupt:
        return 0
