"""The deposit tracker: one state per transactionId, built from facts, pure (no I/O, no clock).

Webhooks, polls and our own accepted submissions all become `Fact`s; `observe` folds one fact into
a `Deposit` and returns the triggers that fact caused. Every field only moves forward
(docs/concepts.md), so a redelivered, duplicated or out-of-order fact never acts twice and
never undoes anything; a late fact is recorded by the caller but changes nothing here.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from decimal import Decimal
from enum import Enum
from typing import Any, TypeVar

from worker.clock import iso_from_ms, ms_from_iso
from worker.provider import canonical
from worker.provider.jsonio import decimal_str
from worker.provider.models import (
    CreditStatus,
    OrderStatus,
    WhiteListStatus,
)
from worker.store.deposits import CREDIT_DAY_TIME

SOURCES = frozenset({"webhook", "poll", "submit"})


class Trigger(str, Enum):
    """Tracker transitions that rules can name (docs/concepts.md)."""

    NEEDS_DETAILS = "needs_details"
    REJECTED = "rejected"
    SUBMITTED = "submitted"
    CREDITED = "credited"
    COMPLETED = "completed"
    BLOCKED = "blocked"
    RELEASED = "released"
    FAILED = "failed"


class State(str, Enum):
    """The tracked state, derived from status, whiteListStatus and creditStatus."""

    PROCESSING = "processing"
    NEEDS_DETAILS = "needs_details"
    SUBMITTED = "submitted"
    REJECTED = "rejected"
    CREDITED = "credited"
    COMPLETED = "completed"
    BLOCKED = "blocked"
    FAILED = "failed"


class Unknown(Enum):
    """Type of `UNKNOWN`: the fact says nothing about this field (unlike None, a real null)."""

    UNKNOWN = "UNKNOWN"


UNKNOWN = Unknown.UNKNOWN

# The order in which triggers caused by one fact are emitted: cause before effect.
CAUSAL_ORDER = (
    Trigger.NEEDS_DETAILS,
    Trigger.SUBMITTED,
    Trigger.REJECTED,
    Trigger.RELEASED,
    Trigger.CREDITED,
    Trigger.COMPLETED,
    Trigger.BLOCKED,
    Trigger.FAILED,
)
_ATTRIBUTES = (
    "wallet_id",
    "wallet_name",
    "currency",
    "network",
    "amount",
    "from_address",
    "to_address",
    "tx_hash",
)
# Fixed by the first fact that states them: a later fact saying otherwise is a conflict for a
# human to decide (`worker.track.conflicts`), never applied and never ignored in silence.
FIXED_FIELDS = ("wallet_id", "currency", "network", "amount", "from_address", "to_address")
_STATUSES = ("status", "white_list_status", "credit_status", "whitelisted")
# What a ledger row cannot be written without: a credited deposit missing one of them waits
# (`worker.act.kinds.book.decide`), and is booked once a fact states it.
BOOKING_NEEDS = ("tx_hash", "amount", "currency", "network")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_E = TypeVar("_E", OrderStatus, CreditStatus)


@dataclass(frozen=True)
class Fact:
    """One observation about one deposit; UNKNOWN fields say nothing, None is a real null."""

    transaction_id: str
    source: str
    observed_at: int
    event_type: str | None = None
    event_id: str | None = None
    status: OrderStatus | Unknown = UNKNOWN
    white_list_status: WhiteListStatus | Unknown | None = UNKNOWN
    credit_status: CreditStatus | Unknown = UNKNOWN
    wallet_id: int | None = None
    wallet_name: str | None = None
    currency: str | None = None
    network: str | None = None
    amount: Decimal | None = None
    from_address: str | None = None
    to_address: str | None = None
    tx_hash: str | None = None
    fail_message: str | None = None
    # The provider's own time of what the fact states, in the provider's clock (creditTime, a
    # record's updateTime): never compared with `observed_at`; it dates a credit for the
    # provider's daily report (`CREDIT_DAY_TIME`).
    provider_time: int | None = None

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"fact source must be one of {sorted(SOURCES)}, not {self.source!r}")
        if not self.transaction_id:
            raise ValueError("a fact needs a transaction_id")
        if isinstance(self.amount, float):
            raise TypeError("amounts are Decimal, never float")

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: decimals as strings, enums as values, UNKNOWN fields left out."""
        out: dict[str, Any] = {}
        for name in _FACT_NAMES:
            value = getattr(self, name)
            if value is UNKNOWN:
                continue
            if isinstance(value, Enum):
                value = value._value_
            elif isinstance(value, Decimal):
                value = decimal_str(value)
            out[name] = value
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, observed_at: int | None = None) -> Fact:
        """The inverse of `to_json` (for replaying stored facts); `observed_at` for a stored
        fact whose text leaves its time to the row (a poll's, `worker.track.processor`)."""
        kwargs: dict[str, Any] = {k: v for k, v in data.items() if k in _FACT_FIELDS}
        if "observed_at" not in kwargs and observed_at is not None:
            kwargs["observed_at"] = observed_at
        if "status" in kwargs:
            kwargs["status"] = OrderStatus(kwargs["status"])
        if kwargs.get("white_list_status") is not None:
            kwargs["white_list_status"] = WhiteListStatus(kwargs["white_list_status"])
        if "credit_status" in kwargs:
            kwargs["credit_status"] = CreditStatus(kwargs["credit_status"])
        # A fact stored before values were made canonical where they enter is read into the
        # same forms (`worker.provider.canonical`).
        for name, form in _CANONICAL_FACT.items():
            if name in kwargs:
                kwargs[name] = form(kwargs[name])
        if kwargs.get("amount") is not None:
            kwargs["amount"] = Decimal(str(kwargs["amount"]))
        return cls(**kwargs)


