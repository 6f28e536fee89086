"""`book`: the deposit's ledger row, written inside the transition's transaction (exactly once).

Nothing runs after the commit: the row records what booking did (`book_checked`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlite_utils

from worker.act.kinds.base import Kind, Recording
from worker.act.queue import add_action, enqueue_alert
from worker.clock import utc_now
from worker.provider.jsonio import decimal_str
from worker.rules import ActionSpec
from worker.store import journal, ledger
from worker.store.actions import held_booking, set_rule
from worker.store.conflicts import decided_value_of
from worker.track.batch import Bookings, Reaction
from worker.track.conflicts import DUPLICATE, WIRE_NAMES, held_by, hold_likely_duplicate
from worker.track.tracker import Deposit, State

# Booking outside a processor batch (`depositd resolve`): nothing deferred, nothing created.
_ALONE = Reaction()
# The states in which the deposit is credited at this moment: credited, or completed (an order
# at SUCCESS is credited, whitelisted or not). Booking happens in no other.
CREDITED_STATES = frozenset({State.CREDITED, State.COMPLETED})
# The triggers on which the deposit is credited: credited, completed (an order at SUCCESS is
# credited, whitelisted or not) and released (a blocked deposit credited after all). Raw
# eventTypes and the other triggers do not imply it.
BOOK_TRIGGERS = frozenset({"credited", "completed", "released"})


@dataclass(frozen=True)
class Grounds:
    """What a booking decision rests on, as its journal entry keeps it: the rule set and
    version whose rule booked, the rules hash (`worker.rules.fingerprint`) and the event
    reacted to (docs/audit.md, "What is recorded")."""

    rule_set: str | None = None
    rule_set_version: str | None = None
    rules_hash: str | None = None
    event_id: str | None = None

    def fields(self) -> dict[str, Any]:
        """What a BOOKED entry's body adds to the ledger row."""
        return {
            "rule_set": self.rule_set,
            "rule_set_version": self.rule_set_version,
            "rules_hash": self.rules_hash,
            "event_id": self.event_id,
        }

    def booked(self, row: dict[str, Any]) -> dict[str, Any]:
        """A BOOKED entry's body: the ledger row as written, and these grounds."""
        return {**journal.ledger_body(row), **self.fields()}

    def held(self, trigger: str, reason: str) -> dict[str, Any]:
        """A HELD entry's body: why the booking waits, on which trigger and rules."""
        return {
            "reason": reason,
            "trigger": trigger,
            "rule_set": self.rule_set,
            "rules_hash": self.rules_hash,
        }


NO_GROUNDS = Grounds()


def _booking(deposit: Deposit, trigger: str) -> dict[str, Any]:
    """The ledger row's values."""
    return {
        "transaction_id": deposit.transaction_id,
        "wallet_id": deposit.wallet_id,
        "wallet_name": deposit.wallet_name,
        "currency": deposit.currency,
        "network": deposit.network,
        "amount": _amount(deposit),
        "from_address": deposit.from_address,
        "tx_hash": deposit.tx_hash,
        "trigger": trigger,
    }


def _amount(deposit: Deposit) -> str | None:
    return None if deposit.amount is None else decimal_str(deposit.amount)


