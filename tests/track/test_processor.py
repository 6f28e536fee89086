"""The processor: inbox order, idempotence under any delivery order, one transaction per event."""

from __future__ import annotations

import asyncio
import io
import json
import random
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import sqlite_utils
from structlog.testing import capture_logs

from tests.support.stores import StoreMaker
from worker.clock import utc_now
from worker.errors import StorageError
from worker.logs import LogLine, configure
from worker.provider.jsonio import dumpb
from worker.provider.models import CreditStatus, OrderStatus, WhiteListStatus
from worker.store.errors import StoreBusy, StoreError, StoreIntegrityError, StoreUnavailable
from worker.store.sqlitestore import Store, event_row
from worker.track import processor as processor_mod
from worker.track.batch import Reaction
from worker.track.processor import Processor
from worker.track.tracker import Deposit, Fact, Transition

T0 = 1_700_000_000_000
FROM = "TQ5aXj8Tq6u2pG2Lw6xXw9zC3vGmZ5a1bB"


class RecordingReactor:
    """Records every trigger it is handed, inside the processor's transaction."""

    def __init__(self, fail_on: str | None = None, exc: type[Exception] = ValueError) -> None:
        self.seen: list[tuple[str, str]] = []
        self.fail_on = fail_on
        self.exc = exc

    def react(
        self,
        db: sqlite_utils.Database,
        deposit: Deposit,
        transitions: list[Transition],
        fact: Fact,
        reaction: Reaction,
    ) -> None:
        """Record the transitions (and write a row, to prove it shares the transaction)."""
        if self.fail_on and fact.event_id == self.fail_on:
            db.execute("INSERT INTO ledger (transaction_id) VALUES (?)", [deposit.transaction_id])
            raise self.exc("reactor refused")
        self.seen.extend((deposit.transaction_id, t.key) for t in transitions)


