"""Order webhooks (STABLE_ORDER_UPDATED, Collect Order Updated, WALLET_TRANSFER_ORDER_UPDATED):
stored as order records, each followed by the read of the order's detail where the interface has
one (stable order query-detail, collection order status) and then the `order_updated` trigger.

The webhook's data carries only the order's identifiers and status (the interface shows nothing
more), so the processor stores what it says and queues one `order_updated` action row in the same
transaction; the outbox reads the detail, stores it and lets the `"*"` rules act
(`worker.act.orders`). A redelivered event is stored once (the inbox dedupes by eventId), so it
queues nothing twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from worker.provider.jsonio import decimal_str
from worker.provider.models import EventType, WebhookEnvelope
from worker.store.actions import queue_order_read
from worker.store.db import Db
from worker.store.orders import save_order

# eventType -> the order kind depositd stores and rules see as `kind`.
ORDER_KINDS: dict[str, str] = {
    EventType.STABLE_ORDER_UPDATED.value: "stable",
    EventType.COLLECT_ORDER_UPDATED.value: "collect",
    EventType.WALLET_TRANSFER_ORDER_UPDATED.value: "transfer",
}
# The kinds whose detail the interface can read (a transfer order's read has no path).
READABLE = frozenset({"stable", "collect"})


def order_record(kind: str, data: Mapping[str, Any]) -> dict[str, Any]:
    """The order record rules and `forward` see: the provider's fields as given, plus `kind`,
    `orderStatus` (a collection order's `status`) and, for a stable order, `currency` and
    `amount` of its target side (the stablecoin)."""
    record: dict[str, Any] = {k: v for k, v in data.items() if v is not None}
    record["kind"] = kind
    if "orderStatus" not in record and record.get("status") is not None:
        record["orderStatus"] = record["status"]
    if kind == "stable":
        if "currency" not in record and record.get("targetCurrency") is not None:
            record["currency"] = record["targetCurrency"]
        if "amount" not in record and record.get("targetAmount") is not None:
            record["amount"] = record["targetAmount"]
    for key in ("amount", "sourceAmount", "targetAmount", "price"):
        value = record.get(key)
        if value is not None and not isinstance(value, str):
            record[key] = decimal_str(value)
    return record


def apply_order_event(db: Db, env: WebhookEnvelope) -> None:
    """Store the order the event is about and queue its detail read and trigger; raises
    ValueError when the event names no order (the event is marked failed)."""
    kind = ORDER_KINDS[env.eventType]
    data = dict(env.data)
    if not data.get("orderId") and env.referenceId:
        data["orderId"] = env.referenceId
    if not isinstance(data.get("orderId"), str) or not data["orderId"]:
        raise ValueError(f"{env.eventType} without an orderId (data.orderId or referenceId)")
    record = order_record(kind, data)
    status = "pending" if kind in READABLE else "webhook"
    save_order(db, kind, record, read_status=status, event_id=env.eventId)
    queue_order_read(db, kind, record, event_id=env.eventId)