_CANONICAL_FACT = {**canonical.DEPOSIT_FORMS, "fail_message": canonical.text}
_FACT_NAMES = tuple(f.name for f in fields(Fact))
_FACT_FIELDS = frozenset(_FACT_NAMES)


@dataclass(frozen=True)
class Transition:
    """A trigger caused by one fact; `key` is its once-only key in `Deposit.emitted`."""

    trigger: Trigger
    key: str
    fail_message: str | None = None


@dataclass(frozen=True)
class Deposit:
    """The tracked deposit: the `deposits` row as typed fields."""

    transaction_id: str
    wallet_id: int | None
    wallet_name: str | None
    currency: str | None
    network: str | None
    amount: Decimal | None
    from_address: str | None
    to_address: str | None
    tx_hash: str | None
    status: OrderStatus | None
    white_list_status: WhiteListStatus | None
    credit_status: CreditStatus | None
    whitelisted: bool | None
    fail_message: str | None
    state: State
    emitted: frozenset[str]
    field_times: Mapping[str, int] = field(hash=False)
    first_source: str
    created_at: int
    updated_at: int

    def to_row(self) -> dict[str, Any]:
        """The columns of the `deposits` table (docs/design.md)."""
        return {
            "transaction_id": self.transaction_id,
            "wallet_id": self.wallet_id,
            "wallet_name": self.wallet_name,
            "currency": self.currency,
            "network": self.network,
            "amount": None if self.amount is None else decimal_str(self.amount),
            "from_address": self.from_address,
            "to_address": self.to_address,
            "tx_hash": self.tx_hash,
            "status": _value(self.status),
            "white_list_status": _value(self.white_list_status),
            "credit_status": _value(self.credit_status),
            "fail_message": self.fail_message,
            "state": self.state._value_,
            "emitted": _emitted_text(self.emitted),
            "whitelisted": None if self.whitelisted is None else int(self.whitelisted),
            "fact_time": _SORTED_JSON.encode(self.field_times),
            "source": self.first_source,
            "created_at": iso_from_ms(self.created_at),
            "updated_at": iso_from_ms(self.updated_at),
        }

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Deposit:
        """A deposit from a `deposits` row (as read from SQLite)."""
        amount, emitted, times = row["amount"], row["emitted"], row["fact_time"]
        if isinstance(amount, float):
            raise TypeError("deposits.amount holds a float; amounts are stored as decimal strings")
        plain: dict[str, Any] = {name: row[name] for name in _PLAIN_COLUMNS}
        return cls(
            **plain,
            amount=None if amount is None else Decimal(str(amount)),
            status=_enum(OrderStatus, row["status"]),
            white_list_status=_enum(WhiteListStatus, row["white_list_status"]),
            credit_status=_enum(CreditStatus, row["credit_status"]),
            whitelisted=None if row["whitelisted"] is None else bool(row["whitelisted"]),
            state=State(row["state"]),
            emitted=frozenset(json.loads(emitted) if isinstance(emitted, str) else emitted or ()),
            field_times=dict(json.loads(times) if isinstance(times, str) else times or {}),
            first_source=row["source"],
            created_at=ms_from_iso(row["created_at"]),
            updated_at=ms_from_iso(row["updated_at"]),
        )

    def same_but_times(self, other: Deposit) -> bool:
        """Equal to `other` in every field but the times facts were seen at."""
        return all(
            getattr(self, name) == getattr(other, name)
            for name in _DEPOSIT_FIELDS
            if name not in ("field_times", "updated_at")
        )

    def white_list_time(self) -> int:
        """The provider's time of the fact that set the whitelist status held (else of the
        newest fact): what a submission decided now answers."""
        return self.field_times.get("white_list_status", self.updated_at)

    def as_json(self) -> dict[str, Any]:
        """The `deposits --json` object (docs/reference.md); also the body of `forward`."""
        return {
            "transactionId": self.transaction_id,
            "walletId": self.wallet_id,
            "walletName": self.wallet_name,
            "currency": self.currency,
            "network": self.network,
            "amount": None if self.amount is None else decimal_str(self.amount),
            "fromAddress": self.from_address,
            "toAddress": self.to_address,
            "txHash": self.tx_hash,
            "status": _value(self.status),
            "whiteListStatus": _value(self.white_list_status),
            "creditStatus": _value(self.credit_status),
            "failMessage": self.fail_message,
            "state": self.state.value,
            "createdAt": iso_from_ms(self.created_at),
            "updatedAt": iso_from_ms(self.updated_at),
        }


