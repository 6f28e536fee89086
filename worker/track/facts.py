"""Facts from provider payloads: what a webhook or a polled deposit order states.

The event type is itself a fact (docs/concepts.md); a poll's record says what it says. Both feed
`worker.track.tracker.observe` alike.
"""

from __future__ import annotations

from dataclasses import replace

from worker.provider.models import (
    DEPOSIT_EVENT_TYPES,
    CreditStatus,
    DepositEventData,
    DepositOrder,
    EventType,
    OrderStatus,
    WebhookEnvelope,
    WhiteListStatus,
)
from worker.track.tracker import UNKNOWN, Fact, Unknown


def fact_from_event(env: WebhookEnvelope, *, received_at: int | None = None) -> Fact | None:
    """The fact a deposit webhook states; None for events that are not about deposits.

    The event type is itself a fact (docs/concepts.md). Observed time is the envelope timestamp,
    else data.timestamp, else `received_at`. Malformed data raises pydantic's ValidationError.
    """
    if env.eventType not in DEPOSIT_EVENT_TYPES:
        return None
    raw = dict(env.data)
    if not raw.get("transactionId") and env.referenceId:
        raw["transactionId"] = env.referenceId
    if "status" not in raw and env.status in OrderStatus.__members__:
        raw["status"] = env.status
    data = DepositEventData.model_validate(raw)
    observed = env.timestamp if env.timestamp is not None else data.timestamp
    if observed is None:
        observed = received_at if received_at is not None else 0
    status: OrderStatus | Unknown = data.status
    white: WhiteListStatus | Unknown | None = (
        data.whiteListStatus if "whiteListStatus" in data.model_fields_set else UNKNOWN
    )
    credit: CreditStatus | Unknown = UNKNOWN
    kind = env.eventType
    if kind == EventType.DEPOSIT_WHITELIST_REQUIRED.value:
        white, credit = WhiteListStatus.INIT, CreditStatus.PENDING
    elif kind == EventType.DEPOSIT_WHITELIST_FAILED.value:
        white = WhiteListStatus.REJECTED
    elif kind == EventType.DEPOSIT_WHITELIST_CREDITED.value:
        white, credit = WhiteListStatus.APPROVED, CreditStatus.CREDITED
    elif data.status is OrderStatus.SUCCESS:
        credit = CreditStatus.CREDITED
    return Fact(
        transaction_id=data.transactionId,
        source="webhook",
        observed_at=observed,
        event_type=kind,
        event_id=env.eventId,
        status=status,
        white_list_status=white,
        credit_status=credit,
        wallet_id=data.walletId,
        wallet_name=data.walletName,
        currency=data.currency,
        network=data.network,
        amount=data.amount,
        from_address=data.fromAddress,
        tx_hash=data.transactionHash,
        fail_message=data.failMessage if kind == EventType.DEPOSIT_WHITELIST_FAILED.value else None,
    )


def fact_from_order(
    order: DepositOrder, *, source: str = "poll", observed_at: int | None = None
) -> Fact:
    """The fact a history record or transaction detail states: what it says, nothing more.

    Observed time is the record's updateTime, else `observed_at` (pass the time the request was
    sent, so a submission made while the poll was in flight is not taken as older), else
    createTime. A missing creditStatus (history) or whiteListStatus key says nothing.
    """
    observed = order.updateTime
    if observed is None:
        observed = observed_at if observed_at is not None else (order.createTime or 0)
    white: WhiteListStatus | Unknown | None = (
        order.whiteListStatus if "whiteListStatus" in order.model_fields_set else UNKNOWN
    )
    credit: CreditStatus | Unknown = (
        order.creditStatus if order.creditStatus is not None else UNKNOWN
    )
    return Fact(
        transaction_id=order.transactionId,
        source=source,
        observed_at=observed,
        status=order.status,
        white_list_status=white,
        credit_status=credit,
        wallet_id=order.walletId,
        wallet_name=order.walletName,
        currency=order.currency,
        network=order.network,
        amount=order.amount,
        from_address=order.fromAddress,
        to_address=order.toAddress,
        tx_hash=order.transactionHash,
        fail_message=order.failMessage,
    )


def cap_time(fact: Fact, received_ms: int) -> Fact:
    """The fact with its time no later than its arrival (the moment it was stored).

    Every field keeps the time of the newest fact that set it, so a time stamped ahead would
    make every genuine later fact look older and change nothing (a FAILED sent right after a
    REQUIRED dated a year ahead would fire nothing): no fact is dated after it arrived.
    """
    return fact if fact.observed_at <= received_ms else replace(fact, observed_at=received_ms)
