"""The actions table (the outbox): every statement on it, on the database the caller gives.

Each function runs inside the caller's transaction (`Store.write`/`Store.read` jobs).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from worker.clock import utc_now
from worker.store.db import Database, Db
from worker.store.pg import InsertRows, dialect
from worker.store.tx import add_row, conn_of


def insert_action(
    db: Db,
    *,
    transaction_id: str | None,
    event_id: str | None,
    trigger: str,
    rule_set: str | None,
    rule_set_version: str | None,
    rule: str | None,
    action: str,
    params: str,
    idempotency_key: str | None,
    status: str,
    outcome: str | None,
    want_id: bool = True,
) -> int:
    """Insert one action row (`params` as JSON text), due now; returns its id (0 unless `want_id`:
    on PostgreSQL in pipeline mode the insert is then not waited for, see `worker.store.pg`)."""
    now = utc_now()
    values = [
        transaction_id,
        event_id,
        trigger,
        rule_set,
        rule_set_version,
        rule,
        action,
        params,
        idempotency_key,
        status,
        now,
        outcome,
        now,
        now,
    ]
    if not want_id:
        # On PostgreSQL sent with the action rows added right after it (a batch's).
        add_row(db, _INSERT_ACTION, values)
        return 0
    cur = conn_of(db).execute(_INSERT_ACTION.sql + " RETURNING id", values)
    return int(cur.fetchone()[0])


_INSERT_ACTION = InsertRows(
    "INSERT INTO actions (transaction_id, event_id, trigger, rule_set, rule_set_version, rule,"
    " action, params, idempotency_key, status, attempts, next_attempt_at, outcome,"
    " created_at, updated_at) VALUES ",
    "(?,?,?,?,?,?,?,?,?,?,0,?,?,?,?)",
)


def queue_order_read(db: Db, kind: str, record: Mapping[str, Any], *, event_id: str | None) -> int:
    """Queue the `order_updated` action row (an `actions` row about no deposit) that reads the
    order's detail and lets the rules act; returns its id."""
    params = {"kind": kind, "orderId": record["orderId"], "record": dict(record)}
    return insert_action(
        db,
        transaction_id=None,
        event_id=event_id,
        trigger="order_updated",
        rule_set=None,
        rule_set_version=None,
        rule=None,
        action="order_updated",
        params=json.dumps(params, sort_keys=True),
        idempotency_key=None,
        status="pending",
        outcome=None,
    )


def queue_alert(
    db: Db,
    *,
    transaction_id: str | None,
    condition: str,
    severity: str,
    trigger: str,
    detail: str | None = None,
    channels: Sequence[str] | None = None,
    profile: str | None = None,
    once_per: str | None = None,
    event_id: str | None = None,
    rule_set: str | None = None,
    rule_set_version: str | None = None,
    rule: str | None = None,
) -> int:
    """Insert one alert action row; the runner sends it once per (deposit, condition, channel),
    or per (deposit, condition, once_per, channel) when `once_per` names what one alert is
    about (one submission, one rule, one field). Returns its id."""
    params: dict[str, Any] = {
        "condition": condition,
        "severity": severity,
        "channels": list(channels) if channels else None,
        "detail": detail,
        "profile": profile,
    }
    if once_per is not None:
        params["once_per"] = once_per
    return insert_action(
        db,
        transaction_id=transaction_id,
        event_id=event_id,
        trigger=trigger,
        rule_set=rule_set,
        rule_set_version=rule_set_version,
        rule=rule,
        action="alert",
        params=json.dumps(params, sort_keys=True),
        idempotency_key=None,
        status="pending",
        outcome=None,
    )


def submission_key_used(db: Db, transaction_id: str, key: str) -> bool:
    """Was a submission with this Idempotency-Key already queued for the deposit?"""
    row = db.execute(
        "SELECT 1 FROM actions WHERE transaction_id=? AND action='submit_profile'"
        " AND idempotency_key=? LIMIT 1",
        [transaction_id, key],
    ).fetchone()
    return row is not None


