"""Fixed-field conflicts: a later fact contradicting what the first fact fixed.

The first fact about a deposit fixes its amount, wallet, currency, network and addresses
(`worker.track.tracker.FIXED_FIELDS`).
A later fact stating another value is stored as usual, recorded
here, alerted (critical, once per field) and holds every booking of the deposit until a human
decides the value with `depositd resolve`; the booking that was held then happens exactly once,
with the decided value.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from worker.clock import now_ms, utc_now
from worker.provider import canonical
from worker.provider.amounts import AmountError, parse_amount
from worker.store.actions import queue_alert
from worker.store.conflicts import (
    has_conflict,
    insert_conflict,
    is_recorded,
    open_conflicts,
    record_decision,
)
from worker.store.db import Db
from worker.store.deposits import lock_deposit, set_field
from worker.store.waits import HELD, end_waits, start_wait
from worker.track.tracker import FIXED_FIELDS, Deposit, Fact, conflicts


def held_by(db: Db, transaction_id: str, *, created: bool = False) -> list[dict[str, Any]]:
    """The undecided conflicts of a deposit; none, without a query, for a deposit the fact
    being reacted to has just `created` (conflicts are recorded only against a stored one)."""
    if created:
        return []
    return open_conflicts(db, transaction_id)


# A second transactionId whose txHash, amount, receiving address and currency all equal a
# booked deposit's: held like a conflict until a person decides `duplicate=yes` (never booked)
# or `duplicate=no` (its own deposit: booked under its own id). Not a field of the deposit.
DUPLICATE = "duplicate"
DUPLICATE_VALUES = ("yes", "no")

# The options of `depositd resolve --set`: the wire names of the fixed fields, and `duplicate`.
WIRE_NAMES = {
    "wallet_id": "walletId",
    "currency": "currency",
    "network": "network",
    "amount": "amount",
    "from_address": "fromAddress",
    "to_address": "toAddress",
    DUPLICATE: DUPLICATE,
}
FIELD_OF = {wire: name for name, wire in WIRE_NAMES.items()}


def as_text(value: Any) -> str:
    """A field's value as stored in the conflicts table (amounts without trailing zeros)."""
    if isinstance(value, Decimal):
        return format(value.normalize(), "f")
    return str(value)


def record_conflicts(db: Db, before: Deposit | None, fact: Fact) -> list[str]:
    """Record the fixed fields `fact` contradicts; returns the fields newly in conflict (to
    alert about). A value already recorded or decided for that field is not recorded again."""
    new_fields: list[str] = []
    for name, held, stated in conflicts(before, fact):
        tx, stated_text = fact.transaction_id, as_text(stated)
        if is_recorded(db, tx, name, stated_text):
            continue
        first = not has_conflict(db, tx, name)
        insert_conflict(
            db,
            tx,
            name,
            fixed_value=as_text(held),
            seen_value=stated_text,
            source=fact.source,
            event_id=fact.event_id,
            observed_at=fact.observed_at,
            now=utc_now(),
        )
        if first:
            new_fields.append(name)
        hold(db, tx)
    return new_fields


def hold(db: Db, transaction_id: str) -> None:
    """The deposit's booking is held for a decision: it waits on a person from now, unless it
    waits on that decision already (docs/rules.md, "Deadlines"); announced by a critical alert
    on every configured channel."""
    start_wait(
        db, transaction_id, HELD, now=now_ms(), severity="critical", channels=None, again=False
    )


def decided_value(name: str, text: str) -> Any:
    """A decided value for a field, read as that field is (an amount with the amount rules);
    raises ValueError naming what is wrong."""
    if name == "amount":
        try:
            return parse_amount(text, positive=True)
        except AmountError as exc:
            raise ValueError(str(exc)) from None
    if name == DUPLICATE:
        if text.strip().lower() not in DUPLICATE_VALUES:
            raise ValueError("duplicate must be yes (never booked) or no (its own deposit)")
        return text.strip().lower()
    if name == "wallet_id":
        if not text.isascii() or not text.isdigit():
            raise ValueError(f"walletId must be a number, not {text!r}")
        return int(text)
    # In the form the facts hold it in (`worker.provider.canonical`): a value pasted with a
    # space around it, or a currency typed in lower case, is the one the facts state.
    value = canonical.code(text) if name in ("currency", "network") else canonical.address(text)
    if value is None:
        raise ValueError(f"{WIRE_NAMES[name]} must not be empty")
    return value


def decide(
    db: Db,
    transaction_id: str,
    values: dict[str, Any],
    *,
    by: str,
    note: str | None,
) -> None:
    """Record the decision on every open conflict of the fields in `values` and set the
    deposit's fields to the decided values; call inside a transaction."""
    now = utc_now()
    lock_deposit(db, transaction_id)  # not beside a batch that read the deposit before
    for name, value in values.items():
        if name not in FIXED_FIELDS and name != DUPLICATE:
            raise ValueError(f"{name} is not a fixed field")
        record_decision(db, transaction_id, name, as_text(value), by=by, note=note, now=now)
        if name == DUPLICATE:
            continue
        stored = format(value, "f") if isinstance(value, Decimal) else value
        set_field(db, transaction_id, name, stored, now)
    if not open_conflicts(db, transaction_id):
        end_waits(db, transaction_id, HELD, now=now_ms())  # nothing left to decide


def hold_likely_duplicate(db: Db, deposit: Deposit, other: str) -> bool:
    """Record the deposit as a likely duplicate of the booked `other` (held until decided);
    True when it was not recorded before (alert it)."""
    tx = deposit.transaction_id
    if has_conflict(db, tx, DUPLICATE):
        return False
    insert_conflict(
        db,
        tx,
        DUPLICATE,
        fixed_value=other,
        seen_value=str(deposit.tx_hash),
        source="ledger",
        event_id=None,
        observed_at=None,
        now=utc_now(),
    )
    hold(db, tx)
    return True


def alert_conflict(db: Db, deposit: Deposit, fact: Fact, name: str) -> None:
    """Queue the critical alert of a fixed field in conflict (once per deposit and field)."""
    where = f"{fact.source} event {fact.event_id}" if fact.event_id else f"{fact.source} fact"
    detail = (
        f"{WIRE_NAMES[name]} was {as_text(getattr(deposit, name))}, the {where} says "
        f"{as_text(getattr(fact, name))}; booking is held until a decision: "
        f"depositd resolve {deposit.transaction_id} --set {WIRE_NAMES[name]}=VALUE --by NAME"
    )
    queue_alert(
        db,
        transaction_id=deposit.transaction_id,
        condition="fixed_field_conflict",
        severity="critical",
        trigger="conflict",
        detail=detail,
        once_per=name,
        event_id=fact.event_id,
    )
