"""The `order_updated` rows: read an order's detail, store it, let the `"*"` rules act on it.

Queued by the processor for every order webhook (`worker.track.orders`); no rule names this row,
so it is registered in `worker.act.kinds.ROW_RUNNERS`, not `KINDS`. The detail is read where the
interface has a read (stable order query-detail, collection order status); a transfer order has
none, so its webhook's data is the record. An outage is retried with back-off; after
`MAX_READ_ATTEMPTS`, or when the provider answers that it has no such order, the rules act on the
webhook's data (read status `failed`). Storing the record, queueing the rules' alert and forward
rows (`worker.act.recordreactor.fire_record`, record trigger `order_updated`) and finishing this row
happen in one write, so each order event acts once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from worker.act.kinds.base import RunnerDeps
from worker.act.queue import ActionRows
from worker.act.recordreactor import fire_record
from worker.errors import ProviderBusinessError, ProviderError
from worker.logs import get_logger
from worker.provider.client import ProviderClient
from worker.rules import RuleBook
from worker.rules.recordtriggers import ORDER_TRIGGER
from worker.store.db import Db
from worker.store.orders import save_order
from worker.track.orders import READABLE, order_record
from worker.track.tracker import Deposit

log = get_logger(__name__)

ORDER_ROW = "order_updated"  # the action row's name (and its trigger)
MAX_READ_ATTEMPTS = 5


def describe(record: Mapping[str, Any]) -> str:
    """One line naming the order (ids, kind, status, amount): what an alert says about it."""
    parts = [f"{record.get('kind')} order {record.get('orderId')}"]
    if record.get("merchantOrderId"):
        parts.append(f"merchantOrderId {record['merchantOrderId']}")
    for key in ("orderStatus", "businessType", "whiteListStatus"):
        if record.get(key) is not None:
            parts.append(f"{key} {record[key]}")
    if record.get("amount") is not None:
        parts.append(f"amount {record['amount']} {record.get('currency') or ''}".rstrip())
    return ", ".join(parts)


def fire_order(
    db: Db,
    rules: RuleBook,
    record: Mapping[str, Any],
    *,
    event_id: str | None,
) -> int:
    """Queue the alert and forward rows the `"*"` rules pick for this order; how many."""
    return fire_record(
        db,
        rules,
        ORDER_TRIGGER,
        record,
        subject=f"{record.get('kind')}:{record.get('orderId')}:{event_id}",
        detail=describe(record),
        event_id=event_id,
    )


class OrderReader:
    """Runs order_updated rows on the provider client, recording outcomes in `ActionRows`."""

    def __init__(
        self, rows: ActionRows, *, client: ProviderClient, rules: Callable[[], RuleBook]
    ) -> None:
        self._rows = rows
        self._client = client
        self._rules = rules

    @classmethod
    def build(cls, deps: RunnerDeps) -> OrderReader:
        """The runner the outbox uses for order_updated rows."""
        return cls(deps.rows, client=deps.client, rules=deps.rules)

    async def close(self) -> None:
        """Nothing to release: the client belongs to the service."""

    async def _read(self, kind: str, record: Mapping[str, Any]) -> dict[str, Any]:
        order_id = str(record["orderId"])
        if kind == "stable":
            stable = await self._client.stable_order_detail(order_id=order_id)
            return order_record(kind, stable.to_json_dict())
        collect = await self._client.collection_order_status(orderId=order_id)
        return order_record(kind, collect.to_json_dict())

    async def run(
        self,
        action_id: int,
        row: dict[str, Any],
        deposit: Deposit | None,
        params: dict[str, Any],
        attempts: int,
    ) -> None:
        """Read the detail (where one exists), store the order, queue what the rules pick."""
        kind = str(params["kind"])
        record: dict[str, Any] = dict(params["record"])
        read_status, note = "webhook", "no detail read exists for this kind"
        if kind in READABLE:
            try:
                record = {**record, **await self._read(kind, record)}
                read_status, note = "read", "detail read"
            except ProviderBusinessError as exc:
                read_status, note = "failed", f"detail not read ({exc.code or exc.msg})"
            except ProviderError as exc:
                if attempts < MAX_READ_ATTEMPTS:
                    await self._rows.later(
                        action_id, attempts, f"detail not read ({exc.msg}); retrying"
                    )
                    return
                read_status, note = "failed", f"detail not read after {attempts} tries"
        event_id = row.get("event_id")
        rules = self._rules()

        def store(db: Db) -> None:
            save_order(db, kind, record, read_status=read_status, event_id=event_id)
            fire_order(db, rules, record, event_id=event_id)

        log.info("order updated", kind=kind, orderId=record.get("orderId"), read=read_status)
        await self._rows.finish(action_id, "done", f"{describe(record)}; {note}", also=store)
