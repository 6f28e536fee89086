"""The `orders` table: stable, collection and wallet transfer orders, one row per (kind, orderId).

`record` holds the order as depositd knows it (JSON, provider spellings, amounts as decimal
strings): the webhook's data, replaced by the detail the provider answered once it is read.
`read_status` says which: `webhook` (no read exists for this kind), `pending` (the read is
queued), `read`, or `failed` (the read gave up; the webhook's data stays).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from worker.clock import utc_now
from worker.store.db import Db

_COLUMNS = (
    "kind",
    "order_id",
    "merchant_order_id",
    "order_status",
    "business_type",
    "currency",
    "network",
    "amount",
    "record",
    "read_status",
    "event_id",
    "created_at",
    "updated_at",
)


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def save_order(
    db: Db,
    kind: str,
    record: Mapping[str, Any],
    *,
    read_status: str,
    event_id: str | None = None,
) -> None:
    """Insert or replace the order's row from `record` (the order's wire fields)."""
    order_id = str(record["orderId"])
    now = utc_now()
    db.execute(
        "INSERT INTO orders (kind, order_id, merchant_order_id, order_status, business_type,"
        " currency, network, amount, record, read_status, event_id, created_at, updated_at)"
        " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT (kind, order_id) DO UPDATE SET"
        " merchant_order_id = COALESCE(excluded.merchant_order_id, orders.merchant_order_id),"
        " order_status = excluded.order_status, business_type = COALESCE(excluded.business_type,"
        " orders.business_type), currency = COALESCE(excluded.currency, orders.currency),"
        " network = COALESCE(excluded.network, orders.network), amount = COALESCE(excluded.amount,"
        " orders.amount), record = excluded.record, read_status = excluded.read_status,"
        " event_id = COALESCE(excluded.event_id, orders.event_id),"
        " updated_at = excluded.updated_at",
        [
            kind,
            order_id,
            _text(record.get("merchantOrderId")),
            _text(record.get("orderStatus")),
            _text(record.get("businessType")),
            _text(record.get("currency")),
            _text(record.get("network")),
            _text(record.get("amount")),
            json.dumps(dict(record), sort_keys=True),
            read_status,
            event_id,
            now,
            now,
        ],
    )


def iter_orders(db: Db, *, kind: str | None = None) -> Iterator[dict[str, Any]]:
    """Every order row (record decoded), most recently updated last."""
    sql = f"SELECT {', '.join(_COLUMNS)} FROM orders"
    params: list[Any] = []
    if kind is not None:
        sql += " WHERE kind = ?"
        params.append(kind)
    for row in db.execute(sql + " ORDER BY updated_at, kind, order_id", params):
        yield _row(row)


def _row(row: Any) -> dict[str, Any]:
    out = dict(zip(_COLUMNS, row, strict=True))
    out["record"] = json.loads(out["record"])
    return out