def book_checked(
    db: sqlite_utils.Database,
    deposit: Deposit,
    trigger: str,
    reaction: Reaction = _ALONE,
    grounds: Grounds = NO_GROUNDS,
) -> tuple[str, str]:
    """Book the deposit if it may be booked now; the book action's (status, outcome).

    Whatever trigger a rule names, a deposit is booked only while credited, never while a fixed
    field is in conflict (`worker.track.conflicts`), never before its txHash is known (held;
    booked by `book_held` once a fact states it), and never while it is a likely duplicate of
    another transactionId booked with the same txHash (held, one critical alert). A deposit
    already booked says so whatever else holds now (the ledger is read only when booking is
    refused or did not happen: otherwise the INSERT itself says whether the row was new).
    `reaction`: the fact being reacted to; its batch's bookings, when it defers them.
    A row written gets its BOOKED journal entry, a booking held its HELD entry, both with the
    `grounds` and in the same transaction (docs/audit.md).
    """
    known = reaction.bookings
    if known is not None and deposit.transaction_id in known.booked:
        return "done", "already booked"
    refused = _refusal(db, deposit, created=reaction.created)
    if refused is None and not deposit.tx_hash:
        # Whether it is a likely duplicate of a booked deposit cannot be told yet: a credit
        # whose txHash comes later (a webhook or a record without one) waits for it.
        refused = ("skipped", WAITING_FOR_TX_HASH, None)
    if refused is None and deposit.tx_hash:
        if known is not None:
            return _book_counted(deposit, trigger, known, grounds)
        refused = _duplicate(db, deposit)
    if refused is None:
        # Outside a deferring batch (one with a txHash is booked at its end, one without waits
        # for it): booked unless booked already.
        row = {**_booking(deposit, trigger), "booked_at": utc_now()}
        if not ledger.book_once(db, **row)():
            return "done", "already booked"
        journal.append_at_commit(db, journal.BOOKED, deposit.transaction_id, grounds.booked(row))
        return "done", "booked"
    if ledger.is_booked(db, deposit.transaction_id):
        return "done", "already booked"
    status, outcome, alert = refused
    if alert is not None:
        enqueue_alert(db, deposit, "duplicate_tx_hash", "critical", trigger=trigger, detail=alert)
    if outcome.startswith(HELD_PREFIX):
        journal.append_at_commit(
            db, journal.HELD, deposit.transaction_id, grounds.held(trigger, outcome)
        )
    return status, outcome


# How the outcome of a booking held (waiting on its txHash or a person) begins: such a book
# row is the one `book_held` makes once the wait is over (`worker.store.actions.held_booking`).
HELD_PREFIX = "held:"


# The outcome of a booking held until the deposit's txHash is known (docs/reconciliation.md).
WAITING_FOR_TX_HASH = (
    "held: waiting for the txHash; booked once a webhook or a poll states it"
    " (the detail poll reads credited deposits)"
)


def book_held(
    db: sqlite_utils.Database,
    deposit: Deposit,
    why: str,
    reaction: Reaction = _ALONE,
    *,
    rules_hash: str | None = None,
) -> tuple[str, str] | None:
    """Make the booking that was held (a conflict, a likely duplicate, a txHash not known yet),
    if one was: booked at most once, under the held row's trigger and rule, recorded as a book
    action whose outcome ends with `why`; (status, outcome), or None when none was held. Its
    journal entry keeps the rules hash of the rules that held it (the HELD entry's), else
    `rules_hash`."""
    held = held_booking(db, deposit.transaction_id)
    if held is None:
        return None
    trigger = str(held[0])
    grounds = Grounds(
        rule_set=held[1],
        rule_set_version=held[2],
        rules_hash=_held_under(db, deposit.transaction_id) or rules_hash,
        event_id=held[4],
    )
    status, outcome = book_checked(db, deposit, trigger.split("#")[0], reaction, grounds)
    action_id = add_action(
        db,
        deposit=deposit,
        action="book",
        params={},
        trigger=trigger,
        event_id=held[4],
        status=status,
        outcome=f"{outcome} {why}",
    )
    set_rule(db, action_id, held[1], held[2], held[3])
    return status, outcome


def _held_under(db: sqlite_utils.Database, transaction_id: str) -> str | None:
    """The rules hash the deposit's first HELD entry was decided under, if it has one."""
    for entry in journal.entries_about(db, transaction_id):
        if entry.kind == journal.HELD and entry.body.get("rules_hash"):
            return str(entry.body["rules_hash"])
    return None