_DEPOSIT_FIELDS = tuple(f.name for f in fields(Deposit))
_PLAIN_COLUMNS = ("transaction_id", *(a for a in _ATTRIBUTES if a != "amount"), "fail_message")
_AnyEnum = TypeVar("_AnyEnum", bound=Enum)


# json.dumps(..., sort_keys=True) builds a new encoder at every call: this one is built once.
_SORTED_JSON = json.JSONEncoder(sort_keys=True)


@functools.lru_cache(maxsize=256)
def _emitted_text(emitted: frozenset[str]) -> str:
    """The `emitted` column: the keys as a sorted JSON list (few distinct sets: cached)."""
    return json.dumps(sorted(emitted))


def _value(member: Enum | None) -> Any:
    # `_value_` is the member's plain attribute; `.value` goes through a descriptor (slow).
    return None if member is None else member._value_


def _enum(kind: type[_AnyEnum], value: Any) -> _AnyEnum | None:
    return None if value is None else kind(value)


def derive_state(
    status: OrderStatus | None,
    white_list_status: WhiteListStatus | None,
    credit_status: CreditStatus | None,
) -> State:
    """The tracked state, by priority: failed, blocked, completed, credited, then the whitelist."""
    if status is OrderStatus.FAIL:
        return State.FAILED
    if credit_status is CreditStatus.BLOCKED:
        return State.BLOCKED
    if status is OrderStatus.SUCCESS:
        return State.COMPLETED
    if credit_status is CreditStatus.CREDITED:
        return State.CREDITED
    if white_list_status is WhiteListStatus.REJECTED:
        return State.REJECTED
    if white_list_status is WhiteListStatus.PENDING:
        return State.SUBMITTED
    if white_list_status is WhiteListStatus.INIT:
        return State.NEEDS_DETAILS
    return State.PROCESSING


def conflicts(deposit: Deposit | None, fact: Fact) -> list[tuple[str, Any, Any]]:
    """The fixed fields (`FIXED_FIELDS`) this fact contradicts: (field, held, stated)."""
    if deposit is None:
        return []
    out: list[tuple[str, Any, Any]] = []
    for name in FIXED_FIELDS:
        held, stated = getattr(deposit, name), getattr(fact, name)
        if held is not None and stated is not None and held != stated:
            out.append((name, held, stated))
    return out


