"""The `facts` table: every fact observed about a deposit (webhook, poll), applied or not."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from worker.clock import utc_now
from worker.store.db import Database, Db
from worker.store.pg import InsertRows
from worker.store.tx import insert_rows

_INSERT_FACT = InsertRows(
    "INSERT INTO facts (transaction_id, source, event_id, observed_at, fact, changed,"
    " recorded_at) VALUES ",
    "(?, ?, ?, ?, ?, ?, ?)",
)

# One facts row as `_INSERT_FACT` takes it; built by `fact_row`.
FactRow = tuple[str, str, str | None, int | None, str, int, str]


def fact_row(
    *,
    transaction_id: str,
    source: str,
    event_id: str | None,
    observed_at: int | None,
    fact: Mapping[str, Any] | str,
    changed: bool,
) -> FactRow:
    """The row of one fact, recorded now (`fact` as a dict, or as `fact_text` made it)."""
    text = fact if isinstance(fact, str) else fact_text(fact)
    return (transaction_id, source, event_id, observed_at, text, int(changed), utc_now())


def insert_fact_rows(db: Db, rows: Sequence[FactRow]) -> None:
    """Record many facts (`fact_row` rows), in the order given."""
    insert_rows(db, _INSERT_FACT, rows)


# json.dumps(..., sort_keys=True) builds a new encoder at every call: this one is built once.
_SORTED_JSON = json.JSONEncoder(sort_keys=True)


def fact_text(fact: Mapping[str, Any]) -> str:
    """A fact as the `facts` table stores it (JSON, sorted keys)."""
    return _SORTED_JSON.encode(fact)


def poll_fact_repeats(db: Database, transaction_id: str, fact: Mapping[str, Any] | str) -> bool:
    """Whether a poll fact saying exactly `fact` is recorded for the deposit since (and with) the
    last fact that changed it (history and detail polls alternate, each repeating itself)."""
    row = db.conn.execute(
        "SELECT 1 FROM facts WHERE transaction_id = ? AND source = 'poll' AND fact = ?"
        " AND id >= (SELECT COALESCE(MAX(id), 0) FROM facts"
        " WHERE transaction_id = ? AND changed = 1) LIMIT 1",
        (transaction_id, fact if isinstance(fact, str) else fact_text(fact), transaction_id),
    ).fetchone()
    return row is not None


def delete_unchanged_before(db: Db, cutoff: str) -> int:
    """Delete the facts recorded before `cutoff` that changed nothing; returns how many."""
    cur = db.execute("DELETE FROM facts WHERE changed = 0 AND recorded_at < ?", [cutoff])
    return int(cur.rowcount)


def facts_of(db: Db, transaction_id: str) -> list[Any]:
    """Every fact row of one deposit, in recorded order."""
    return db.execute(
        "SELECT * FROM facts WHERE transaction_id = ? ORDER BY id", [transaction_id]
    ).fetchall()


def fact_history(conn: Db, transaction_id: str) -> list[Any]:
    """The recorded facts (JSON) of one deposit with their eventIds, in recorded order."""
    return conn.execute(
        "SELECT fact, event_id, observed_at FROM facts WHERE transaction_id = ? ORDER BY id",
        [transaction_id],
    ).fetchall()


def sources_and_facts(db: Db, transaction_id: str) -> list[dict[str, Any]]:
    """Source and fact (JSON) of each recorded fact of one deposit, in recorded order."""
    return [
        dict(r)
        for r in db.execute(
            "SELECT source, fact, observed_at FROM facts WHERE transaction_id=? ORDER BY id",
            [transaction_id],
        )
    ]


def count_blocked_polls(db: Db, transaction_id: str) -> int:
    """How many poll facts of one deposit said BLOCKED."""
    row = db.execute(
        "SELECT COUNT(*) FROM facts WHERE transaction_id=? AND source='poll'"
        " AND fact LIKE '%BLOCKED%'",
        [transaction_id],
    ).fetchone()
    return int(row[0])


def snapshot(db: Db) -> tuple[Any, ...]:
    """Figures that change whenever a fact that changed a deposit is recorded."""
    return tuple(db.execute("SELECT COUNT(*) FROM facts WHERE changed=1").fetchone())
