"""Record triggers into alert rows (and forward rows, for an order): an abnormal fund, a
reconciliation finding or an order update, through the `"*"` rule set, in the caller's
transaction.

The caller fires a record trigger in the same write that records it fired (a finding inserted,
an abnormal fund marked alerted), so each trigger queues its alerts once; each alert row is then
sent once per channel (`worker.act.alert`). Only identifying fields reach the alert: ids,
amounts, currency, network, txHash, status; never addresses or the provider's user ids. A
forward (allowed on order_updated only) posts the record as given, the same body on every retry.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from worker.act.queue import add_action, enqueue_alert
from worker.rules import RecordView, RuleBook
from worker.store.db import Db


def fire_record(
    db: Db,
    rules: RuleBook,
    trigger: str,
    fields: Mapping[str, Any],
    *,
    subject: str,
    detail: str,
    event_id: str | None = None,
) -> int:
    """Queue the alert (and forward) rows the `"*"` rules pick for this record; returns how
    many rows."""
    queued = 0
    for intent in rules.evaluate_record(RecordView(fields), trigger):
        if intent.action == "ignore":
            add_action(
                db,
                deposit=None,
                action="ignore",
                params={"subject": subject},
                trigger=trigger,
                intent=intent,
                status="done",
                outcome="ignored by rule",
                event_id=event_id,
            )
            break
        if intent.action == "forward":
            params = {**intent.params, "record": dict(fields)}
            add_action(
                db,
                deposit=None,
                action="forward",
                params=params,
                trigger=trigger,
                event_id=event_id,
                intent=intent,
            )
            queued += 1
            continue
        if intent.action != "alert":
            continue  # the loader refuses other actions on record triggers
        message = intent.params.get("message")
        enqueue_alert(
            db,
            None,
            trigger,
            str(intent.params.get("severity", "warning")),
            trigger=trigger,
            detail=f"{message}; {detail}" if message else detail,
            channels=intent.params.get("channels"),
            intent=intent,
            once_per=f"{subject}:{intent.rule_set}:{intent.rule}",
            event_id=event_id,
        )
        queued += 1
    return queued
