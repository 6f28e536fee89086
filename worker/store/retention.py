"""Retention of personal data (docs/audit.md, "Retention of personal data"): the payer values a
stored submission holds are removed once its deposit finished long enough ago.

A deposit is finished when its state is `completed` or `failed` (both final), from the moment
its order status became SUCCESS or FAIL (or it was released, for a blocked one); one a person
still has to decide (an open conflict, `depositd resolve`) is not. Each `purge_chunk` runs in
one write transaction: it looks at a bounded number of submissions still holding values,
removes those due (`body` NULL, `purged_at` set) and appends one PURGED journal entry naming
them as the transaction commits, so the entry commits with the rows it describes. The
payload's hash and its field names stay, in the row and in the SUBMITTED entry: what was sent
stays provable without the values.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from worker.clock import iso_from_ms, ms_from_iso, utc_now
from worker.store import journal
from worker.store.db import Db
from worker.store.meta import get_meta, set_meta
from worker.store.tx import conn_of

# The subject of every PURGED entry.
SUBJECT = "retention"
# The deposit states whose submissions may be purged: final ones (docs/concepts.md).
FINISHED = ("completed", "failed")
# meta key: the last run (JSON: ranAt, days, before, purged; lastPurgeAt once one purged any).
LAST_RUN = "personal_data_retention"

# The submissions still holding values, of finished deposits nobody has to decide, after an
# action id: at most `limit`, in action id order. Read along `submissions_unpurged` (CROSS JOIN
# keeps SQLite from starting at the deposits: every finished deposit, at each chunk).
_CANDIDATES = (
    "SELECT s.action_id, d.fact_time, d.updated_at FROM submissions s"
    " CROSS JOIN deposits d"
    " WHERE d.transaction_id = s.transaction_id AND s.purged_at IS NULL AND s.action_id > ?"
    " AND d.state IN ('completed', 'failed')"
    " AND NOT EXISTS (SELECT 1 FROM conflicts c"
    " WHERE c.transaction_id = s.transaction_id AND c.decided_at IS NULL)"
    " ORDER BY s.action_id LIMIT ?"
)


@dataclass(frozen=True)
class Chunk:
    """What one `purge_chunk` did: the action ids it purged, the last action id it looked at
    (the next chunk starts after it) and whether there may be more to look at."""

    purged: list[int]
    last: int
    more: bool


def finished_at(fact_time: Any, updated_at: Any) -> int:
    """When a finished deposit reached its state (epoch ms, this machine's clock when the fact
    was recorded): its order status becoming SUCCESS or FAIL, or its credit status changing
    after that (a blocked deposit released); its last change when neither time is recorded."""
    times = json.loads(fact_time) if isinstance(fact_time, str) and fact_time else fact_time
    if isinstance(times, Mapping):
        keys = ("status", "credit_status")
        known = [int(times[k]) for k in keys if isinstance(times.get(k), int)]
        if known:
            return max(known)
    return ms_from_iso(str(updated_at))


def cutoff(now_ms: int, days: int) -> str:
    """The time before which a deposit finished has its submissions purged."""
    return iso_from_ms(now_ms - days * 86_400_000)


def purge_chunk(db: Db, *, before: str, days: int, after: int = 0, limit: int = 500) -> Chunk:
    """In the caller's write transaction: of at most `limit` submissions still holding values
    (action id above `after`), remove the values of those whose deposit finished before
    `before`, and append one PURGED entry naming them (none when none is due)."""
    conn = conn_of(db)
    rows = conn.execute(_CANDIDATES, [after, limit]).fetchall()
    if not rows:
        return Chunk([], after, False)
    limit_ms = ms_from_iso(before)
    due = [int(r[0]) for r in rows if finished_at(r[1], r[2]) < limit_ms]
    last, more = int(rows[-1][0]), len(rows) == limit
    if not due:
        return Chunk([], last, more)
    marks = ",".join("?" for _ in due)
    # Only rows no one purged meanwhile (another instance, on PostgreSQL): the entry names
    # exactly the rows this transaction changed. On SQLite the values are overwritten with
    # zeros in the file (`worker.store.sqlite.connect`).
    purged = sorted(
        {
            int(r[0])
            for r in conn.execute(
                f"UPDATE submissions SET body = NULL, purged_at = ?"
                f" WHERE action_id IN ({marks}) AND purged_at IS NULL RETURNING action_id",
                [utc_now(), *due],
            ).fetchall()
        }  # an action that sent two payloads (retried after a correction) is named once
    )
    if purged:
        # Appended as the transaction commits, like every decision of the running service
        # (docs/audit.md, "When an entry is written").
        body = {"action_ids": purged, "before": before, "days": days}
        journal.append_at_commit(db, journal.PURGED, SUBJECT, body)
    return Chunk(purged, last, more)


def entries_naming(db: Db, after: int, action_ids: Collection[int]) -> list[int]:
    """The seqs of the PURGED entries after seq `after` naming only these action ids (what one
    run appended)."""
    ids = set(action_ids)
    return [
        e.seq
        for e in journal.entries(db, after=after)
        if e.kind == journal.PURGED and e.subject == SUBJECT and set(e.body["action_ids"]) <= ids
    ]


def record_run(db: Db, *, ran_at: str, days: int, before: str, purged: int) -> None:
    """Keep what the last run did for `depositd status` (`LAST_RUN`)."""
    last = json.loads(get_meta(db, LAST_RUN) or "{}")
    record: dict[str, Any] = {"ranAt": ran_at, "days": days, "before": before, "purged": purged}
    if purged:
        record["lastPurgeAt"], record["lastPurged"] = ran_at, purged
    elif last.get("lastPurgeAt"):
        record["lastPurgeAt"], record["lastPurged"] = last["lastPurgeAt"], last.get("lastPurged")
    set_meta(db, LAST_RUN, json.dumps(record, sort_keys=True))


def last_run(meta: Mapping[str, Any]) -> dict[str, Any] | None:
    """The last run as `record_run` kept it, from the meta rows; None before the first."""
    raw = meta.get(LAST_RUN)
    return json.loads(raw) if raw else None
