"""`depositd orders [--kind K] [--json]`: stable, collection and wallet transfer orders seen in
their webhooks (STABLE_ORDER_UPDATED, Collect Order Updated, WALLET_TRANSFER_ORDER_UPDATED), with
the detail the provider answered where the interface has a read for it."""

from __future__ import annotations

import argparse
import sqlite3
from typing import Any, TextIO

import sqlite_utils

from worker.commands.read import _json_line, run_on_db, table
from worker.store.orders import iter_orders

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


def _orders(conn: sqlite3.Connection, args: argparse.Namespace, out: TextIO) -> int:
    rows = [order_json(r) for r in iter_orders(sqlite_utils.Database(conn), kind=args.kind)]
    if args.json:
        for entry in rows:
            _json_line(entry, out)
        return 0
    table(_COLUMNS, [[e.get(c) for c in _COLUMNS] for e in rows], out)
    return 0


def run(args: argparse.Namespace) -> int:
    """`depositd orders [--kind K] [--json]`."""
    return run_on_db(args, _orders)
