"""Rows the journal describes, written as the real flow writes them (each row and its entry in
one transaction), for the tests of `depositd verify` and the daily head; and changes made by
hand on either engine, the way someone with write access to the database would make them."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from typing import Any

from worker.store import journal, submissions
from worker.store.actions import insert_action
from worker.store.ledger import insert_booking
from worker.store.pg import connect as pg_connect

RULES = {"rule_set": "default", "rule_set_version": "v1", "rules_hash": "0" * 64}


def book(db: Any, tx: str, amount: str = "12.50", **fields: Any) -> journal.Entry:
    """A ledger row and its BOOKED entry."""
    values = {
        "transaction_id": tx,
        "wallet_id": 1001,
        "wallet_name": "Main USDT",
        "currency": "USDT",
        "network": "TRON",
        "amount": amount,
        "from_address": "TPayerSource000000000000000000000",
        "tx_hash": f"hash-{tx}",
        "trigger": "credited",
        **fields,
    }
    insert_booking(db, **values)
    row = db.execute(
        f"SELECT {', '.join(journal.LEDGER_FIELDS)} FROM ledger WHERE transaction_id = ?", [tx]
    ).fetchone()
    body = {**journal.ledger_body(dict(zip(journal.LEDGER_FIELDS, tuple(row), strict=True)))}
    body.update(RULES, event_id=f"evt-{tx}")
    return journal.append(db, journal.BOOKED, tx, body)


def submit(db: Any, tx: str, payload: dict[str, Any], profile: str = "acme") -> int:
    """A submit_profile action row, what it sent in `submissions` and its SUBMITTED entry;
    the action's id."""
    action_id = insert_action(
        db,
        transaction_id=tx,
        event_id=None,
        trigger="needs_details",
        rule_set="default",
        rule_set_version="v1",
        rule="submit",
        action="submit_profile",
        params=json.dumps({"profile": profile}),
        idempotency_key=f"key-{tx}",
        status="done",
        outcome="accepted",
    )
    digest = submissions.record_sent(
        db,
        action_id=action_id,
        transaction_id=tx,
        profile=profile,
        body=payload,
        sent_at="2026-01-02T03:04:05.000Z",
        outcome="accepted",
    )
    body = {
        "action_id": action_id,
        "profile": profile,
        "fields": submissions.field_names(payload),
        "payload_sha256": digest,
        "outcome": "accepted",
        **RULES,
    }
    journal.append(db, journal.SUBMITTED, tx, body)
    return action_id


def purge(db: Any, action_ids: list[int]) -> None:
    """What retention does: the payloads removed, and a PURGED entry naming them."""
    marks = ", ".join("?" for _ in action_ids)
    db.execute(
        "UPDATE submissions SET body = NULL, purged_at = '2026-03-01T00:00:00.000Z'"
        f" WHERE action_id IN ({marks})",
        action_ids,
    )
    body = {"action_ids": action_ids, "before": "2026-02-01T00:00:00.000Z", "days": 30}
    journal.append(db, journal.PURGED, "retention", body)


def by_hand(storage: dict[str, str], *statements: str | tuple[str, list[Any]]) -> None:
    """Run statements on the database of a `storage` section, on a connection of their own and
    in one transaction, as a person with write access would."""
    items = [(s, []) if isinstance(s, str) else s for s in statements]
    if "url" in storage:
        pg = pg_connect(storage["url"])
        try:
            pg.execute("BEGIN")
            for sql, params in items:
                pg.execute(sql, params)
            pg.execute("COMMIT")
        finally:
            pg.close()
        return
    with contextlib.closing(sqlite3.connect(storage["path"])) as conn, conn:
        for sql, params in items:
            conn.execute(sql, params)


def drop_append_only(storage: dict[str, str]) -> tuple[str, ...]:
    """The statements that drop the engine's refusal to change a journal entry."""
    if "url" in storage:
        return ("DROP TRIGGER journal_append_only ON journal",)
    return ("DROP TRIGGER journal_no_update", "DROP TRIGGER journal_no_delete")
