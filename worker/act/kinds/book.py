"""`book`: the deposit's ledger row, written inside the transition's transaction (exactly once).

Nothing runs after the commit: the row records what booking did (`book_checked`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from worker.act import specs
from worker.act.kinds.base import Kind, Recording
from worker.act.queue import add_action, enqueue_alert
from worker.clock import utc_now
from worker.provider.jsonio import decimal_str
from worker.store import journal, ledger
from worker.store.actions import held_booking, set_rule
from worker.store.conflicts import decided_value_of
from worker.store.db import Db
from worker.track.batch import Bookings, Reaction
from worker.track.conflicts import DUPLICATE, WIRE_NAMES, held_by, hold_likely_duplicate
from worker.track.tracker import BOOKING_NEEDS, Deposit, State

# Booking outside a processor batch (`depositd resolve`): nothing deferred, nothing created.
_ALONE = Reaction()
# The states in which the deposit is credited at this moment: credited, or completed (an order
# at SUCCESS is credited, whitelisted or not). Booking happens in no other.
CREDITED_STATES = frozenset({State.CREDITED, State.COMPLETED})


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


# How the outcome of every booking held (`HOLD`: waiting on its txHash or a person) begins:
# such a book row is the one `book_held` makes once the wait is over
# (`worker.store.actions.held_booking`).
HELD_PREFIX = "held:"


# What a ledger row cannot be written without (`BOOKING_NEEDS`), as the outcome names each.
_NEEDED_NAMES = {
    "tx_hash": "txHash",
    "amount": "amount",
    "currency": "currency",
    "network": "network",
}


def waiting_for(names: list[str]) -> str:
    """The outcome of a booking held until the deposit's `names` (txHash, amount, currency,
    network: what a ledger row needs) are known (docs/reconciliation.md)."""
    return (
        f"{HELD_PREFIX} waiting for the {' and '.join(names)}; booked once a webhook or a poll"
        f" state{'s' * (len(names) == 1)} {'it' if len(names) == 1 else 'them'}"
        " (the detail poll reads credited deposits)"
    )


def known_now(fields: tuple[str, ...]) -> str:
    """What ends the outcome of a booking made once the deposit's `fields` are known."""
    names = [_NEEDED_NAMES[f] for f in fields]
    return f"(the {' and '.join(names)} {'is' if len(names) == 1 else 'are'} known now)"


# The outcome of a booking held until the deposit's txHash is known.
WAITING_FOR_TX_HASH = waiting_for(["txHash"])


@dataclass(frozen=True)
class Decision:
    """What `decide` says of a credited deposit: book it, hold it (it waits on something: its
    txHash, a person) or refuse it (it is not to be booked now), and why, in the words the
    book action's outcome keeps."""

    verdict: str  # BOOK, HOLD or REFUSE
    reason: str = ""
    # HOLD as a likely duplicate: the booked transactionId it duplicates.
    duplicate_of: str | None = None


BOOK, HOLD, REFUSE = "book", "hold", "refuse"