def submission_with_key(db: Db, transaction_id: str, key: str) -> dict[str, Any] | None:
    """The deposit's first submission queued with this Idempotency-Key and not skipped (a
    skipped one never reached the provider); None if there is none."""
    row = db.execute(
        "SELECT * FROM actions WHERE transaction_id=? AND action='submit_profile'"
        " AND idempotency_key=? AND status != 'skipped' ORDER BY id LIMIT 1",
        [transaction_id, key],
    ).fetchone()
    return None if row is None else dict(row)


def open_submission(db: Db, transaction_id: str) -> dict[str, Any] | None:
    """The deposit's submission still to be run or running; None if there is none."""
    row = db.execute(
        "SELECT * FROM actions WHERE transaction_id=? AND action='submit_profile'"
        " AND status IN ('pending', 'running') ORDER BY id LIMIT 1",
        [transaction_id],
    ).fetchone()
    return None if row is None else dict(row)


def acted_on_event(db: Db, event_id: str, event_type: str) -> bool:
    """Did rules already run on this stored event's raw eventType (a row has it as trigger)?"""
    row = (
        conn_of(db)
        .execute(
            "SELECT 1 FROM actions WHERE event_id=? AND trigger=? LIMIT 1", (event_id, event_type)
        )
        .fetchone()
    )
    return row is not None


def alert_queued(db: Db, transaction_id: str | None, condition: str, once_per: str | None) -> bool:
    """Is an alert of this (deposit, condition, once_per) queued already (in any status)?"""
    queued = db.execute(
        _ALERT_QUEUED[dialect(db)], [transaction_id, condition, once_per]
    ).fetchone()
    return queued is not None


_ALERT_QUEUED = {
    "sqlite": "SELECT 1 FROM actions WHERE action='alert'"
    " AND transaction_id IS ? AND json_extract(params, '$.condition')=?"
    " AND json_extract(params, '$.once_per') IS ? LIMIT 1",
    "postgres": "SELECT 1 FROM actions WHERE action='alert'"
    " AND transaction_id IS NOT DISTINCT FROM ? AND (params::jsonb ->> 'condition')=?"
    " AND (params::jsonb ->> 'once_per') IS NOT DISTINCT FROM ? LIMIT 1",
}


# A row is free to claim when pending and due, or running under a claim that has lapsed (its
# instance died), that no one holds (before claims were recorded, or released at a sole start),
# or that is the caller's own (left by a run the caller cancelled).
_CLAIMABLE = (
    "((status='pending' AND next_attempt_at <= ?) OR (status='running' AND"
    " (lease_until IS NULL OR lease_until < ? OR claimed_by = ?)))"
)


def next_due_at(db: Db, instance: str = "") -> str | None:
    """The earliest time a pending or running row may be claimed by `instance`: its
    next_attempt_at, or when another instance's claim on it lapses (None: no such row)."""
    first = db.execute(
        "SELECT MIN(CASE WHEN status='running' AND lease_until IS NOT NULL AND claimed_by != ?"
        " THEN lease_until ELSE next_attempt_at END)"
        " FROM actions WHERE status IN ('pending','running')",
        [instance],
    ).fetchone()[0]
    return None if first is None else str(first)


def due_actions(
    db: Database, now: str, instance: str = "", due_by: str | None = None
) -> list[dict[str, Any]]:
    """Up to 50 rows `instance` may claim at `now` (pending rows due by `due_by`, default
    `now`), oldest first."""
    return list(
        db.query(
            f"SELECT * FROM actions WHERE status IN ('pending','running') AND {_CLAIMABLE}"
            " ORDER BY id LIMIT 50",
            [due_by or now, now, instance],
        )
    )


def claim_action(
    db: Db,
    action_id: int,
    *,
    instance: str,
    now: str,
    until: str,
    due_by: str | None = None,
) -> bool:
    """Mark the row running for `instance` until `until` (one more attempt) if it is still
    free to claim; False when another instance took it or it is no longer due. The row keeps
    its Idempotency-Key: a claim taken over repeats the same call."""
    cur = db.execute(
        "UPDATE actions SET status='running', attempts=attempts+1, claimed_by=?, lease_until=?,"
        f" updated_at=? WHERE id=? AND {_CLAIMABLE}",
        [instance, until, now, action_id, due_by or now, now, instance],
    )
    return int(cur.rowcount) == 1