def _book_counted(
    deposit: Deposit, trigger: str, known: Bookings, grounds: Grounds
) -> tuple[str, str]:
    """In a deferring batch, a deposit with a txHash: booked at the batch's end, with the
    batch's other such bookings, by one statement that writes nothing when a decision on
    `duplicate` exists or another booked deposit has the txHash (`Bookings.flush`; nothing is
    waited for; when a row was not written, the batch is applied again one event at a time,
    where `_duplicate` tells the cases apart). The batch's deposit rows are written before it,
    so the statement sees a second id of a txHash the batch itself books as well."""
    known.booked.add(deposit.transaction_id)
    known.pending.append((_booking(deposit, trigger), grounds.fields()))
    return "done", "booked"


def _refusal(
    db: sqlite_utils.Database, deposit: Deposit, *, created: bool
) -> tuple[str, str, str | None] | None:
    """Why the deposit may not be booked now, before its txHash is looked at (`_duplicate`):
    (status, outcome, critical alert detail or None); None when it may be. `created`: the fact
    reacted to created the deposit (no conflict can hold it)."""
    tx = deposit.transaction_id
    if deposit.state not in CREDITED_STATES:
        return "skipped", f"not booked: the deposit is {deposit.state.value}, not credited", None
    held = held_by(db, tx, created=created)
    if held:
        names = ", ".join(sorted({WIRE_NAMES[c["field"]] for c in held}))
        return (
            "skipped",
            f"held: {names} in conflict; waiting for a decision (depositd resolve)",
            None,
        )
    return None


def _duplicate(db: sqlite_utils.Database, deposit: Deposit) -> tuple[str, str, str | None] | None:
    """A second transactionId of a booked txHash is its own deposit (a batch transfer has one
    txHash and several outputs) unless its amount, receiving address and currency all equal
    the booked one's: a likely duplicate, held (one alert) until `depositd resolve` decides."""
    tx = deposit.transaction_id
    decided = decided_value_of(db, tx, DUPLICATE)
    if decided == "yes":
        return "skipped", "not booked: decided a duplicate (depositd resolve)", None
    if decided == "no":
        return None
    assert deposit.tx_hash is not None
    ledger.lock_tx_hash(db, deposit.tx_hash)  # two instances at once: one reads the other's row
    other = ledger.likely_duplicate_of(
        db,
        transaction_id=tx,
        tx_hash=deposit.tx_hash,
        amount=_amount(deposit),
        currency=deposit.currency,
        to_address=deposit.to_address,
    )
    if other is None:
        return None
    new = hold_likely_duplicate(db, deposit, other)
    detail = (
        f"txHash {deposit.tx_hash} is booked for {other} with the same amount, toAddress and"
        f" currency; {tx} is held as a likely duplicate: depositd resolve {tx}"
        " --set duplicate=yes|no --by NAME"
    )
    outcome = (
        f"held: likely duplicate of {other}; waiting for a decision"
        f" (depositd resolve {tx} --set duplicate=yes|no)"
    )
    return "skipped", outcome, detail if new else None


def record(rec: Recording) -> None:
    """Book (if it may be booked now) and record what booking did; log it once committed."""
    deposit, intent = rec.deposit, rec.intent
    grounds = Grounds(intent.rule_set, intent.version, rec.rules_hash, rec.fact.event_id)
    status, outcome = book_checked(
        rec.db, deposit, rec.trigger.split("#")[0], rec.reaction, grounds
    )
    rec.add(params={}, status=status, outcome=outcome)
    fields = {
        "transactionId": deposit.transaction_id,
        "amount": _amount(deposit),
        "currency": deposit.currency,
    }
    if status == "done":
        rec.lines.append((outcome, fields))
    else:
        rec.lines.append(("book " + status, {**fields, "outcome": outcome}))


KIND = Kind(
    ActionSpec(
        "book",
        only_on=BOOK_TRIGGERS,
        only_on_meaning="that means the deposit is credited",
        only_on_example="credited",
    ),
    record,
)