def envelope(
    event_type: str,
    tx: str,
    t: int,
    *,
    status: str = "PROCESSING",
    event_id: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A deposit webhook envelope observed at T0 + t."""
    return {
        "eventId": event_id or uuid.uuid4().hex,
        "eventType": event_type,
        "referenceId": tx,
        "status": status,
        "timestamp": T0 + t,
        "data": {
            "transactionId": tx,
            "transactionHash": "0xabc",
            "amount": "12.5",
            "currency": "USDT",
            "network": "TRON",
            "fromAddress": FROM,
            "walletId": 1001,
            "walletName": "main",
            "status": status,
            "timestamp": T0 + t,
            "whiteListStatus": None,
            **extra,
        },
    }


def lifecycle(tx: str) -> list[dict[str, Any]]:
    """A whitelisted deposit: required, rejected, credited after resubmission, completed."""
    return [
        envelope("DEPOSIT_WHITELIST_REQUIRED", tx, 1, whiteListStatus="init"),
        envelope("DEPOSIT_WHITELIST_FAILED", tx, 3, whiteListStatus="rejected", failMessage="bad"),
        envelope("DEPOSIT_WHITELIST_CREDITED", tx, 5, whiteListStatus="approved"),
        envelope("DEPOSIT_ORDER_NOTIFICATION", tx, 6, status="SUCCESS", whiteListStatus="approved"),
    ]


async def deliver(store: Store, ev: dict[str, Any]) -> bool:
    """Store an event as ingress does."""
    return await store.queue_event(
        event_row(
            ev["eventId"],
            ev["eventType"],
            ev.get("referenceId"),
            ev["data"].get("transactionId"),
            dumpb(ev),
            {},
            utc_now(),
        )
    )


async def tracked(store: Store, tx: str) -> dict[str, Any]:
    """The comparable part of a deposit row."""
    row = await store.read(
        lambda db: db.execute(
            "SELECT state, status, white_list_status, credit_status, amount, fail_message,"
            " wallet_id, from_address FROM deposits WHERE transaction_id = ?",
            [tx],
        ).fetchone()
    )
    return dict(row)


async def test_in_order_lifecycle(store: Store) -> None:
    """Delivered in order, a whitelisted deposit ends completed with each trigger once."""
    reactor = RecordingReactor()
    processor = Processor(store, reactor=reactor)
    for ev in lifecycle("tx-a"):
        await deliver(store, ev)
    assert await processor.run_until_idle() == 4
    assert [k for _, k in reactor.seen] == ["needs_details", "rejected", "credited", "completed"]
    assert await tracked(store, "tx-a") == {
        "state": "completed",
        "status": OrderStatus.SUCCESS.value,
        "white_list_status": WhiteListStatus.APPROVED.value,
        "credit_status": CreditStatus.CREDITED.value,
        "amount": "12.5",
        "fail_message": "bad",
        "wallet_id": 1001,
        "from_address": FROM,
    }


@pytest.mark.parametrize("seed", range(12))
async def test_shuffled_and_doubled_delivery_ends_the_same(tmp_path: Path, seed: int) -> None:
    """Any order, each event twice (and resent under new ids): same end state, triggers once."""
    rng = random.Random(seed)
    reference = Store(tmp_path / "ref.db")
    await reference.open()
    for ev in lifecycle("tx"):
        await deliver(reference, ev)
    await Processor(reference).run_until_idle()
    expected = await tracked(reference, "tx")
    await reference.close()

    store = Store(tmp_path / "shuffled.db")
    await store.open()
    reactor = RecordingReactor()
    processor = Processor(store, reactor=reactor, batch_size=rng.choice([1, 3, 100]))
    events = lifecycle("tx")
    # Redelivery (same eventId) and a provider resend of the same fact (new eventId).
    resent = [{**ev, "eventId": ev["eventId"] + "-resent"} for ev in events]
    deliveries = [*events, *events, *resent]
    rng.shuffle(deliveries)
    new = 0
    for ev in deliveries:
        new += await deliver(store, ev)
        if rng.random() < 0.4:
            await processor.run_until_idle()
    await processor.run_until_idle()
    assert new == 8  # duplicates stopped at the door
    assert await tracked(store, "tx") == expected
    keys = Counter(k for _, k in reactor.seen)
    assert all(n == 1 for n in keys.values()), keys
    assert keys["credited"] == 1 and keys["completed"] == 1
    counts = await store.read(
        lambda db: db.execute(
            "SELECT (SELECT COUNT(*) FROM facts), (SELECT COUNT(*) FROM events"
            " WHERE status = 'processed')"
        ).fetchone()
    )
    assert tuple(counts) == (8, 8)  # every stored event applied exactly once
    await store.close()


@pytest.mark.parametrize("exc", [ValueError, StoreIntegrityError, StoreError])
async def test_reactor_failure_rolls_back_that_event_only(
    store: Store, exc: type[Exception]
) -> None:
    """An event whose handling raises (a bug, a statement the database refuses for this
    event's data) is marked failed with no trace; the others go on."""
    first, second = lifecycle("tx-f")[:2]
    other = envelope("DEPOSIT_WHITELIST_REQUIRED", "tx-ok", 1)
    reactor = RecordingReactor(fail_on=first["eventId"], exc=exc)
    processor = Processor(store, reactor=reactor)
    for ev in (first, other):
        await deliver(store, ev)
    assert await processor.run_until_idle() == 2
    rows = await store.read(
        lambda db: db.execute("SELECT event_id, status, error FROM events ORDER BY seq").fetchall()
    )
    assert [tuple(r) for r in rows] == [
        (first["eventId"], "failed", f"{exc.__name__}: reactor refused"),
        (other["eventId"], "processed", None),
    ]
    leftovers = await store.read(
        lambda db: db.execute(
            "SELECT (SELECT COUNT(*) FROM deposits WHERE transaction_id = 'tx-f'),"
            " (SELECT COUNT(*) FROM facts WHERE transaction_id = 'tx-f'),"
            " (SELECT COUNT(*) FROM ledger)"
        ).fetchone()
    )
    assert tuple(leftovers) == (0, 0, 0)
    # Later events of the same deposit still apply.
    await deliver(store, second)
    await processor.run_until_idle()
    assert (await tracked(store, "tx-f"))["state"] == "rejected"


async def test_failure_mid_batch_applies_the_others_once(store: Store) -> None:
    """A failing event between others in one batch: the others are applied exactly once."""
    before = envelope("DEPOSIT_WHITELIST_REQUIRED", "tx-a", 1)
    failing = envelope("DEPOSIT_WHITELIST_REQUIRED", "tx-f", 2)
    after = envelope("DEPOSIT_WHITELIST_REQUIRED", "tx-b", 3)
    # A long turn: the batch takes all three however slow the machine is right now.
    reactor = RecordingReactor(fail_on=failing["eventId"])
    processor = Processor(store, reactor=reactor, drain_time_s=10.0)
    for ev in (before, failing, after):
        await deliver(store, ev)
    assert await processor.process_batch() == 3
    rows = await store.read(
        lambda db: db.execute(
            "SELECT e.transaction_id, e.status, (SELECT COUNT(*) FROM facts f"
            " WHERE f.transaction_id = e.transaction_id) FROM events e ORDER BY seq"
        ).fetchall()
    )
    assert [tuple(r) for r in rows] == [
        ("tx-a", "processed", 1),
        ("tx-f", "failed", 0),
        ("tx-b", "processed", 1),
    ]
    assert (await tracked(store, "tx-b"))["state"] == "needs_details"


async def test_failure_between_events_of_one_deposit_keeps_the_others(store: Store) -> None:
    """One deposit's events in one batch, the second failing: the deposit ends as if it never
    came, one fact per applied event, and it is the only event failed."""
    required, rejected, credited, completed = lifecycle("tx-m")
    other = envelope("DEPOSIT_WHITELIST_REQUIRED", "tx-n", 2)
    reactor = RecordingReactor(fail_on=rejected["eventId"])
    processor = Processor(store, reactor=reactor, drain_time_s=10.0)  # one turn takes all five
    for ev in (required, other, rejected, credited, completed):
        await deliver(store, ev)
    assert await processor.process_batch() == 5
    rows = await store.read(
        lambda db: db.execute("SELECT transaction_id, status FROM events ORDER BY seq").fetchall()
    )
    assert [tuple(r) for r in rows] == [
        ("tx-m", "processed"),
        ("tx-n", "processed"),
        ("tx-m", "failed"),
        ("tx-m", "processed"),
        ("tx-m", "processed"),
    ]
    facts = await store.read(
        lambda db: db.execute(
            "SELECT transaction_id, COUNT(*) FROM facts GROUP BY transaction_id ORDER BY 1"
        ).fetchall()
    )
    assert [tuple(r) for r in facts] == [("tx-m", 3), ("tx-n", 1)]
    deposit = await tracked(store, "tx-m")
    assert (deposit["state"], deposit["fail_message"]) == ("completed", None)
    booked = await store.read(lambda db: db.execute("SELECT COUNT(*) FROM ledger").fetchone()[0])
    assert booked == 0  # the failing event's write is undone


@pytest.mark.parametrize("exc", [StoreBusy, StoreUnavailable])
async def test_storage_failure_leaves_events_pending(store: Store, exc: type[StoreError]) -> None:
    """The store failing mid-batch (busy, unavailable) rolls the batch back: events stay
    pending, nothing applied."""
    ev = lifecycle("tx-s")[0]
    reactor = RecordingReactor(fail_on=ev["eventId"], exc=exc)
    processor = Processor(store, reactor=reactor)
    await deliver(store, ev)
    with pytest.raises(StorageError):
        await processor.run_until_idle()
    status = await store.read(lambda db: db.execute("SELECT status FROM events").fetchone()[0])
    assert status == "pending"
    assert (
        await store.read(lambda db: db.execute("SELECT COUNT(*) FROM deposits").fetchone()[0]) == 0
    )
    reactor.fail_on = None  # the disk is back
    assert await processor.run_until_idle() == 1
    assert reactor.seen == [("tx-s", "needs_details")]


class LoggingReactor(RecordingReactor):
    """Hands back one line to log per reaction, like the rules reactor's "booked"."""

    def react(
        self,
        db: sqlite_utils.Database,
        deposit: Deposit,
        transitions: list[Transition],
        fact: Fact,
        reaction: Reaction,
    ) -> list[LogLine]:
        super().react(db, deposit, transitions, fact, reaction)
        return [("reacted", {"transactionId": deposit.transaction_id})]


async def test_reactor_lines_are_logged_only_once_committed(store: Store) -> None:
    """A batch that SQLite rolls back logs none of its reactor lines; the redo logs them once."""
    ok, failing = envelope("DEPOSIT_WHITELIST_REQUIRED", "tx-l1", 1), lifecycle("tx-l2")[0]
    reactor = LoggingReactor(fail_on=failing["eventId"], exc=StoreUnavailable)
    processor = Processor(store, reactor=reactor)
    for ev in (ok, failing):
        await deliver(store, ev)
    with capture_logs() as logs, pytest.raises(StorageError):
        await processor.run_until_idle()
    assert [line for line in logs if line["event"] == "reacted"] == []
    reactor.fail_on = None
    with capture_logs() as logs:
        assert await processor.run_until_idle() == 2
    assert [line["transactionId"] for line in logs if line["event"] == "reacted"] == [
        "tx-l1",
        "tx-l2",
    ]


async def test_malformed_deposit_event_fails_without_echoing_data(store: Store) -> None:
    """Deposit data that does not validate marks the event failed; the error names fields only."""
    ev = envelope("DEPOSIT_WHITELIST_REQUIRED", "tx-m", 1)
    del ev["data"]["walletId"]
    ev["data"]["amount"] = "secret-looking-value"
    await deliver(store, ev)
    await Processor(store).run_until_idle()
    error = await store.read(lambda db: db.execute("SELECT error FROM events").fetchone()[0])
    assert error.startswith("invalid event: ")
    assert "walletId" in error and "amount" in error
    assert "secret-looking-value" not in error and FROM not in error


async def test_non_deposit_events(store: Store) -> None:
    """Known non-deposit events are ignored; WALLET_ADDRESS_UPDATED updates the address row."""

    def addr(status: str, t: int) -> dict[str, Any]:
        return {
            "eventId": uuid.uuid4().hex,
            "eventType": "WALLET_ADDRESS_UPDATED",
            "timestamp": T0 + t,
            "data": {"id": "a-1", "walletAddress": FROM, "network": "TRON", "status": status},
        }

    stable = {"eventId": "s-1", "eventType": "STABLE_ORDER_UPDATED", "data": {"orderId": "o"}}
    gone = {**addr("DISABLED", 4), "data": {**addr("DISABLED", 4)["data"], "id": "a-2"}}
    late = {**addr("ACTIVE", 5), "data": {**addr("ACTIVE", 5)["data"], "id": "a-2"}}
    for ev in (stable, addr("PROCESSING", 1), addr("ACTIVE", 2), addr("PROCESSING", 3), gone, late):
        await store.queue_event(
            event_row(ev["eventId"], ev["eventType"], None, None, dumpb(ev), {}, utc_now())
        )
    await Processor(store).run_until_idle()
    rows = await store.read(
        lambda db: [
            tuple(r) for r in db.execute("SELECT event_type, status FROM events ORDER BY seq")
        ]
    )
    assert (
        rows
        == [("STABLE_ORDER_UPDATED", "processed")] + [("WALLET_ADDRESS_UPDATED", "processed")] * 5
    )
    addresses = await store.read(
        lambda db: [tuple(r) for r in db.execute("SELECT id, status FROM addresses ORDER BY id")]
    )
    # A late PROCESSING does not undo the review; a late ACTIVE does not undo a disable.
    assert addresses == [("a-1", "ACTIVE"), ("a-2", "DISABLED")]


async def test_observe_fact_feeds_the_same_path(store: Store) -> None:
    """A poll fact creates/updates the deposit and reacts once; the same fact again is inert
    and not stored again."""
    reactor = RecordingReactor()
    processor = Processor(store, reactor=reactor)
    fact = Fact(
        transaction_id="tx-p",
        source="poll",
        observed_at=T0,
        status=OrderStatus.PROCESSING,
        white_list_status=WhiteListStatus.INIT,
        wallet_id=7,
        currency="USDC",
        network="ETH",
        amount=None,
    )
    first = await processor.observe_fact(fact)
    again = await processor.observe_fact(fact)
    assert [t.key for t in first] == ["needs_details"]
    assert again == []
    facts = await store.read(
        lambda db: [
            (r["source"], r["changed"], json.loads(r["fact"])["white_list_status"])
            for r in db.execute("SELECT * FROM facts ORDER BY id")
        ]
    )
    assert facts == [("poll", 1, "init")]
    # A webhook for the same deposit afterwards does not fire needs_details again.
    await deliver(store, lifecycle("tx-p")[0])
    await processor.run_until_idle()
    assert reactor.seen == [("tx-p", "needs_details")]


async def test_one_log_line_per_event_without_payer_data(store: Store) -> None:
    """Each event logs eventId, eventType, transactionId and outcome; no addresses, no amounts."""
    events = lifecycle("tx-l")[:2]
    for ev in events:
        await deliver(store, ev)
    with capture_logs() as logs:
        await Processor(store).run_until_idle()
    lines = [entry for entry in logs if entry["event"] == "event"]
    assert [(e["eventId"], e["outcome"]) for e in lines] == [
        (ev["eventId"], "processed") for ev in events
    ]
    for entry in lines:
        assert entry["eventType"] and entry["transactionId"] == "tx-l"
        assert FROM not in str(entry) and "12.5" not in str(entry)


async def test_info_level_logs_one_summary_line_per_batch(store: Store) -> None:
    """At info, a batch writes one summary line (events, outcomes, triggers), no line per event."""
    events = lifecycle("tx-sum")[:2]
    for ev in events:
        await deliver(store, ev)
    out = io.StringIO()
    configure("json", "info", stream=out)
    assert await Processor(store).run_until_idle() == 2
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line["event"] for line in lines] == ["events applied"]
    assert lines[0]["events"] == 2 and lines[0]["outcomes"] == {"processed": 2}
    assert lines[0]["triggers"] == {"needs_details": 1, "rejected": 1}


async def test_background_loop_wakes_and_stops(store: Store) -> None:
    """Started, the processor handles a woken insert promptly and stops cleanly."""
    processor = Processor(store, sweep_interval_s=30)
    processor.start()
    await deliver(store, lifecycle("tx-w")[0])
    processor.wake()
    for _ in range(200):
        status = await store.read(lambda db: db.execute("SELECT status FROM events").fetchone()[0])
        if status == "processed":
            break
        await asyncio.sleep(0.01)
    assert status == "processed"
    await processor.stop()
    assert not processor.running


async def test_a_failed_batch_does_not_stop_the_loop(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fault outside any one event is logged; the loop retries at the next sweep."""
    real = processor_mod.pending_events
    calls = 0

    def failing_once(db: sqlite_utils.Database, *, limit: int = 100) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("injected fault")
        return real(db, limit=limit)

    monkeypatch.setattr(processor_mod, "pending_events", failing_once)
    await deliver(store, lifecycle("tx-f")[0])
    processor = Processor(store, sweep_interval_s=0.05)
    with capture_logs() as logs:
        processor.start()
        for _ in range(200):
            status = await store.read(
                lambda db: db.execute("SELECT status FROM events").fetchone()[0]
            )
            if status == "processed":
                break
            await asyncio.sleep(0.01)
        assert processor.running
        await processor.stop()
    assert status == "processed"
    failed = [e for e in logs if e["event"] == "processing paused: batch failed"]
    assert [e["error"] for e in failed] == ["RuntimeError: injected fault"]


async def test_short_turns_while_deliveries_arrive(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While deliveries arrive a batch takes a short turn; once they stop, a full batch."""
    monkeypatch.setattr(processor_mod, "_QUIET_S", 0.5)  # room for a slow machine
    for n in range(6):
        await deliver(store, envelope("DEPOSIT_WHITELIST_REQUIRED", f"tx-t{n}", 1))
    # A drain turn long enough for the five on a loaded machine (its default, 40 ms, took three
    # of them on PostgreSQL under load): what is tested is short turn, then full turn.
    processor = Processor(store, busy_share=0.0, batch_time_s=10.0, drain_time_s=10.0)
    processor.wake()  # a delivery just arrived
    assert await processor.process_batch() == 1
    await asyncio.sleep(0.6)
    assert await processor.process_batch() == 5


async def deliver_late(store: Store, count: int, prefix: str) -> None:
    """Store `count` deposit events received long ago (a lag far past any target)."""
    for n in range(count):
        ev = envelope("DEPOSIT_WHITELIST_REQUIRED", f"{prefix}{n}", 1)
        await store.queue_event(
            event_row(
                ev["eventId"],
                ev["eventType"],
                None,
                f"{prefix}{n}",
                dumpb(ev),
                {},
                "2020-01-01T00:00:00Z",
            )
        )


async def test_lag_over_target_takes_twice_the_arrivals(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the lag target a batch handles at least twice the deliveries that arrived."""
    # Deliveries count as still arriving however slowly this machine gets to the batch (past
    # the quiet time the processor drains instead, which is another test's).
    monkeypatch.setattr(processor_mod, "_QUIET_S", 60.0)
    await deliver_late(store, 12, "tx-g")
    processor = Processor(store, busy_share=0.0, lag_target_s=60.0)
    for _ in range(4):
        processor.wake()
    assert await processor.process_batch() == 8


async def test_behind_with_no_new_arrival_still_makes_progress(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the lag target, a turn after which nothing new arrived still handles an event
    (it once handled none, and the processor stopped on a division by zero)."""
    monkeypatch.setattr(processor_mod, "_QUIET_S", 60.0)  # as above: still arriving
    await deliver_late(store, 3, "tx-z")
    processor = Processor(store, busy_share=0.0, lag_target_s=60.0)
    processor.wake()
    assert await processor.process_batch() == 2  # behind now: twice the one arrival
    assert await processor.process_batch() == 1  # no arrival since, still behind


@pytest.mark.parametrize("engine", ["postgres"])
async def test_two_instances_apply_each_event_once_in_order(make_store: StoreMaker) -> None:
    """Two instances on one PostgreSQL database, deliveries spread over both: every event is
    applied once, and each deposit's triggers come once each, in the order they happened."""
    stores = [make_store("shared.db"), make_store("shared.db")]
    for s in stores:
        await s.open()
    try:
        reactor = RecordingReactor()  # shared: the order of each deposit's triggers
        processors = [Processor(s, reactor=reactor, batch_size=5) for s in stores]
        deposits = [f"tx-{i}" for i in range(12)]
        for step in range(4):  # every deposit's events pending at once, spread over both
            for i, tx in enumerate(deposits):
                await deliver(stores[(i + step) % 2], lifecycle(tx)[step])
        for _ in range(4):
            await asyncio.gather(*(p.run_until_idle() for p in processors))
        for tx in deposits:
            assert [k for t, k in reactor.seen if t == tx] == [
                "needs_details",
                "rejected",
                "credited",
                "completed",
            ]
        counts = await stores[0].read(
            lambda db: db.execute(
                "SELECT (SELECT COUNT(*) FROM facts), (SELECT COUNT(*) FROM events"
                " WHERE status = 'processed')"
            ).fetchone()
        )
        assert tuple(counts) == (48, 48)
    finally:
        for s in stores:
            await s.close()
