"""Webhook envelopes of deposits, as a provider sends them, for the tests that post them."""

from __future__ import annotations

import time
import uuid
from typing import Any

UNKNOWN_ADDRESS = "TUnknownPayer00000000000000000000"


def envelope(event_id: str, event_type: str, tx: str, **data: Any) -> dict[str, Any]:
    """A deposit webhook envelope sent now, from an address no profile knows; `data` overrides
    the deposit fields."""
    status = "SUCCESS" if event_type == "DEPOSIT_ORDER_NOTIFICATION" else "PROCESSING"
    body = {
        "transactionId": tx,
        "walletId": 1001,
        "walletName": "Main USDT",
        "currency": "USDT",
        "network": "TRON",
        "amount": "12.5",
        "fromAddress": UNKNOWN_ADDRESS,
        "toAddress": "TMerchantDeposit000000000000000000",
        "transactionHash": f"hash-{tx}",
        "status": status,
        **data,
    }
    return {
        "eventId": event_id,
        "eventType": event_type,
        "referenceId": tx,
        "status": status,
        "timestamp": int(time.time() * 1000),
        "data": body,
    }


def deposit_event(
    event_type: str = "DEPOSIT_WHITELIST_REQUIRED",
    tx: str = "tx-1",
    *,
    event_id: str | None = None,
    status: str = "PROCESSING",
    amount: Any = "100.5",
    **extra: Any,
) -> dict[str, Any]:
    """A deposit webhook envelope at a fixed time in 2023 (a random eventId unless given);
    `extra` adds or overrides deposit fields."""
    data: dict[str, Any] = {
        "transactionId": tx,
        "transactionHash": f"0x{tx}",
        "transactionType": "DEPOSIT",
        "amount": amount,
        "currency": "USDT",
        "network": "TRON",
        "fromAddress": "TQ5aXj8Tq6u2pG2Lw6xXw9zC3vGmZ5a1bB",
        "walletId": 1001,
        "walletName": "main",
        "status": status,
        "timestamp": 1_700_000_000_000,
        **extra,
    }
    return {
        "eventId": event_id or uuid.uuid4().hex,
        "eventType": event_type,
        "referenceId": tx,
        "status": status,
        "timestamp": 1_700_000_000_000,
        "data": data,
    }