def decide(db: Db, deposit: Deposit, *, created: bool, deferred: bool) -> Decision:
    """The booking decision, in one place (docs/reconciliation.md, "Money safety"); it writes
    nothing (on PostgreSQL it takes the txHash's lock, held to the end of the transaction):

    - refused while the deposit is not credited (credited, or completed);
    - held while a fixed field is in conflict (`worker.track.conflicts`), waiting for
      `depositd resolve`;
    - held while its txHash, amount, currency or network is not known (the provider writes
      "not known yet" in several ways, all None here: `worker.provider.canonical`): whether
      it is a likely duplicate cannot be told yet, and a ledger row needs them;
    - in a deferring batch (`deferred`), booked: the batch's one statement writes nothing for a
      likely duplicate (`Bookings.flush`), and the batch is then applied again one event at a
      time, where the cases below tell it apart;
    - refused once a person decided it a duplicate, booked once a person decided it is not;
    - held as a likely duplicate when another transactionId is booked with the same txHash
      (case-blind), amount, currency and receiving address;
    - else booked.
    `created`: the fact reacted to created the deposit (no conflict can hold it yet).
    """
    tx = deposit.transaction_id
    if deposit.state not in CREDITED_STATES:
        return Decision(REFUSE, f"not booked: the deposit is {deposit.state.value}, not credited")
    held = held_by(db, tx, created=created)
    if held:
        names = ", ".join(sorted({WIRE_NAMES[c["field"]] for c in held}))
        return Decision(
            HOLD, f"{HELD_PREFIX} {names} in conflict; waiting for a decision (depositd resolve)"
        )
    missing = [_NEEDED_NAMES[n] for n in BOOKING_NEEDS if getattr(deposit, n) in (None, "")]
    if missing:
        return Decision(HOLD, waiting_for(missing))
    assert deposit.tx_hash is not None
    if deferred:
        return Decision(BOOK)
    decided = decided_value_of(db, tx, DUPLICATE)
    if decided == "yes":
        return Decision(REFUSE, "not booked: decided a duplicate (depositd resolve)")
    if decided == "no":
        return Decision(BOOK)
    ledger.lock_tx_hash(db, deposit.tx_hash)  # two instances at once: one reads the other's row
    other = ledger.likely_duplicate_of(
        db,
        transaction_id=tx,
        tx_hash=deposit.tx_hash,
        amount=_amount(deposit),
        currency=deposit.currency,
        to_address=deposit.to_address,
    )
    if other is not None:
        return Decision(
            HOLD,
            f"{HELD_PREFIX} likely duplicate of {other}; waiting for a decision"
            f" (depositd resolve {tx} --set duplicate=yes|no)",
            duplicate_of=other,
        )
    return Decision(BOOK)


def book_checked(
    db: Db,
    deposit: Deposit,
    trigger: str,
    reaction: Reaction = _ALONE,
    grounds: Grounds = NO_GROUNDS,
) -> tuple[str, str]:
    """Book the deposit if `decide` says so, and write what it decided; the book action's
    (status, outcome).

    A deposit already booked says so whatever else holds now (the ledger is read only when
    booking is not decided: otherwise the INSERT itself says whether the row was new).
    `reaction`: the fact being reacted to; its batch's bookings, when it defers them (a booking
    is then written at the batch's end). A row written gets its BOOKED journal entry, a
    booking held its HELD entry, both with the `grounds` and in the same transaction
    (docs/audit.md); a new hold as a likely duplicate its conflict and one critical alert.
    """
    known = reaction.bookings
    if known is not None and deposit.transaction_id in known.booked:
        return "done", "already booked"
    decision = decide(db, deposit, created=reaction.created, deferred=known is not None)
    if decision.verdict == BOOK:
        if known is not None:
            return _book_counted(deposit, trigger, known, grounds)
        row = {**_booking(deposit, trigger), "booked_at": utc_now()}
        if not ledger.book_once(db, **row)():
            return "done", "already booked"
        journal.append_at_commit(db, journal.BOOKED, deposit.transaction_id, grounds.booked(row))
        return "done", "booked"
    new_hold = decision.duplicate_of is not None and hold_likely_duplicate(
        db, deposit, decision.duplicate_of
    )
    if ledger.is_booked(db, deposit.transaction_id):
        return "done", "already booked"
    if new_hold:
        enqueue_alert(
            db,
            deposit,
            "duplicate_tx_hash",
            "critical",
            trigger=trigger,
            detail=_alert(deposit, decision),
        )
    if decision.verdict == HOLD:
        journal.append_at_commit(
            db, journal.HELD, deposit.transaction_id, grounds.held(trigger, decision.reason)
        )
    return "skipped", decision.reason


def _alert(deposit: Deposit, decision: Decision) -> str:
    """The critical alert's detail on a new hold as a likely duplicate."""
    tx = deposit.transaction_id
    return (
        f"txHash {deposit.tx_hash} is booked for {decision.duplicate_of} with the same amount,"
        f" toAddress and currency; {tx} is held as a likely duplicate: depositd resolve {tx}"
        " --set duplicate=yes|no --by NAME"
    )


def book_held(
    db: Db,
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


def _held_under(db: Db, transaction_id: str) -> str | None:
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


KIND = Kind(specs.BOOK, record)
