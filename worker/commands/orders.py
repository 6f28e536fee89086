"""`depositd orders [--kind K] [--json]`: stable, collection and wallet transfer orders seen in
their webhooks (STABLE_ORDER_UPDATED, Collect Order Updated, WALLET_TRANSFER_ORDER_UPDATED), with
the detail the provider answered where the interface has a read for it."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, TextIO

from worker.commands.dbopen import run_on_db
from worker.commands.read import _json_line, table
from worker.rules import RecordView, RuleBook
from worker.rules.engine import failing_record_condition
from worker.rules.recordtriggers import ORDER_TRIGGER
from worker.store.db import Connection
from worker.store.orders import iter_orders
from worker.store.sqlitestore import database
from worker.track.orders import ORDER_KINDS, order_record

KINDS = ("stable", "collect", "transfer")
_COLUMNS = (
    "kind",
    "orderId",
    "merchantOrderId",
    "orderStatus",
    "businessType",
    "amount",
    "currency",
    "read",
    "updatedAt",
)


def order_json(row: dict[str, Any]) -> dict[str, Any]:
    """An `orders` row as `orders --json` prints it: the order record and where it came from."""
    return {
        **row["record"],
        "kind": row["kind"],
        "orderId": row["order_id"],
        "read": row["read_status"],
        "eventId": row["event_id"],
        "updatedAt": row["updated_at"],
    }


def _orders(conn: Connection, args: argparse.Namespace, out: TextIO) -> int:
    rows = [order_json(r) for r in iter_orders(database(conn), kind=args.kind)]
    if args.json:
        for entry in rows:
            _json_line(entry, out)
        return 0
    table(_COLUMNS, [[e.get(c) for c in _COLUMNS] for e in rows], out)
    return 0


def run(args: argparse.Namespace) -> int:
    """`depositd orders [--kind K] [--json]`."""
    return run_on_db(args, _orders)


def explain_order(out: Callable[[str], object], rules: RuleBook, data: Any) -> bool:
    """`rules test` on an order event: each `"*"` rule on order_updated matched or not and why,
    on the webhook's data (a dry run reads no detail); False when `data` is no order event."""
    if not isinstance(data, dict) or data.get("eventType") not in ORDER_KINDS:
        return False
    kind = ORDER_KINDS[str(data["eventType"])]
    body = dict(data.get("data") or {})
    if not body.get("orderId") and data.get("referenceId"):
        body["orderId"] = data["referenceId"]
    record = order_record(kind, body)
    out(f"order: {kind} {record.get('orderId')} (the webhook's data; a dry run reads no detail)")
    ruleset = rules.ruleset_for(None, None)
    if ruleset is None:
        out('rule set: no "*" set; nothing would run')
        return True
    out(f"on {ORDER_TRIGGER}:")
    for rule in ruleset.rules:
        if ORDER_TRIGGER not in rule.on:
            continue
        reason = failing_record_condition(rule, RecordView(record), ORDER_TRIGGER)
        actions = ", ".join(a.describe() for a in rule.actions)
        out(
            f"  [match] {rule.name} -> {actions}"
            if reason is None
            else f"  [ no  ] {rule.name}: {reason}"
        )
    intents = rules.evaluate_record(RecordView(record), ORDER_TRIGGER)
    for intent in intents:
        out(f"  would run: {intent.action} (rule {intent.rule!r})")
    if not intents:
        out("  would run: nothing")
    return True
