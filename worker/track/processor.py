"""The inbox processor: stored events -> tracker -> reactor, in receive order.

Each event is applied in one write transaction that also marks it processed, so a crash leaves
it either untouched (pending, done again after restart) or fully done; never half. A batch of
pending events shares the transaction (one fsync) with the webhook inserts of the moment, under
one savepoint, its deposit and fact rows written at its end (`worker.track.batch`); when an
event raises, the batch is undone and applied again one savepoint per event, so that event alone
is rolled back and marked failed. Polls feed the same path through `observe_fact`.

Batches run on the event loop (`Store.write_inline`), so they take turns with request handling
and webhook commits. How long a turn lasts is the processor's share: `drain_time_s` when no
delivery arrived for a while (a backlog is worked off in long turns, so few commits); while
deliveries arrive, one turn per 25 ms at most, of `busy_share` of the time since its previous
turn, so a burst is taken in at nearly full speed and worked off afterwards; once the lag
(age of the oldest pending event) passes `lag_target_s`, turns follow each other without a
pause and take at least twice as many events as arrived meanwhile, so under sustained overload
ingestion slows down to what processing can follow and the lag stays bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import ValidationError

from worker.clock import ms_from_iso
from worker.errors import StorageError
from worker.logs import LogLine, get_logger
from worker.metrics import Metrics, event_type_label
from worker.provider import jsonio
from worker.provider.models import (
    AddressUpdatedData,
    EventType,
    WebhookEnvelope,
)
from worker.store.db import Database, Db
from worker.store.deposits import get_deposit_row, lock_deposit, upsert_deposit_row
from worker.store.errors import StoreBusy, StoreUnavailable
from worker.store.events import (
    StoredEvent,
    mark_events,
    oldest_pending_received_at,
    pending_events,
)
from worker.store.facts import fact_row, fact_text, insert_fact_rows, poll_fact_repeats
from worker.store.sqlitestore import Store
from worker.store.tx import savepoint
from worker.track.addresses import apply_address_update
from worker.track.batch import BatchWrites, BookingMissed, Reaction
from worker.track.conflicts import alert_conflict, record_conflicts
from worker.track.facts import cap_time, fact_from_event
from worker.track.orders import ORDER_KINDS, apply_order_event
from worker.track.tracker import BOOKING_NEEDS, Deposit, Fact, Transition, observe

log = get_logger(__name__)


class Reactor(Protocol):
    """What turns transitions into recorded actions; runs inside the processor's transaction."""

    def react(
        self,
        db: Database,
        deposit: Deposit,
        transitions: list[Transition],
        fact: Fact,
        reaction: Reaction,
    ) -> list[LogLine] | None:
        """Record whatever the transitions call for, using `db` only (a batch that is undone
        and applied again calls it again for the same fact); the lines to log once that is
        committed (a line such as "booked" must not precede the commit). `reaction`: what else
        is known of the fact (the batch's bookings, whether it created the deposit or stated
        its txHash first)."""


@dataclass
class _Outcome:
    """What happened to one event, logged after the commit."""

    event: StoredEvent
    status: str
    transitions: list[Transition] = field(default_factory=list)
    error: str | None = None
    lines: list[LogLine] = field(default_factory=list)


def _ms(iso: str | None) -> int | None:
    return ms_from_iso(iso) if iso else None


def _describe(exc: BaseException) -> str:
    """An error for the events table, without echoing input values (payer data)."""
    if isinstance(exc, ValidationError):
        parts = [
            f"{'.'.join(str(p) for p in err['loc']) or 'data'}: {err['msg']}"
            for err in exc.errors(include_input=False, include_url=False)
        ]
        return "invalid event: " + "; ".join(parts)
    return f"{type(exc).__name__}: {exc}"