def renew_claim(db: Db, action_id: int, instance: str, until: str) -> bool:
    """Extend `instance`'s claim on a running row; False when it holds it no longer."""
    cur = db.execute(
        "UPDATE actions SET lease_until=? WHERE id=? AND status='running' AND claimed_by=?",
        [until, action_id, instance],
    )
    return int(cur.rowcount) == 1


def release_claims(db: Db) -> int:
    """Let any instance take every running row at once (the only instance starting: whoever
    claimed them is gone); returns how many."""
    cur = db.execute(
        "UPDATE actions SET lease_until=NULL WHERE status='running' AND lease_until IS NOT NULL"
    )
    return int(cur.rowcount)


def deposit_of(db: Database, transaction_id: str | None) -> dict[str, Any] | None:
    """The row of the deposit an action is about, if any."""
    found = list(db.query("SELECT * FROM deposits WHERE transaction_id=?", [transaction_id]))
    return found[0] if found else None


def finish_action(
    db: Db,
    action_id: int,
    *,
    status: str,
    outcome: str,
    next_attempt_at: str,
    key: str | None = None,
    instance: str | None = None,
) -> bool:
    """Record a row's status and outcome (and its Idempotency-Key, when given); with
    `instance`, only while that instance holds the row's claim (False: another took it over)."""
    sets = "status=?, outcome=?, updated_at=?, next_attempt_at=?, lease_until=NULL"
    args: list[Any] = [status, outcome, utc_now(), next_attempt_at]
    if key is not None:
        sets += ", idempotency_key=?"
        args.append(key)
    where = "id=?"
    args.append(action_id)
    if instance is not None:
        where += " AND (claimed_by IS NULL OR claimed_by=?)"
        args.append(instance)
    cur = db.execute(f"UPDATE actions SET {sets} WHERE {where}", args)
    return int(cur.rowcount) == 1


def deposits_to_resubmit(db: Database) -> list[dict[str, Any]]:
    """Rejected deposits, and deposits still waiting for details whose submission failed."""
    return list(
        db.query(
            "SELECT * FROM deposits WHERE state='rejected' OR (state='needs_details' AND EXISTS"
            " (SELECT 1 FROM actions a WHERE a.transaction_id=deposits.transaction_id"
            " AND a.action='submit_profile' AND a.status='failed'))"
        )
    )


def last_submission_params(db: Db, transaction_id: str) -> str | None:
    """The params (JSON text) of the deposit's last keyed submission; None if it has none."""
    last = db.execute(
        "SELECT params FROM actions WHERE transaction_id=? AND action='submit_profile'"
        " AND idempotency_key IS NOT NULL ORDER BY id DESC LIMIT 1",
        [transaction_id],
    ).fetchone()
    return None if last is None else str(last[0] or "{}")


def deposits_never_submitted(db: Database) -> list[dict[str, Any]]:
    """Deposits waiting for details with no submission queued (other than skipped ones)."""
    return list(
        db.query(
            "SELECT * FROM deposits WHERE state='needs_details' AND NOT EXISTS"
            " (SELECT 1 FROM actions a WHERE a.transaction_id=deposits.transaction_id"
            " AND a.action='submit_profile' AND a.status != 'skipped')"
        )
    )


# --- reads and commands outside the outbox ---


def alert_with_trigger_queued(db: Db, transaction_id: str, trigger: str) -> bool:
    """Whether an alert about the deposit with this trigger was ever queued (in any status)."""
    row = db.execute(
        "SELECT 1 FROM actions WHERE transaction_id=? AND action='alert' AND trigger=?",
        [transaction_id, trigger],
    ).fetchone()
    return row is not None


def held_booking(db: Db, transaction_id: str) -> Any:
    """The first booking skipped as held by a conflict (trigger, rule_set, rule_set_version,
    rule, event_id), or None."""
    return db.execute(
        "SELECT trigger, rule_set, rule_set_version, rule, event_id FROM actions"
        " WHERE transaction_id=? AND action='book' AND status='skipped' AND outcome LIKE 'held:%'"
        " ORDER BY id LIMIT 1",
        [transaction_id],
    ).fetchone()


