"""What `worker.dev.harness.Stack.settle` reads of the worker's database: the work still queued,
and a snapshot of every table that must stop changing before the stack counts as settled."""

from __future__ import annotations

from typing import Any

from worker.clock import utc_now
from worker.store import actions, addresses, alerts, deposits, events, facts, ledger


def queue_counts(db: Any) -> dict[str, int]:
    """Events not yet processed and actions due now."""
    now = utc_now()
    return {"pendingEvents": events.count_pending(db), "dueActions": actions.count_due(db, now)}


def db_snapshot(db: Any) -> tuple[Any, ...]:
    """The state of every table, to compare between two reads."""
    # Poll facts that change nothing are left out: the polls add them all the time.
    return (
        *events.snapshot(db),
        facts.snapshot(db),
        actions.snapshot(db),
        deposits.snapshot(db),
        ledger.snapshot(db),
        alerts.snapshot(db),
        addresses.snapshot(db),
    )