def _statement(fact: Fact) -> dict[str, Any]:
    """What the facts table stores of a fact. A read is dated when its request was sent
    (`worker.track.facts`), so a poll's time is kept in the row's own column only: the text of
    two reads saying the same thing is the same (`poll_fact_repeats`)."""
    stated = fact.to_json()
    if fact.source == "poll":
        del stated["observed_at"]
    return stated


def apply_fact(
    db: Database,
    fact: Fact,
    reactor: Reactor | None,
    batch: BatchWrites | None = None,
) -> tuple[Deposit, list[Transition], list[LogLine]]:
    """Load, observe, store the deposit and the fact, and react; call inside a transaction.

    `batch`: the processor's batch (its deposits already read, kept up to date here; while it
    defers, the deposit and fact rows are written at its end). Returns the deposit, its
    transitions and the reactor's lines to log after the commit.
    """
    tx = fact.transaction_id
    if batch is not None:
        before = batch.load(db, tx)
    else:
        lock_deposit(db, tx)  # another instance's batch may hold this deposit: wait for it
        stored = get_deposit_row(db, tx)
        before = Deposit.from_row(stored) if stored is not None else None
    if before is not None:
        for name in record_conflicts(db, before, fact):
            alert_conflict(db, before, fact, name)
    after, transitions = observe(before, fact)
    changed = before is None or after != before
    # Moved: something but the times changed (a read dated later than the last one repeating
    # a status moves its time on, which is stored, but is no change of the deposit).
    moved = changed and (before is None or not after.same_but_times(before))
    if batch is not None:
        batch.keep(after, changed=changed)
    if changed and (batch is None or not batch.defer):
        upsert_deposit_row(db, after.to_row())
    stated = fact_text(_statement(fact))
    # A poll repeating what it already said since the deposit last moved is not stored again
    # (every poll would add a row that changes nothing); a fact that moves it always is.
    if fact.source == "poll" and not moved and batch is not None:
        batch.flush(db)  # the facts table is read: the deferred rows first
    if moved or fact.source != "poll" or not poll_fact_repeats(db, tx, stated):
        row = fact_row(
            transaction_id=tx,
            source=fact.source,
            event_id=fact.event_id,
            observed_at=fact.observed_at,
            fact=stated,
            changed=moved,
        )
        if batch is not None and batch.defer:
            batch.facts.append(row)
        else:
            insert_fact_rows(db, [row])
    lines = None
    if reactor is not None:
        reaction = Reaction(
            bookings=batch.bookings if batch is not None else None,
            created=before is None,
            learnt_for_booking=()
            if before is None
            else tuple(
                name
                for name in BOOKING_NEEDS
                if getattr(before, name) is None and getattr(after, name) is not None
            ),
        )
        lines = reactor.react(db, after, transitions, fact, reaction)
    return after, transitions, lines or []


# Deliveries this recent mean ingestion is going on: the processor takes short turns, each
# waiting up to _RIDE_S for the deliveries' next commit rather than adding one of its own.
_QUIET_S = 0.1
_RIDE_S = 0.02
_BUSY_TURN_S = 0.025  # while deliveries arrive, at most one turn per this long


def _debug_enabled(logger: Any) -> bool:
    """Whether the logger writes debug lines (then per-event lines are built at all)."""
    enabled = getattr(logger, "is_enabled_for", None)
    return True if enabled is None else bool(enabled(logging.DEBUG))