def set_rule(db: Db, action_id: int, rule_set: Any, rule_set_version: Any, rule: Any) -> None:
    """Record which rule set, version and rule an action row came from."""
    db.execute(
        "UPDATE actions SET rule_set=?, rule_set_version=?, rule=? WHERE id=?",
        [rule_set, rule_set_version, rule, action_id],
    )


def actions_of(db: Db, transaction_id: str) -> list[Any]:
    """Every action row of one deposit, in id order."""
    return db.execute(
        "SELECT * FROM actions WHERE transaction_id = ? ORDER BY id", [transaction_id]
    ).fetchall()


def all_actions(db: Db) -> list[Any]:
    """Every action row, in id order."""
    return db.execute("SELECT * FROM actions ORDER BY id").fetchall()


def failed_with_events(conn: Db) -> list[Any]:
    """The failed actions with the type and receive time of their event, in id order."""
    return conn.execute(
        "SELECT a.*, e.event_type, e.received_at FROM actions a"
        " LEFT JOIN events e ON e.event_id = a.event_id"
        " WHERE a.status = 'failed' ORDER BY a.id"
    ).fetchall()


def requeue_failed_actions(conn: Db, now: str) -> int:
    """Failed actions back to pending, due `now` (same idempotency keys); returns how many."""
    return int(
        conn.execute(
            # Submissions the provider refused for the profile (10000102/10000103) wait for a
            # changed profile instead: the same payload would be refused again.
            "UPDATE actions SET status='pending', next_attempt_at=?, updated_at=?"
            " WHERE status='failed' AND NOT (action='submit_profile' AND outcome LIKE 'profile %')",
            [now, now],
        ).rowcount
    )


def requeue_action(db: Db, action_id: int, now: str) -> bool:
    """One failed action back to pending, due `now` (same idempotency key, as `retry-failed`);
    False when it is not failed or is a submission refused for its profile."""
    return (
        db.execute(
            "UPDATE actions SET status='pending', next_attempt_at=?, updated_at=?"
            " WHERE id=? AND status='failed'"
            " AND NOT (action='submit_profile' AND outcome LIKE 'profile %')",
            [now, now, action_id],
        ).rowcount
        == 1
    )


def get_action(db: Db, action_id: int) -> dict[str, Any] | None:
    """One action row by id."""
    row = db.execute("SELECT * FROM actions WHERE id=?", [action_id]).fetchone()
    return None if row is None else dict(row)


def failed_alert_actions(db: Db, transaction_id: str, condition: str) -> list[int]:
    """The ids of the failed alert actions of one deposit (or "-") and condition."""
    tx = None if transaction_id == "-" else transaction_id
    rows = db.execute(_FAILED_ALERTS[dialect(db)], [tx, condition])
    return [int(r[0]) for r in rows]


_FAILED_ALERTS = {
    "sqlite": "SELECT id FROM actions WHERE action='alert' AND status='failed'"
    " AND transaction_id IS ? AND json_extract(params, '$.condition')=?",
    "postgres": "SELECT id FROM actions WHERE action='alert' AND status='failed'"
    " AND transaction_id IS NOT DISTINCT FROM ? AND (params::jsonb ->> 'condition')=?",
}


def count_open(db: Db) -> int:
    """How many actions are pending or running."""
    row = db.execute(
        "SELECT COUNT(*) FROM actions WHERE status IN ('pending','running')"
    ).fetchone()
    return int(row[0])


def count_failed(db: Db) -> int:
    """How many actions failed."""
    return int(db.execute("SELECT COUNT(*) FROM actions WHERE status='failed'").fetchone()[0])


def count_due(db: Db, now: str) -> int:
    """How many actions run now or are due by `now`."""
    row = db.execute(
        "SELECT COUNT(*) FROM actions WHERE status='running'"
        " OR (status='pending' AND next_attempt_at <= ?)",
        [now],
    ).fetchone()
    return int(row[0])


def snapshot(db: Db) -> tuple[Any, ...]:
    """Figures that change whenever an action row does."""
    return tuple(db.execute("SELECT COUNT(*), MAX(updated_at) FROM actions").fetchone())