# --- folding one fact in -----------------------------------------------------------------------


def observe(deposit: Deposit | None, fact: Fact) -> tuple[Deposit, list[Transition]]:
    """Fold one fact into the deposit; returns the new deposit and the triggers it caused.

    When the fact changes nothing, the very same `deposit` comes back with no transitions.
    """
    if deposit is None:
        deposit = _blank(fact)
        is_new = True
    else:
        if deposit.transaction_id != fact.transaction_id:
            raise ValueError(
                f"fact for {fact.transaction_id} applied to deposit {deposit.transaction_id}"
            )
        is_new = False
    t = fact.observed_at
    changes: dict[str, Any] = {}
    times = dict(deposit.field_times)

    for name in _ATTRIBUTES:
        value = getattr(fact, name)
        if value is not None and getattr(deposit, name) is None:
            changes[name] = value

    status = _merge_terminal(deposit.status, fact.status, OrderStatus.PROCESSING)
    if status is not deposit.status:
        changes["status"], times["status"] = status, t
    credit = _merge_credit(deposit.credit_status, fact.credit_status)
    if credit is not deposit.credit_status:
        changes["credit_status"], times["credit_status"] = credit, t
        if credit is CreditStatus.CREDITED and fact.provider_time is not None:
            times[CREDIT_DAY_TIME] = fact.provider_time

    whitelisted = deposit.whitelisted
    wl, wl_time = deposit.white_list_status, times.get("white_list_status")
    if fact.white_list_status is None:
        whitelisted = False if whitelisted is None else whitelisted
    elif fact.white_list_status is not UNKNOWN:
        whitelisted = True
        wl, wl_time = _merge_white_list(wl, wl_time, fact.white_list_status, t)
    # Combined reading, last row: SUCCESS means credited and, behind the whitelist, approved.
    final_status = changes.get("status", deposit.status)
    # A blocked deposit whose order reaches SUCCESS was released (the interface shows no SUCCESS
    # order that stays BLOCKED), so it reads CREDITED too, whichever fact came first.
    if final_status is OrderStatus.SUCCESS:
        if changes.get("credit_status", deposit.credit_status) is not CreditStatus.CREDITED:
            changes["credit_status"], times["credit_status"] = CreditStatus.CREDITED, t
            if fact.provider_time is not None:
                times[CREDIT_DAY_TIME] = fact.provider_time
        if whitelisted and wl is not WhiteListStatus.APPROVED:
            wl, wl_time = WhiteListStatus.APPROVED, t
    if whitelisted is not deposit.whitelisted:
        changes["whitelisted"] = whitelisted
    if wl is not deposit.white_list_status:
        changes["white_list_status"] = wl
    if wl_time is not None and wl_time != times.get("white_list_status"):
        times["white_list_status"] = wl_time

    # The newest message wins (ties: the greater text), whatever order the rejections arrive in.
    message = fact.fail_message
    if message is not None:
        known = deposit.fail_message
        if known is None or (t, message) > (times.get("fail_message", -1), known):
            if message != known:
                changes["fail_message"] = message
            times["fail_message"] = t

    if not changes and times == dict(deposit.field_times) and not is_new:
        return deposit, []
    # One new Deposit from the held fields and the changes (two `replace` calls, each checking
    # every field, cost more than the rest of the fold).
    values = dict(vars(deposit))
    values.update(changes)
    transitions = _transitions(deposit, values)
    values["field_times"] = times
    values["state"] = derive_state(
        values["status"], values["white_list_status"], values["credit_status"]
    )
    values["emitted"] = deposit.emitted | {tr.key for tr in transitions}
    values["updated_at"] = max(deposit.updated_at, t) if not is_new else t
    return Deposit(**values), transitions


def _blank(fact: Fact) -> Deposit:
    unknown: dict[str, Any] = dict.fromkeys(_ATTRIBUTES + _STATUSES + ("fail_message",))
    return Deposit(
        transaction_id=fact.transaction_id,
        **unknown,
        state=State.PROCESSING,
        emitted=frozenset(),
        field_times={},
        first_source=fact.source,
        created_at=fact.observed_at,
        updated_at=fact.observed_at,
    )


