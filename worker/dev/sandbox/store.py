"""Optional SQLite persistence of the sandbox: one JSON document per table, rewritten on change.

The sandbox's state is small, so every change rewrites all documents in one transaction; a
restart with the same file resumes exactly where the last change left it, pending webhook
deliveries included.
"""

from __future__ import annotations

import sqlite3
from decimal import Decimal
from pathlib import Path
from typing import Any

from worker.dev.sandbox.records import Address, Balance, Order, Wallet
from worker.dev.sandbox.state import SandboxState
from worker.provider import jsonio
from worker.provider.models import AddressStatus, CreditStatus, OrderStatus, WhiteListStatus

_SCHEMA = "CREATE TABLE IF NOT EXISTS documents (name TEXT PRIMARY KEY, body TEXT NOT NULL)"


def _order_doc(o: Order) -> dict[str, Any]:
    return {
        "transaction_id": o.transaction_id,
        "transaction_hash": o.transaction_hash,
        "wallet_id": o.wallet_id,
        "wallet_name": o.wallet_name,
        "currency": o.currency,
        "network": o.network,
        "amount": o.amount,
        "from_address": o.from_address,
        "to_address": o.to_address,
        "status": o.status.value,
        "white_list_status": o.white_list_status.value if o.white_list_status else None,
        "credit_status": o.credit_status.value,
        "create_time": o.create_time,
        "update_time": o.update_time,
        "fail_message": o.fail_message,
        "credit_time": o.credit_time,
    }


def _order_from(doc: dict[str, Any]) -> Order:
    wls = doc["white_list_status"]
    return Order(
        **{
            **doc,
            "amount": Decimal(str(doc["amount"])),
            "status": OrderStatus(doc["status"]),
            "white_list_status": WhiteListStatus(wls) if wls else None,
            "credit_status": CreditStatus(doc["credit_status"]),
        }
    )


STABLE_AMOUNTS = ("sourceAmount", "targetAmount", "price")


def _by_order_id(docs: list[dict[str, Any]], amounts: tuple[str, ...]) -> dict[str, Any]:
    """Orders back from the state file, by orderId, amounts as Decimal."""
    return {
        d["orderId"]: {**d, **{k: Decimal(str(d[k])) for k in amounts if d.get(k) is not None}}
        for d in docs
    }


def state_docs(state: SandboxState) -> dict[str, Any]:
    """The state as JSON-ready documents, one per table."""
    return {
        "wallets": [vars(w) for w in state.wallets.values()],
        "orders": [_order_doc(o) for o in state.orders.values()],
        "addresses": [{**vars(a), "status": a.status.value} for a in state.addresses.values()],
        "balances": [
            {
                "wallet_id": wid,
                "currency": cur,
                "available": b.available,
                "unavailable": b.unavailable,
            }
            for (wid, cur), b in state.balances.items()
        ],
        "withdraw_whitelist": state.withdraw_whitelist,
        "abnormal_funds": list(state.abnormal_funds.values()),
        "settlement_changes": state.settlement_changes,
        "travel_rule_tokens": state.travel_rule_tokens,
        "stable_orders": list(state.stable_orders.values()),
        "collect_orders": list(state.collect_orders.values()),
        "onboardings": state.onboardings,
        "quotes": state.quotes,
    }


def state_from_docs(
    docs: dict[str, Any], providers: list[str], main_wallet_id: int | None = None
) -> SandboxState:
    """Rebuild the state from `state_docs` output."""
    state = SandboxState(providers=list(providers), main_wallet_id=main_wallet_id)
    for w in docs.get("wallets", []):
        state.wallets[w["wallet_id"]] = Wallet(**w)
    for o in docs.get("orders", []):
        order = _order_from(o)
        state.orders[order.transaction_id] = order
    for a in docs.get("addresses", []):
        state.addresses[a["id"]] = Address(**{**a, "status": AddressStatus(a["status"])})
    for b in docs.get("balances", []):
        state.balances[(b["wallet_id"], b["currency"])] = Balance(
            Decimal(str(b["available"])), Decimal(str(b["unavailable"]))
        )
    state.withdraw_whitelist = list(docs.get("withdraw_whitelist", []))
    for f in docs.get("abnormal_funds", []):
        state.abnormal_funds[f["id"]] = {**f, "amount": Decimal(str(f["amount"]))}
    state.travel_rule_tokens = dict(docs.get("travel_rule_tokens", {}))
    state.stable_orders = _by_order_id(docs.get("stable_orders", []), STABLE_AMOUNTS)
    state.collect_orders = _by_order_id(docs.get("collect_orders", []), ("amount",))
    state.onboardings = dict(docs.get("onboardings", {}))
    state.quotes = dict(docs.get("quotes", {}))
    state.settlement_changes = [
        {**c, "amount": Decimal(str(c["amount"]))} if "amount" in c else c
        for c in docs.get("settlement_changes", [])
    ]
    return state


class StateFile:
    """Documents in one SQLite file; each `save` is one transaction."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._conn = sqlite3.connect(path, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute(_SCHEMA)

    def load(self) -> dict[str, Any] | None:
        """Every stored document by name, or None when the file holds nothing yet."""
        rows = self._conn.execute("SELECT name, body FROM documents").fetchall()
        if not rows:
            return None
        return {name: jsonio.loads(body) for name, body in rows}

    def save(self, docs: dict[str, Any]) -> None:
        """Replace every document at once."""
        with self._conn:
            self._conn.execute("BEGIN IMMEDIATE")
            self._conn.executemany(
                "INSERT INTO documents(name, body) VALUES (?, ?) "
                "ON CONFLICT(name) DO UPDATE SET body = excluded.body",
                [(name, jsonio.dumps(body)) for name, body in docs.items()],
            )

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()