class Processor:
    """Applies stored events in receive order; woken by ingress, plus a periodic sweep."""

    def __init__(
        self,
        store: Store,
        *,
        reactor: Reactor | None = None,
        metrics: Metrics | None = None,
        sweep_interval_s: float = 5.0,
        batch_size: int = 1000,
        batch_time_s: float = 0.008,
        drain_time_s: float = 0.04,
        busy_share: float = 0.15,
        lag_target_s: float = 5.0,
    ) -> None:
        self.store = store
        # Assignable after construction: the rules engine is built once the store is open.
        self.reactor = reactor
        # Called when an ABNORMAL_FUND_NOTIFICATION is processed: the list is read at once.
        self.abnormal_hints: list[Callable[[], None]] = []
        self.metrics = metrics
        self.sweep_interval_s = sweep_interval_s
        self.batch_size = batch_size
        # A batch holds the event loop: these bound how long requests wait behind it.
        self.batch_time_s = batch_time_s
        # With no delivery for a while (working off a backlog), turns are longer: each commit
        # (an fsync, and every page the turn changed written to the log) then serves more
        # events. A delivery arriving meanwhile waits for the turn at most this long.
        self.drain_time_s = drain_time_s
        self.busy_share = busy_share
        self.lag_target_s = lag_target_s
        self._event_cost_s = 0.0001  # running estimate, sizes the pending query
        self._arrived = 0  # wake() calls since the last batch
        self._arrived_at = -1.0  # monotonic time of the last wake()
        self._last_turn = time.perf_counter()  # when the previous batch ended
        self._behind = False  # the lag was past lag_target_s at the last busy turn
        self._wake = asyncio.Event()
        self._stopping = False
        # Batches undone and applied again one event at a time, by why: "booking_missed" (a
        # booking the batch counted on was not written) or "event_failed" (an event raised);
        # counted once the batch is committed.
        self.replayed: Counter[str] = Counter()
        self._replays: list[str] = []  # of the batch in hand
        self._task: asyncio.Task[None] | None = None
        # Run after each commit that applied something, e.g. to wake the outbox runner.
        self.after_commit: list[Callable[[], None]] = []

    def wake(self) -> None:
        """New events are stored: process soon."""
        self._arrived += 1
        self._arrived_at = time.monotonic()
        self._wake.set()

    @property
    def running(self) -> bool:
        """True while the background loop runs."""
        return self._task is not None and not self._task.done()

    @property
    def task(self) -> asyncio.Task[None]:
        """The background loop's task, between `start` and `stop`."""
        assert self._task is not None, "the processor is not started"
        return self._task

    def start(self) -> None:
        """Start the background loop."""
        self._stopping = False
        self._task = asyncio.create_task(self.run(), name="processor")

    async def stop(self) -> None:
        """Stop after the batch in progress is committed."""
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            task, self._task = self._task, None
            await task

    async def run(self) -> None:
        """Process until `stop`; a failed batch is logged and retried at the next sweep."""
        while not self._stopping:
            self._wake.clear()
            try:
                while not self._stopping and await self.process_batch():
                    pass
            except StorageError as exc:
                if not self.store.outage.note("processingFailed"):  # counted in the outage
                    log.error("processing paused: storage unavailable", error=str(exc))
            except Exception as exc:
                # A fault outside any one event (each event's own is caught in its batch): the
                # batch was rolled back; keep the loop alive and try again at the next sweep.
                log.error("processing paused: batch failed", error=_describe(exc))
            if self._stopping:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.sweep_interval_s)

    async def run_until_idle(self) -> int:
        """Process until no event is pending (burst mode); returns how many were handled."""
        total = 0
        while n := await self.process_batch():
            total += n
        return total

    async def process_batch(self) -> int:
        """Apply up to `batch_size` pending events in one transaction; returns how many."""
        reactor = self.reactor
        # While deliveries arrive, the batch rides along with their commit: no extra fsync, and
        # the loop goes back to requests between turns.
        ride = _RIDE_S if time.monotonic() - self._arrived_at < _QUIET_S else 0.0
        if ride and not self._behind:
            # Fewer, longer turns: each turn has a fixed cost (queries, savepoints, the job's
            # hand-over), which at one turn per commit took more than the events themselves.
            # Past the lag target, turns follow each other without a pause.
            wait = self._last_turn + _BUSY_TURN_S - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
        outcomes = await self.store.write_inline(
            lambda db: self._apply_batch(db, reactor), ride_along_s=ride
        )
        for reason in self._replays:  # this batch's, now committed
            self._count_replay(reason)
        self._report(outcomes)
        if outcomes:
            for hook in list(self.after_commit):
                hook()
        return len(outcomes)

    async def observe_fact(self, fact: Fact) -> list[Transition]:
        """Apply one fact from a poll (or a submission) the way an event's fact is applied."""
        reactor = self.reactor
        fact = cap_time(fact, int(time.time() * 1000))
        _, transitions, lines = await self.store.write(lambda db: apply_fact(db, fact, reactor))
        for message, fields in lines:
            log.info(message, **fields)
        for t in transitions:
            self._count_transition(t)
        if transitions:
            log.info(
                "fact applied",
                transactionId=fact.transaction_id,
                source=fact.source,
                triggers=[t.key for t in transitions],
            )
        for hook in list(self.after_commit):
            hook()
        return transitions

    def _share(self, db: Db, arrived: int, now: float) -> tuple[float, int]:
        """This batch's time budget, and how many events it handles whatever the time."""
        if time.monotonic() - self._arrived_at > _QUIET_S:
            self._behind = False
            return self.drain_time_s, 1
        received = _ms(oldest_pending_received_at(db))
        lag_s = time.time() - received / 1000 if received is not None else 0.0
        budget = min(self.batch_time_s, self.busy_share * (now - self._last_turn))
        self._behind = lag_s > self.lag_target_s
        # At least one event a turn: behind with no new arrival must still make progress.
        return budget, max(1, 2 * arrived) if self._behind else 1

    def _apply_batch(self, db: Database, reactor: Reactor | None) -> list[_Outcome]:
        started = time.perf_counter()
        self._replays = []  # a batch given back and applied again counts only once committed
        # Deliveries stored since the last batch: the ingestion going on right now.
        arrived, self._arrived = self._arrived, 0
        budget, floor = self._share(db, arrived, started)
        fit = int(budget / self._event_cost_s) + 1
        events = pending_events(db, limit=min(self.batch_size, max(floor, fit)))
        if not events:
            self._last_turn = time.perf_counter()
            return []
        outcomes = self._apply_events(db, events, reactor, floor, started + budget)
        mark_events(db, [(o.event.seq, o.status, o.error) for o in outcomes])
        self._last_turn = time.perf_counter()
        cost = (self._last_turn - started) / len(outcomes)
        self._event_cost_s = max(1e-5, 0.8 * self._event_cost_s + 0.2 * cost)
        return outcomes

    def _apply_events(
        self,
        db: Database,
        events: list[StoredEvent],
        reactor: Reactor | None,
        floor: int,
        deadline: float,
    ) -> list[_Outcome]:
        """Apply events in order until the deadline (at least `floor`), all under one savepoint,
        the deposit and fact rows written at the end (`BatchWrites`). If an event raises, all
        of it is undone and the events up to that one are applied again each under its own
        savepoint (`_apply_isolated`), and the rest while time is left: the one that fails is
        marked failed, the others commit."""
        conn = db.conn
        batch = BatchWrites.read(db, events, defer=True)
        outcomes: list[_Outcome] = []
        tried = 0
        try:
            with savepoint(conn, "batch"):
                for event in events:
                    if tried >= floor and time.perf_counter() > deadline:
                        break
                    tried += 1
                    outcomes.append(self._apply_event(db, event, reactor, batch))
                batch.flush(db)
        except (StoreBusy, StoreUnavailable):
            raise  # the store itself is failing: give the whole batch back
        except Exception as exc:
            if not conn.in_transaction:
                raise
            self._replays.append(
                "booking_missed" if isinstance(exc, BookingMissed) else "event_failed"
            )
            # The batch's writes are undone: apply the events again, one savepoint each.
            return self._apply_isolated(db, events, reactor, max(floor, tried), deadline)
        return outcomes

    def _count_replay(self, reason: str) -> None:
        self.replayed[reason] += 1
        if self.metrics is not None:
            self.metrics.batches_replayed.labels(reason=reason).inc()

    def _apply_isolated(
        self,
        db: Database,
        events: list[StoredEvent],
        reactor: Reactor | None,
        floor: int,
        deadline: float,
    ) -> list[_Outcome]:
        """Apply each event under its own savepoint (at least `floor`, then until the
        deadline): one that raises is undone and marked failed, the others are applied."""
        conn = db.conn
        batch = BatchWrites.read(db, events, defer=False)
        outcomes: list[_Outcome] = []
        for event in events:
            if len(outcomes) >= floor and time.perf_counter() > deadline:
                break
            try:
                with savepoint(conn, "event"):
                    outcome = self._apply_event(db, event, reactor, batch)
            except (StoreBusy, StoreUnavailable):
                raise
            except Exception as exc:
                if not conn.in_transaction:
                    raise
                batch.forget()  # its writes are undone: read the rows again
                outcome = _Outcome(event, "failed", error=_describe(exc))
            outcomes.append(outcome)
        return outcomes

    def _apply_event(
        self,
        db: Database,
        event: StoredEvent,
        reactor: Reactor | None,
        batch: BatchWrites | None = None,
    ) -> _Outcome:
        envelope = WebhookEnvelope.model_validate(jsonio.loads(event.body))
        if envelope.eventType == EventType.WALLET_ADDRESS_UPDATED.value:
            apply_address_update(db, AddressUpdatedData.model_validate(envelope.data))
            return _Outcome(event, "processed")
        if envelope.eventType == EventType.ABNORMAL_FUND_NOTIFICATION.value:
            for hint in self.abnormal_hints:
                hint()
            return _Outcome(event, "processed")
        if envelope.eventType in ORDER_KINDS:
            apply_order_event(db, envelope)
            return _Outcome(event, "processed")
        received = _ms(event.received_at)
        fact = fact_from_event(envelope, received_at=received, signed_at=event.signed_at())
        if fact is None:
            return _Outcome(event, "ignored")
        if received is not None:
            fact = cap_time(fact, received)
        _, transitions, lines = apply_fact(db, fact, reactor, batch)
        return _Outcome(event, "processed", transitions, lines=lines)

    def _report(self, outcomes: list[_Outcome]) -> None:
        """One summary line per batch at info; at debug, a line per event (eventId, eventType,
        transactionId, outcome) and the reactor's lines; a failed event always has its own
        warning. Counters."""
        if not outcomes:
            return
        logger = log.bind()  # resolve the lazy logger once per batch, not per line
        detail = _debug_enabled(logger)
        counts: Counter[tuple[str, str]] = Counter()
        statuses: Counter[str] = Counter()
        triggers: Counter[str] = Counter()
        reactions: Counter[str] = Counter()
        for outcome in outcomes:
            event = outcome.event
            for message, extra in outcome.lines:
                reactions[message] += 1
                if detail:
                    logger.debug(message, **extra)
            for t in outcome.transitions:
                triggers[t.trigger.value] += 1
                self._count_transition(t)
            if outcome.error or detail:
                fields: dict[str, Any] = {
                    "eventId": event.event_id,
                    "eventType": event.event_type,
                    "transactionId": event.transaction_id,
                    "outcome": outcome.status,
                }
                if outcome.transitions:
                    fields["triggers"] = [t.key for t in outcome.transitions]
                if outcome.error:
                    logger.warning("event failed", error=outcome.error, **fields)
                else:
                    logger.debug("event", **fields)
            statuses[outcome.status] += 1
            counts[event_type_label(event.event_type), outcome.status] += 1
        logger.info(
            "events applied",
            events=len(outcomes),
            outcomes=dict(statuses),
            triggers=dict(triggers),
            reactions=dict(reactions),
        )
        if self.metrics is not None:
            for (label, status), n in counts.items():
                self.metrics.events_processed.labels(event_type=label, outcome=status).inc(n)

    def _count_transition(self, transition: Transition) -> None:
        if self.metrics is not None:
            self.metrics.transitions.labels(trigger=transition.trigger.value).inc()
