"""Facts the tracker folds (worker/track/tracker.py), built the way the readers of webhooks,
history records and transaction details make them, about one deposit (TX)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from worker.provider.models import DepositOrder, WebhookEnvelope, WhiteListStatus
from worker.track.facts import fact_from_event, fact_from_order
from worker.track.tracker import Deposit, Fact, Transition, observe

TX = "tx-1001-0001"
T0 = 1_790_000_000_000


def order_data(**changes: Any) -> dict[str, Any]:
    """DEPOSIT_ORDER_NOTIFICATION-shaped data; keyword arguments override (None is kept)."""
    data: dict[str, Any] = {
        "transactionId": TX,
        "transactionHash": "0xabc",
        "transactionType": "DEPOSIT",
        "amount": "1234.5678",
        "currency": "USDT",
        "network": "TRON",
        "fromAddress": "TQ5aXj8Tq6u2pG2Lw6xXw9zC3vGmZ5a1bB",
        "walletId": 1001,
        "walletName": "main",
        "status": "PROCESSING",
        "whiteListStatus": "init",
    }
    data.update(changes)
    return data


def event(kind: str, at: int, event_id: str | None = None, **data: Any) -> Fact:
    """The fact of one webhook delivery (envelope timestamp `at`)."""
    env = WebhookEnvelope(
        eventId=event_id or f"ev-{kind}-{at}",
        eventType=kind,
        referenceId=TX,
        status="SUCCESS",
        timestamp=at,
        data=order_data(**data),
    )
    fact = fact_from_event(env)
    assert fact is not None
    return fact


def required(at: int) -> Fact:
    """DEPOSIT_WHITELIST_REQUIRED at `at`."""
    return event("DEPOSIT_WHITELIST_REQUIRED", at)


def failed(at: int, message: str = "payer name mismatch") -> Fact:
    """DEPOSIT_WHITELIST_FAILED at `at`."""
    return event("DEPOSIT_WHITELIST_FAILED", at, whiteListStatus="rejected", failMessage=message)


def credited(at: int, status: str = "PROCESSING") -> Fact:
    """DEPOSIT_WHITELIST_CREDITED at `at`."""
    return event("DEPOSIT_WHITELIST_CREDITED", at, whiteListStatus="approved", status=status)


def notification(at: int, status: str, white: str | None) -> Fact:
    """DEPOSIT_ORDER_NOTIFICATION at `at`."""
    return event("DEPOSIT_ORDER_NOTIFICATION", at, status=status, whiteListStatus=white)


def submitted(at: int) -> Fact:
    """Our own submission accepted at `at`."""
    return Fact(TX, "submit", at, white_list_status=WhiteListStatus.PENDING)


def poll(at: int, status: str, white: str | None, credit: str | None = None, **extra: Any) -> Fact:
    """A history record (credit None) or a transaction detail, updated at `at`."""
    body = order_data(status=status, whiteListStatus=white, updateTime=at, createTime=T0, **extra)
    body["toAddress"] = "TWalletReceiving111111111111111111"
    if credit is not None:
        body["creditStatus"] = credit
    return fact_from_order(DepositOrder.model_validate(body), sent_at=at)


def run(facts: Sequence[Fact], start: Deposit | None = None) -> tuple[Deposit, list[Transition]]:
    """Fold facts in the given order; returns the final deposit and every transition."""
    deposit = start
    out: list[Transition] = []
    for fact in facts:
        deposit, transitions = observe(deposit, fact)
        out.extend(transitions)
    assert deposit is not None
    return deposit, out
