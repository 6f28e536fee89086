"""What one processor batch holds between its events: the deposits as they stand, and the rows
it writes once at its end.

A batch reads the deposits of all its events with one query and keeps each one up to date as
its events are applied, so nothing in the batch reads a deposit row again. While `defer` holds,
the deposit and fact rows are written at the end of the batch, one statement per table (a
deposit that several events change is written once, as it ends up); the processor undoes the
whole batch and applies its events again one by one (`defer` off, each under its own
savepoint) as soon as any of them raises, so that the failure stays that event's alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from worker.clock import utc_now
from worker.store import journal
from worker.store.db import Db
from worker.store.deposits import deposit_rows_sent, get_deposit_row, upsert_deposit_rows
from worker.store.events import StoredEvent
from worker.store.facts import FactRow, insert_fact_rows
from worker.store.ledger import book_all_unless_duplicate, booked_among_sent
from worker.track.conflicts import DUPLICATE
from worker.track.tracker import Deposit


@dataclass
class Bookings:
    """What a deferring batch knows of the ledger: the deposits booked (read once at its
    start, and those it books), and the bookings it counted on, checked at its end (on
    PostgreSQL the ledger statements are then not waited for one by one)."""

    booked: set[str]
    checks: list[Callable[[], bool]] = field(default_factory=list)
    # Bookings with a txHash, written at the batch's end (`flush`), under the duplicate check:
    # each its ledger row's values (but `booked_at`) and what its journal entry adds to them
    # (the rule set, the rules hash, the event).
    pending: list[tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=list)

    def flush(self, db: Db) -> None:
        """Write the pending bookings (after the batch's deposit rows: the duplicate check
        reads them), then check that every booking counted on was written (`BookingMissed`
        if not); once they are, each one's BOOKED journal entry, appended with the batch's
        transaction (docs/audit.md)."""
        booked: list[dict[str, Any]] = []
        if self.pending:
            pending, self.pending = self.pending, []
            now = utc_now()
            rows = [row for row, _ in pending]
            self.checks.append(
                book_all_unless_duplicate(db, rows, decision_field=DUPLICATE, booked_at=now)
            )
            booked = [
                {**journal.ledger_body({**row, "booked_at": now}), **extra}
                for row, extra in pending
            ]
        if self.checks:
            checks, self.checks = self.checks, []
            if not all(written() for written in checks):
                raise BookingMissed("a booking the batch counted on was not written")
        for body in booked:
            journal.append_at_commit(db, journal.BOOKED, body["transaction_id"], body)


class BookingMissed(Exception):
    """A booking the batch counted on was not written (its txHash booked under another
    transactionId meanwhile, or the deposit booked elsewhere): the batch is undone and its
    events applied again one at a time, each booking then read as it happens."""


@dataclass(frozen=True)
class Reaction:
    """What the reactor is told about the fact it reacts to, beside the deposit and its
    transitions (`worker.track.processor.Reactor`): passed in the arguments, all the way to the
    book action."""

    # The deferring batch's bookings (`Bookings`): a booking with a txHash is written at the
    # batch's end; None: each booking is written and read at once.
    bookings: Bookings | None = None
    # The fact created the deposit: no conflict can be recorded against it yet.
    created: bool = False
    # What a booking needs (`BOOKING_NEEDS`: txHash, amount, currency, network) that the fact
    # stated for the first time, by the deposit's field names: a booking may wait for it.
    learnt_for_booking: tuple[str, ...] = ()


@dataclass
class BatchWrites:
    """The batch's deposits by transactionId (None: no row yet) and its deferred rows."""

    known: dict[str, Deposit | None]
    defer: bool = True
    changed: dict[str, None] = field(default_factory=dict)  # transactionIds, in change order
    facts: list[FactRow] = field(default_factory=list)
    bookings: Bookings | None = None

    @classmethod
    def read(cls, db: Db, events: list[StoredEvent], *, defer: bool) -> BatchWrites:
        """The stored deposits of the events, read at once (None for an id without a row)."""
        ids = [e.transaction_id for e in events if e.transaction_id]
        # Both sent before either is read: one round trip on PostgreSQL.
        rows_sent = deposit_rows_sent(db, ids)
        booked_sent = booked_among_sent(db, ids) if defer else None
        rows = rows_sent()
        known = {tx: Deposit.from_row(rows[tx]) if tx in rows else None for tx in ids}
        bookings = Bookings(booked_sent()) if booked_sent is not None else None
        return cls(known, defer=defer, bookings=bookings)

    def load(self, db: Db, transaction_id: str) -> Deposit | None:
        """The deposit as it stands in this batch (read from the table if not read yet)."""
        if transaction_id in self.known:
            return self.known[transaction_id]
        row = get_deposit_row(db, transaction_id)
        deposit = self.known[transaction_id] = Deposit.from_row(row) if row is not None else None
        return deposit

    def keep(self, deposit: Deposit, *, changed: bool) -> None:
        """The deposit after a fact; when `changed` and deferring, its row is written at the end."""
        self.known[deposit.transaction_id] = deposit
        if changed and self.defer:
            self.changed[deposit.transaction_id] = None

    def forget(self) -> None:
        """An event's writes were undone: read the deposits again from the table."""
        self.known.clear()

    def flush(self, db: Db) -> None:
        """Write the deferred deposit and fact rows (facts in the order they were observed)."""
        if self.changed:
            rows = []
            for tx in self.changed:
                deposit = self.known[tx]
                assert deposit is not None
                rows.append(deposit.to_row())
            upsert_deposit_rows(db, rows)
            self.changed.clear()
        if self.facts:
            insert_fact_rows(db, self.facts)
            self.facts.clear()
        if self.bookings is not None:
            self.bookings.flush(db)