def _merge_terminal(current: _E | None, seen: _E | Unknown, initial: _E) -> _E | None:
    """Initial -> terminal, never back; between two terminal values the first one wins."""
    if seen is UNKNOWN:
        return current
    if current is None or (current is initial and seen is not initial):
        return seen
    return current


# creditStatus only climbs: PENDING, then BLOCKED or CREDITED, and BLOCKED -> CREDITED when support
# releases the funds (docs/concepts.md: the one move out of blocked). A CREDITED deposit never reads
# BLOCKED again: a late BLOCKED after the release (or after the credit) changes nothing. Taking the
# higher rank is order-independent: any arrival order of the same facts ends in the same status.
_CREDIT_RANK = {CreditStatus.PENDING: 0, CreditStatus.BLOCKED: 1, CreditStatus.CREDITED: 2}


def _merge_credit(
    current: CreditStatus | None, seen: CreditStatus | Unknown
) -> CreditStatus | None:
    if seen is UNKNOWN:
        return current
    if current is None or _CREDIT_RANK[seen] > _CREDIT_RANK[current]:
        return seen
    return current


# pending and rejected alternate (resubmission, new rejection): the newer observation wins and,
# at the same millisecond, the rejection (a review always follows the submission it judges).
_ROUND_RANK = {WhiteListStatus.PENDING: 0, WhiteListStatus.REJECTED: 1}


def _merge_white_list(
    current: WhiteListStatus | None,
    current_time: int | None,
    seen: WhiteListStatus,
    t: int,
) -> tuple[WhiteListStatus | None, int | None]:
    # A status seen again holds from the newer time on: a read sent later says it still
    # held then, so an older fact delivered late (a rejection of an earlier round) loses.
    if current is WhiteListStatus.APPROVED:
        return current, current_time
    if seen is WhiteListStatus.APPROVED or current is None:
        return seen, t
    if seen is WhiteListStatus.INIT:
        return current, current_time
    if current is WhiteListStatus.INIT:
        return seen, t
    cur_key = (current_time if current_time is not None else -1, _ROUND_RANK[current])
    if (t, _ROUND_RANK[seen]) > cur_key:
        return seen, t
    return current, current_time


_WHITE_LIST_TRIGGERS = {
    WhiteListStatus.INIT: Trigger.NEEDS_DETAILS,
    WhiteListStatus.PENDING: Trigger.SUBMITTED,
    WhiteListStatus.REJECTED: Trigger.REJECTED,
}


def _transitions(before: Deposit, after: Mapping[str, Any]) -> list[Transition]:
    """Triggers for every field that moved (`after`: the new deposit's fields by name); a blank
    `before` holds None everywhere."""
    fired: set[Trigger] = set()
    wl = after["white_list_status"]
    if wl is not before.white_list_status and wl in _WHITE_LIST_TRIGGERS:
        fired.add(_WHITE_LIST_TRIGGERS[wl])
    credit = after["credit_status"]
    if credit is not before.credit_status:
        if credit is CreditStatus.CREDITED:
            fired.add(Trigger.CREDITED)
            if before.credit_status is CreditStatus.BLOCKED:
                fired.add(Trigger.RELEASED)
        elif credit is CreditStatus.BLOCKED:
            fired.add(Trigger.BLOCKED)
    status = after["status"]
    if status is not before.status:
        if status is OrderStatus.SUCCESS:
            fired.add(Trigger.COMPLETED)
        elif status is OrderStatus.FAIL:
            fired.add(Trigger.FAILED)
    out: list[Transition] = []
    for trigger in CAUSAL_ORDER:
        if trigger not in fired:
            continue
        key = _key(trigger, before.emitted)
        if key in before.emitted:
            continue
        message = after["fail_message"] if trigger is Trigger.REJECTED else None
        out.append(Transition(trigger, key, message))
    return out


def _key(trigger: Trigger, emitted: frozenset[str]) -> str:
    """Once-only key: 'rejected', then 'rejected#2' for the next round (same for 'submitted')."""
    name = str(trigger.value)
    if trigger not in (Trigger.REJECTED, Trigger.SUBMITTED):
        return name
    rounds = sum(1 for k in emitted if k.split("#")[0] == name)
    return name if rounds == 0 else f"{name}#{rounds + 1}"
