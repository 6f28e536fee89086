"""Facts from provider payloads: what a webhook or a polled deposit order states.

The event type is itself a fact (docs/concepts.md); a poll's record says what it says. Both feed
`worker.track.tracker.observe` alike.

Every fact is dated in this machine's clock, the one clock the facts are compared in (see
docs/reconciliation.md, "Money safety"): the provider's clock may run minutes ahead of or
behind it.

- A webhook is dated at its event's time as the provider's clock tells it, moved into ours by
  the delivery's own signing time (API-TIMESTAMP is the provider's clock at the moment it sent
  the delivery, which arrived here at `received_at`), and never later than its arrival.
- A read (history record, transaction detail) is dated at the moment its request was sent: what
  it says held then or later, so it never overrides a change made after that moment (a
  submission accepted while the read was in flight), and a record's own times, in the
  provider's clock, are not needed to place it.
"""

from __future__ import annotations

from dataclasses import replace

from worker.provider import canonical
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


def fact_from_event(
    env: WebhookEnvelope, *, received_at: int | None = None, signed_at: int | None = None
) -> Fact | None:
    """The fact a deposit webhook states; None for events that are not about deposits.

    The event type is itself a fact (docs/concepts.md). Observed time is the envelope timestamp,
    else data.timestamp, else `received_at`; with `signed_at` (the delivery's API-TIMESTAMP)
    and `received_at`, moved from the provider's clock into this machine's (`in_our_clock`).
    Malformed data raises pydantic's ValidationError.
    """
    if env.eventType not in DEPOSIT_EVENT_TYPES:
        return None
    raw = dict(env.data)
    if canonical.text(raw.get("transactionId")) is None and env.referenceId:
        raw["transactionId"] = env.referenceId
    if "status" not in raw and env.status in OrderStatus.__members__:
        raw["status"] = env.status
    data = DepositEventData.model_validate(raw)
    observed = env.timestamp if env.timestamp is not None else data.timestamp
    if observed is None:
        observed = received_at if received_at is not None else 0
    elif received_at is not None and signed_at is not None:
        observed = in_our_clock(observed, signed_at=signed_at, received_at=received_at)
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
        provider_time=getattr(data, "creditTime", None) or env.timestamp or data.timestamp,
    )


def in_our_clock(provider_ms: int, *, signed_at: int, received_at: int) -> int:
    """A time of the provider's clock in this machine's: the delivery signed at `signed_at`
    (the provider's clock) arrived at `received_at` (ours), so the two clocks differ by that
    much, give or take the delivery's transit. A delivery retried for hours is signed again at
    each attempt, so its event keeps its own, older time."""
    return provider_ms - signed_at + received_at


def fact_from_order(order: DepositOrder, *, sent_at: int, source: str = "poll") -> Fact:
    """The fact a history record or transaction detail states: what it says, nothing more.

    Observed time is `sent_at`, the moment (this machine's clock) the request that read the
    record was sent: the record says how the deposit stood at some moment after it, whether or
    not it carries updateTime. A missing creditStatus (history) or whiteListStatus key says
    nothing.
    """
    observed = sent_at
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
        provider_time=order.updateTime,
    )


def cap_time(fact: Fact, received_ms: int) -> Fact:
    """The fact with its time no later than its arrival (the moment it was stored).

    Every field keeps the time of the newest fact that set it, so a time stamped ahead would
    make every genuine later fact look older and change nothing (a FAILED sent right after a
    REQUIRED dated a year ahead would fire nothing): no fact is dated after it arrived.
    """
    return fact if fact.observed_at <= received_ms else replace(fact, observed_at=received_ms)
