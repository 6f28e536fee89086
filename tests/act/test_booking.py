"""Booking safety against a programmable fake provider on loopback and a real store: an answer
about another transactionId, a txHash booked twice, `book` outside credit, impossible amounts,
far-future times, and fixed fields that a later fact contradicts."""

from __future__ import annotations

import argparse
import asyncio
import io
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from tests.support.booking import (
    BOOK_ON_CREDITED,
    FROM,
    NOW,
    Env,
    alerts,
    deliver,
    fact_of,
    ok,
    order,
    page_body,
    rows,
    webhook,
)
from tests.support.configs import make_config, write_config
from tests.support.stores import StoreMaker
from worker.act.kinds import SPECS
from worker.act.kinds.book import WAITING_FOR_TX_HASH, book_checked
from worker.act.kinds.submit import Submitter
from worker.act.queue import ActionRows
from worker.act.reactor import RuleReactor
from worker.clock import iso_from_ms, now_ms, utc_now
from worker.commands.cli import main
from worker.commands.ops import status_report
from worker.commands.resolve import _resolve
from worker.config.profiles import Profiles
from worker.errors import ConfigError, ProviderAnswerMismatch, StorageError
from worker.provider import jsonio
from worker.provider.models import WhiteListStatus
from worker.rules import RuleBook
from worker.rules.fingerprint import rules_hash
from worker.rules.model import ANY_WALLET, Action, Conditions, Rule, RuleSet
from worker.store import journal
from worker.store.conflicts import insert_conflict, record_decision
from worker.store.deposits import lock_deposit
from worker.store.ledger import insert_booking, lock_tx_hash
from worker.store.pg import PgDatabase
from worker.store.pg import connect as pg_connect
from worker.store.pgstore import PgStore
from worker.store.sqlitestore import Store, event_row
from worker.track.batch import Bookings
from worker.track.conflicts import DUPLICATE
from worker.track.processor import Processor
from worker.track.tracker import Deposit, Fact, State

FAILED = "failed, not credited"


# --- 1: one deposit booked twice ----------------------------------------------------------------


async def test_detail_about_another_transaction_id_records_nothing_and_alerts(env: Env) -> None:
    """A detail answer labelled `txa` for `TXA` is not tracked or booked; a critical alert."""
    # Submitted and under review: a deposit in motion, which the detail poll reads.
    await env.processor.observe_fact(fact_of(order("TXA", whiteListStatus="pending")))
    credited = order("txa", transactionHash="0xhash-txa", status="SUCCESS", creditStatus="CREDITED")
    env.provider.details["TXA"] = ok(credited)
    await env.poller.poll_detail()
    assert [r["transaction_id"] for r in await rows(env.store, "SELECT * FROM deposits")] == ["TXA"]
    assert await rows(env.store, "SELECT * FROM ledger") == []
    assert await rows(env.store, "SELECT * FROM facts WHERE transaction_id='txa'") == []
    assert ("TXA", "detail_mismatch", "critical") in await alerts(env.store)
    with pytest.raises(ProviderAnswerMismatch):
        await env.client.transaction_detail("TXA")  # the submission's detail reads alike


async def test_submission_detail_read_about_another_id_records_nothing_and_alerts(
    env: Env,
) -> None:
    """The detail a submission reads (10000101/10000105/in-flight) labelled `txa` for `TXA`
    records nothing and alerts (critical); the submission treats it as not read."""
    await env.processor.observe_fact(fact_of(order("TXA")))
    env.provider.details["TXA"] = ok(order("txa", status="SUCCESS", creditStatus="CREDITED"))
    rows_ = ActionRows(env.store, backoff_s=1, backoff_max_s=10)
    submitter = Submitter(
        rows_, client=env.client, profiles=Profiles.empty, observe=env.processor.observe_fact
    )
    with pytest.raises(ProviderAnswerMismatch):
        await submitter._refresh("TXA")
    assert [r["transaction_id"] for r in await rows(env.store, "SELECT * FROM deposits")] == ["TXA"]
    assert await rows(env.store, "SELECT * FROM ledger") == []
    assert ("TXA", "detail_mismatch", "critical") in await alerts(env.store)


async def test_a_likely_duplicate_is_held_alerted_once_and_resolve_decides(
    env: Env, tmp_path: Path, capsys: pytest.CaptureFixture[str], make_store: StoreMaker
) -> None:
    """A second transactionId with the txHash (in another case), amount, receiving address and
    currency of a booked deposit is held with one critical alert; `resolve --set duplicate=no`
    books it once under its own id."""
    done = {"status": "SUCCESS", "whiteListStatus": None, "transactionHash": "0xsame"}
    await env.processor.observe_fact(fact_of(order("TXA", **done)))
    await env.processor.observe_fact(fact_of(order("TXB", **{**done, "transactionHash": "0xSAME"})))
    await env.processor.observe_fact(fact_of(order("TXB", **done, updateTime=1_700_000_000_001)))
    ledger = await rows(env.store, "SELECT transaction_id FROM ledger")
    assert ledger == [{"transaction_id": "TXA"}]
    [held, *_] = await rows(
        env.store,
        "SELECT status, outcome FROM actions WHERE action='book' AND transaction_id='TXB'"
        " ORDER BY id",
    )
    assert held["status"] == "skipped"
    assert held["outcome"].startswith("held: likely duplicate of TXA")
    assert [a for a in await alerts(env.store) if a[0] == "TXB"] == [
        ("TXB", "duplicate_tx_hash", "critical")
    ]
    [alert] = await rows(
        env.store,
        "SELECT trigger, params FROM actions WHERE action='alert' AND transaction_id='TXB'",
    )
    assert alert["trigger"] == "credited"  # the trigger of the booking held
    assert jsonio.loads(alert["params"])["detail"] == (
        "txHash 0xSAME is booked for TXA with the same amount, toAddress and currency; TXB is"
        " held as a likely duplicate: depositd resolve TXB --set duplicate=yes|no --by NAME"
    )
    cfg = str(write_config(tmp_path, make_config(make_store.storage("d.db"))))
    assert main(["resolve", "--config", cfg, "TXB"]) == 0
    assert "duplicate: txHash 0xSAME is booked for TXA" in capsys.readouterr().out
    assert main(["resolve", "--config", cfg, "TXB", "--set", "duplicate=no", "--by", "ann"]) == 0
    assert "booked" in capsys.readouterr().out
    ledger = await rows(env.store, "SELECT transaction_id FROM ledger ORDER BY transaction_id")
    assert ledger == [{"transaction_id": "TXA"}, {"transaction_id": "TXB"}]


async def test_a_likely_duplicate_decided_a_duplicate_is_never_booked(
    env: Env, tmp_path: Path, make_store: StoreMaker
) -> None:
    """`resolve --set duplicate=yes`: the second id is never booked, whatever comes later."""
    done = {"status": "SUCCESS", "whiteListStatus": None, "transactionHash": "0xsame"}
    await env.processor.observe_fact(fact_of(order("TXA", **done)))
    await env.processor.observe_fact(fact_of(order("TXB", **done)))
    cfg = str(write_config(tmp_path, make_config(make_store.storage("d.db"))))
    assert main(["resolve", "--config", cfg, "TXB", "--set", "duplicate=yes", "--by", "ann"]) == 0
    await env.processor.observe_fact(fact_of(order("TXB", **done, updateTime=1_700_000_000_009)))
    ledger = await rows(env.store, "SELECT transaction_id FROM ledger")
    assert ledger == [{"transaction_id": "TXA"}]
    [*_, last] = await rows(
        env.store,
        "SELECT status, outcome FROM actions WHERE action='book' AND transaction_id='TXB'"
        " ORDER BY id",
    )
    assert last["status"] == "skipped"
    assert last["outcome"].startswith("not booked: decided a duplicate (depositd resolve)")


@pytest.mark.parametrize(
    ("changes", "label"),
    [
        ({"amount": "100.00"}, "amount written with trailing zeros"),
        ({"toAddress": "tmerchant"}, "toAddress in another case"),
        ({"currency": "usdt"}, "currency in another case"),
        ({"toAddress": None}, "toAddress not known (a deposit webhook does not carry it)"),
    ],
)
async def test_a_likely_duplicate_written_differently_is_held_not_booked_twice(
    env: Env, changes: dict[str, Any], label: str
) -> None:
    """The same txHash, amount, receiving address and currency under a second transactionId,
    written differently ("100.00" for "100", another case) or with the receiving address not
    known (nothing tells the two apart): still a likely duplicate, held; the ledger holds the
    money once."""
    done = {"status": "SUCCESS", "whiteListStatus": None, "transactionHash": "0xsame"}
    await env.processor.observe_fact(fact_of(order("TXA", **done)))
    await env.processor.observe_fact(fact_of(order("TXB", **done, **changes)))
    ledger = await rows(env.store, "SELECT transaction_id FROM ledger")
    assert ledger == [{"transaction_id": "TXA"}], label
    assert ("TXB", "duplicate_tx_hash", "critical") in await alerts(env.store)


async def test_a_credited_deposit_is_booked_once_its_txhash_is_known(env: Env) -> None:
    """A deposit credited before its txHash is known is held (nothing booked, no alert), and
    booked, once, when a later fact states the hash; a second transactionId with that hash,
    amount, address and currency is then held as a likely duplicate."""
    done = {"status": "SUCCESS", "whiteListStatus": None}
    await env.processor.observe_fact(fact_of(order("TXA", **done, transactionHash=None)))
    assert await rows(env.store, "SELECT transaction_id FROM ledger") == []
    assert await alerts(env.store) == []
    later = {**done, "transactionHash": "0xlate", "updateTime": 1_700_000_000_005}
    await env.processor.observe_fact(fact_of(order("TXA", **later)))
    await env.processor.observe_fact(fact_of(order("TXA", **later)))
    await env.processor.observe_fact(fact_of(order("TXB", **later)))
    ledger = await rows(env.store, "SELECT transaction_id, tx_hash, trigger FROM ledger")
    assert ledger == [{"transaction_id": "TXA", "tx_hash": "0xlate", "trigger": "credited"}]
    books = await rows(
        env.store,
        "SELECT trigger, rule_set, rule_set_version, rule, params, status, outcome FROM actions"
        " WHERE action = 'book' AND transaction_id = 'TXA' ORDER BY id",
    )
    held_from = (books[0].pop("rule_set"), books[0].pop("rule_set_version"))
    assert all(held_from) and (books[1].pop("rule_set"), books[1].pop("rule_set_version")) == (
        held_from
    )
    assert books == [
        {
            "trigger": "credited",
            "rule": "book it",
            "params": "{}",
            "status": "skipped",
            "outcome": WAITING_FOR_TX_HASH,
        },
        {
            "trigger": "credited",
            "rule": "book it",
            "params": "{}",
            "status": "done",
            "outcome": "booked (the txHash is known now)",
        },
    ]
    assert ("TXB", "duplicate_tx_hash", "critical") in await alerts(env.store)


@pytest.mark.parametrize("hash_seen", ["0xH", "0xh"])
async def test_a_likely_duplicate_credited_before_its_txhash_is_known_is_held(
    env: Env, hash_seen: str
) -> None:
    """TXA booked with txHash 0xH; TXB credited with no txHash yet (a CREDITED webhook, a
    record without one), same amount, currency and receiving address: TXB is not booked;
    once its next fact brings the hash (in any case) it is held as a likely duplicate of TXA,
    one critical alert, and the ledger holds the money once."""
    done = {"status": "SUCCESS", "whiteListStatus": None}
    await env.processor.observe_fact(fact_of(order("TXA", **done, transactionHash="0xH")))
    await env.processor.observe_fact(fact_of(order("TXB", **done, transactionHash=None)))
    assert await rows(env.store, "SELECT transaction_id FROM ledger") == [{"transaction_id": "TXA"}]
    later = {**done, "transactionHash": hash_seen, "updateTime": 1_700_000_000_005}
    await env.processor.observe_fact(fact_of(order("TXB", **later)))
    assert await rows(env.store, "SELECT transaction_id FROM ledger") == [{"transaction_id": "TXA"}]
    assert [a for a in await alerts(env.store) if a[0] == "TXB"] == [
        ("TXB", "duplicate_tx_hash", "critical")
    ]
    outcomes = await rows(
        env.store, "SELECT outcome FROM actions WHERE action='book' AND transaction_id='TXB'"
    )
    assert outcomes[-1]["outcome"].startswith("held: likely duplicate of TXA")


@pytest.mark.parametrize("together", [True, False], ids=["one batch", "two batches"])
async def test_a_likely_duplicate_credited_by_webhook_before_its_txhash_is_held(
    env: Env, together: bool
) -> None:
    """The webhook batch path: TXB's DEPOSIT_WHITELIST_CREDITED carries no transactionHash,
    its DEPOSIT_ORDER_NOTIFICATION brings TXA's hash; in one batch with TXA's booking or in
    later ones, TXB is held as a likely duplicate and booked nowhere."""
    base = {"whiteListStatus": None}
    await deliver(
        env.store,
        webhook("DEPOSIT_ORDER_NOTIFICATION", "TXA", NOW, status="SUCCESS", transactionHash="0xH"),
    )
    if not together:
        await env.processor.run_until_idle()
    required = webhook("DEPOSIT_WHITELIST_REQUIRED", "TXB", NOW + 1, transactionHash=None)
    await deliver(env.store, required)
    credited = webhook("DEPOSIT_WHITELIST_CREDITED", "TXB", NOW + 2, transactionHash=None)
    await deliver(env.store, credited)
    if not together:
        await env.processor.run_until_idle()
        assert await rows(env.store, "SELECT transaction_id FROM ledger") == [
            {"transaction_id": "TXA"}
        ]
    done = webhook(
        "DEPOSIT_ORDER_NOTIFICATION",
        "TXB",
        NOW + 3,
        status="SUCCESS",
        transactionHash="0xH",
        **base,
    )
    await deliver(env.store, done)
    await env.processor.run_until_idle()
    assert await rows(env.store, "SELECT transaction_id FROM ledger") == [{"transaction_id": "TXA"}]
    assert ("TXB", "duplicate_tx_hash", "critical") in await alerts(env.store)
    # The booking held for the txHash is made again, as the credited event's, once it is known.
    [again] = await rows(
        env.store,
        "SELECT trigger, event_id, status FROM actions WHERE action = 'book'"
        " AND transaction_id = 'TXB' AND outcome LIKE '%(the txHash is known now)'",
    )
    assert again == {"trigger": "credited", "event_id": credited["eventId"], "status": "skipped"}


async def test_two_deposits_of_one_on_chain_transaction_are_both_booked(env: Env) -> None:
    """A batch transfer: transactionIds the provider lists with one txHash and an amount or a
    receiving address of their own are deposits of their own, each booked once, no alert."""
    done = {"status": "SUCCESS", "whiteListStatus": None, "transactionHash": "0xbatch"}
    await env.processor.observe_fact(fact_of(order("TXA", **done, amount="500")))
    await env.processor.observe_fact(fact_of(order("TXB", **done, amount="250")))
    await env.processor.observe_fact(fact_of(order("TXC", **done, amount="500", toAddress="T2")))
    ledger = await rows(env.store, "SELECT transaction_id, amount FROM ledger ORDER BY 1")
    assert ledger == [
        {"transaction_id": "TXA", "amount": "500"},
        {"transaction_id": "TXB", "amount": "250"},
        {"transaction_id": "TXC", "amount": "500"},
    ]
    assert await alerts(env.store) == []


async def test_one_batch_books_each_deposit_once_and_holds_a_likely_duplicate_in_it(
    env: Env,
) -> None:
    """Deposits applied in one processor batch (which counts on its bookings and checks them at
    its end): a second transactionId with the txHash, amount and currency of one booked earlier
    in the same batch is held as a likely duplicate and alerted, a third with the same txHash
    and another amount (a batch transfer's other output) is booked, and the others are booked
    once each."""
    credited = {"status": "SUCCESS", "whiteListStatus": None}
    await deliver(env.store, webhook("DEPOSIT_ORDER_NOTIFICATION", "TX1", NOW, **credited))
    same = {**credited, "transactionHash": "0xshared"}
    await deliver(env.store, webhook("DEPOSIT_ORDER_NOTIFICATION", "TXA", NOW + 1, **same))
    await deliver(env.store, webhook("DEPOSIT_ORDER_NOTIFICATION", "TXB", NOW + 2, **same))
    other = {**same, "amount": "7.5"}
    await deliver(env.store, webhook("DEPOSIT_ORDER_NOTIFICATION", "TXC", NOW + 3, **other))
    await deliver(env.store, webhook("DEPOSIT_ORDER_NOTIFICATION", "TX2", NOW + 4, **credited))
    assert await env.processor.run_until_idle() == 5
    ledger = await rows(env.store, "SELECT transaction_id FROM ledger ORDER BY transaction_id")
    assert [r["transaction_id"] for r in ledger] == ["TX1", "TX2", "TXA", "TXC"]
    outcomes = await rows(
        env.store,
        "SELECT transaction_id, status, outcome FROM actions WHERE action='book'"
        " ORDER BY transaction_id",
    )
    assert [(o["transaction_id"], o["outcome"]) for o in outcomes] == [
        ("TX1", "booked"),
        ("TX2", "booked"),
        ("TXA", "booked"),
        (
            "TXB",
            "held: likely duplicate of TXA; waiting for a decision"
            " (depositd resolve TXB --set duplicate=yes|no)",
        ),
        ("TXC", "booked"),
    ]
    assert ("TXB", "duplicate_tx_hash", "critical") in await alerts(env.store)
    assert [e["status"] for e in await rows(env.store, "SELECT status FROM events")] == [
        "processed"
    ] * 5


async def test_a_batch_of_credited_deposits_is_booked_by_its_one_write_as_credited(
    env: Env,
) -> None:
    """Credited deposits with distinct txHashes applied in one batch are booked by the batch's
    write at its end (not applied again one at a time: `depositd_batches_replayed_total` stays
    0), each ledger row holding its own deposit's values, a value not stated included."""
    credited = {"status": "SUCCESS", "whiteListStatus": None}
    deposits = [
        ("TXR0", 1001, "main", "USDT", "TRON", "100.5", "TFrom0", "0xh0"),
        ("TXR1", 1002, "cold", "ETH", "ETH", "0.000001", "0xFrom1", "0xH1"),
        ("TXR2", 1003, "side", "USDC", "BSC", "7", None, "0xh2"),  # its source not stated
    ]
    for i, (tx, wallet, name, currency, network, amount, source, tx_hash) in enumerate(deposits):
        values = {"walletId": wallet, "walletName": name, "currency": currency}
        values |= {"network": network, "amount": amount, "fromAddress": source}
        fact = webhook(
            "DEPOSIT_ORDER_NOTIFICATION", tx, NOW + i, transactionHash=tx_hash, **credited
        )
        fact["data"].update(values)
        await deliver(env.store, fact)
    env.processor.drain_time_s = 60.0  # the three in one batch, however slow the machine
    assert await env.processor.process_batch() == 3
    assert env.processor.replayed == {}, "the batch was applied again one event at a time"
    ledger = await rows(
        env.store,
        "SELECT transaction_id, wallet_id, wallet_name, currency, network, amount,"
        " from_address, tx_hash, trigger FROM ledger ORDER BY transaction_id",
    )
    assert [tuple(str(v) for v in r.values()) for r in ledger] == [
        (*(str(v) for v in d), "credited") for d in deposits
    ]


async def _deposit_before_the_batch(env: Env, tx: str, tx_hash: str) -> None:
    """`tx` tracked (PROCESSING, its txHash stated), not booked."""
    fact = webhook("DEPOSIT_ORDER_NOTIFICATION", tx, NOW - 10, transactionHash=tx_hash)
    fact["data"].update({"status": "PROCESSING", "whiteListStatus": None, "amount": "3"})
    await deliver(env.store, fact)
    assert await env.processor.run_until_idle() == 1


@pytest.mark.parametrize("engine", ["postgres"])
@pytest.mark.parametrize("meanwhile", ["booked_hash", "decided", "booked_without_hash"])
async def test_a_booking_committed_elsewhere_after_the_batch_decided_makes_it_apply_again(
    env: Env, make_store: StoreMaker, monkeypatch: pytest.MonkeyPatch, meanwhile: str
) -> None:
    """PostgreSQL: the batch decides to book from what it read, and its one write at the end
    books only what is still free then. Committed by another session between the batch's
    decision and its write: a booking of the same txHash, a person's decision on the deposit's
    duplicate question, or an older booking without a txHash whose deposit has it. The batch's
    row is not written, the batch is applied again one event at a time, and the deposit is
    held or decided as that path says; never booked twice. (On SQLite nothing can commit
    between the two: the batch holds the database's one writer.)"""
    if meanwhile == "booked_without_hash":
        await _deposit_before_the_batch(env, "TXOLD", "0xrace")
    original = Bookings.flush
    url = make_store.url("d.db")

    def flush(self: Bookings, db: Any) -> None:
        if self.pending:
            other = PgDatabase(pg_connect(url))  # autocommit: each statement commits
            try:
                _commit_meanwhile(other, meanwhile)
            finally:
                other.close()
        original(self, db)

    monkeypatch.setattr(Bookings, "flush", flush)
    credited = {"status": "SUCCESS", "whiteListStatus": None, "transactionHash": "0xrace"}
    await deliver(env.store, webhook("DEPOSIT_ORDER_NOTIFICATION", "TXB", NOW, **credited))
    assert await env.processor.run_until_idle() == 1
    assert env.processor.replayed == {"booking_missed": 1}
    booked = await rows(env.store, "SELECT transaction_id FROM ledger ORDER BY transaction_id")
    assert [r["transaction_id"] for r in booked] == ["TXOLD"] * (meanwhile != "decided")
    (outcome,) = await rows(env.store, "SELECT outcome FROM actions WHERE action='book'")
    if meanwhile == "decided":
        assert outcome["outcome"] == "not booked: decided a duplicate (depositd resolve)"
    else:
        assert outcome["outcome"].startswith("held: likely duplicate of TXOLD"), outcome


@pytest.mark.parametrize("engine", ["postgres"])
async def test_a_batch_waits_for_a_booking_of_its_txhash_in_flight_elsewhere(
    env: Env, make_store: StoreMaker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL: another instance is booking the same txHash when the batch writes (its
    transaction holds the hash, its row not committed yet). The batch waits for it, then
    finds its row: not written, applied again one event at a time, held as a likely
    duplicate. One ledger row."""
    url = make_store.url("d.db")
    other = PgDatabase(pg_connect(url))
    original = Bookings.flush
    committed: list[float] = []

    def commit_later() -> None:
        time.sleep(0.5)
        committed.append(time.monotonic())
        other.execute("COMMIT")

    committer = threading.Thread(target=commit_later)

    def flush(self: Bookings, db: Any) -> None:
        if self.pending and not committer.is_alive() and not committed:
            other.execute("BEGIN")
            lock_tx_hash(other, "0xrace")  # as a booking does, first
            _commit_meanwhile(other, "booked_hash")
            committer.start()
        try:
            original(self, db)
        finally:
            written.append(time.monotonic())

    written: list[float] = []
    monkeypatch.setattr(Bookings, "flush", flush)
    credited = {"status": "SUCCESS", "whiteListStatus": None, "transactionHash": "0xrace"}
    await deliver(env.store, webhook("DEPOSIT_ORDER_NOTIFICATION", "TXB", NOW, **credited))
    try:
        assert await env.processor.run_until_idle() == 1
    finally:
        if committer.is_alive():
            committer.join(10)
        other.close()
    assert committed and written[0] >= committed[0], "the batch wrote before the other's commit"
    assert env.processor.replayed == {"booking_missed": 1}
    booked = await rows(env.store, "SELECT transaction_id FROM ledger ORDER BY transaction_id")
    assert [r["transaction_id"] for r in booked] == ["TXOLD"]
    (outcome,) = await rows(env.store, "SELECT outcome FROM actions WHERE action='book'")
    assert outcome["outcome"].startswith("held: likely duplicate of TXOLD"), outcome


def _commit_meanwhile(db: Any, meanwhile: str) -> None:
    """What another session commits for `meanwhile` (see the test above)."""
    if meanwhile == "decided":
        when = utc_now()
        insert_conflict(
            db,
            "TXB",
            DUPLICATE,
            fixed_value="",
            seen_value="TXOLD",
            source="test",
            event_id=None,
            observed_at=None,
            now=when,
        )
        record_decision(db, "TXB", DUPLICATE, "yes", by="ops", note=None, now=when)
        return
    insert_booking(
        db,
        transaction_id="TXOLD",
        wallet_id=1001,
        wallet_name="main",
        currency="USDT",
        network="TRON",
        amount="100",
        from_address=FROM,
        tx_hash="0xrace" if meanwhile == "booked_hash" else None,
        trigger="credited",
    )


async def test_a_likely_duplicate_delivered_in_a_later_batch_is_held_and_another_output_booked(
    env: Env,
) -> None:
    """A batch books a deposit with a txHash in the same statement that checks it is no likely
    duplicate: a second transactionId of a booked txHash (another case) with the same amount
    and currency, delivered later, is held and alerted, never booked; one with another amount
    (a batch transfer's other output) is booked."""
    same = {"status": "SUCCESS", "whiteListStatus": None, "transactionHash": "0xlater"}
    await deliver(env.store, webhook("DEPOSIT_ORDER_NOTIFICATION", "TXA", NOW, **same))
    assert await env.processor.run_until_idle() == 1
    again = {**same, "transactionHash": "0xLATER"}
    await deliver(env.store, webhook("DEPOSIT_ORDER_NOTIFICATION", "TXB", NOW + 1, **again))
    assert await env.processor.run_until_idle() == 1
    other = {**same, "amount": "7.5"}
    await deliver(env.store, webhook("DEPOSIT_ORDER_NOTIFICATION", "TXC", NOW + 2, **other))
    assert await env.processor.run_until_idle() == 1
    # The same amount written with another scale ("100.00" is "100") and the currency in
    # another case: a likely duplicate too, held, not booked a second time.
    written = {**same, "amount": "100.00", "currency": "usdt"}
    await deliver(env.store, webhook("DEPOSIT_ORDER_NOTIFICATION", "TXD", NOW + 3, **written))
    assert await env.processor.run_until_idle() == 1
    ledger = await rows(env.store, "SELECT transaction_id FROM ledger ORDER BY transaction_id")
    assert [r["transaction_id"] for r in ledger] == ["TXA", "TXC"]
    [held] = await rows(
        env.store,
        "SELECT status, outcome FROM actions WHERE action='book' AND transaction_id='TXB'",
    )
    assert held["status"] == "skipped"
    assert held["outcome"].startswith("held: likely duplicate of TXA")
    assert [a for a in await alerts(env.store) if a[0] == "TXB"] == [
        ("TXB", "duplicate_tx_hash", "critical")
    ]
    [also] = await rows(
        env.store,
        "SELECT status, outcome FROM actions WHERE action='book' AND transaction_id='TXD'",
    )
    assert also["outcome"].startswith("held: likely duplicate of TXA")
    statuses = await rows(env.store, "SELECT status FROM events")
    assert [e["status"] for e in statuses] == ["processed"] * 4


# --- 2: book only when credited -----------------------------------------------------------------


def test_check_refuses_book_on_a_trigger_that_does_not_mean_credited(tmp_path: Path) -> None:
    """`on: [DEPOSIT_ORDER_NOTIFICATION] then: [book]` fails the rule check, with file and line."""
    path = tmp_path / "r.yaml"
    path.write_text(
        "wallet: '*'\nrules:\n  - name: r\n    on: [DEPOSIT_ORDER_NOTIFICATION]\n    then: [book]\n"
    )
    with pytest.raises(ConfigError) as err:
        RuleBook.load(path, specs=SPECS)
    [problem] = err.value.problems
    assert problem.startswith(f"{path}:5: rules[0].then: book needs a trigger")
    assert "DEPOSIT_ORDER_NOTIFICATION" in problem


async def test_book_on_a_failed_deposit_records_why_it_was_skipped(env: Env) -> None:
    """Even a rule booking on the raw eventType never books a FAIL order: a skipped outcome."""
    # A rule set an older check let through (built here without the loader, which refuses it).
    raw = Rule("raw", frozenset({"DEPOSIT_ORDER_NOTIFICATION"}), Conditions(), (Action("book"),))
    ruleset = RuleSet("r.yaml", Path("r.yaml"), "v1", ANY_WALLET, (raw,))
    env.processor.reactor = RuleReactor(lambda: RuleBook([ruleset]), Profiles.empty)
    await deliver(
        env.store,
        webhook("DEPOSIT_ORDER_NOTIFICATION", "TXF", NOW, status="FAIL", whiteListStatus=None),
    )
    with capture_logs() as logs:
        await env.processor.run_until_idle()
    assert await rows(env.store, "SELECT * FROM ledger") == []
    [row] = await rows(env.store, "SELECT status, outcome FROM actions WHERE action='book'")
    assert row == {
        "status": "skipped",
        "outcome": "not booked: the deposit is failed, not credited",
    }
    [line] = [e for e in logs if e["event"].startswith("book")]
    assert (line["event"], line["transactionId"], line["outcome"]) == (
        "book skipped",
        "TXF",
        "not booked: the deposit is failed, not credited",
    )


# --- 3 and 8: amounts ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "amount",
    ["-5000", "0", "5_000", "\u0665\u0660\u0660\u0660", "1e-999999", "NaN", "Infinity", "1" * 31],
)
async def test_webhook_with_an_impossible_amount_fails_the_event_and_books_nothing(
    env: Env, amount: str
) -> None:
    """A credited webhook whose amount is not a plain, positive, bounded decimal is marked
    failed with a clear error; nothing is tracked or booked."""
    ev = webhook("DEPOSIT_ORDER_NOTIFICATION", "TXN", NOW, status="SUCCESS", amount=amount)
    await deliver(env.store, ev)
    await env.processor.run_until_idle()
    [event] = await rows(env.store, "SELECT status, error FROM events")
    assert event["status"] == "failed"
    assert event["error"].startswith("invalid event: amount: ")
    assert await rows(env.store, "SELECT * FROM deposits") == []
    assert await rows(env.store, "SELECT * FROM ledger") == []


async def test_webhook_amount_as_a_plain_json_number_is_booked_exactly(env: Env) -> None:
    """A JSON number amount (as the provider's webhooks send it) is still read exactly."""
    ev = webhook("DEPOSIT_ORDER_NOTIFICATION", "TXJ", NOW, status="SUCCESS", whiteListStatus=None)
    raw = jsonio.dumpb(ev).replace(b'"amount":"100"', b'"amount":1.5e2')
    await deliver(env.store, ev, raw)
    await env.processor.run_until_idle()
    assert await rows(env.store, "SELECT amount FROM ledger") == [{"amount": "150"}]


async def test_history_records_with_exponent_amounts_are_skipped_and_the_poll_goes_on(
    env: Env,
) -> None:
    """`"1e99999999"` and `1e999999999` in history records are refused (logged), never grown
    into huge strings; the poll reads the other records and succeeds."""
    good = jsonio.dumpb(order("TXG"))
    text = jsonio.dumpb(order("TXS", amount="1e99999999"))
    number = jsonio.dumpb(order("TXE")).replace(b'"amount":"100"', b'"amount":1e999999999')
    records = b"[" + b",".join([text, number, good]) + b"]"
    env.provider.history["init"] = page_body([{}] * 3, records)
    with capture_logs() as logs:
        assert await env.poller.poll_history() == 1
    assert [r["transaction_id"] for r in await rows(env.store, "SELECT * FROM deposits")] == ["TXG"]
    refused = [e for e in logs if e["event"] == "history record refused; poll goes on"]
    assert [e["transactionId"] for e in refused] == ["TXS", "TXE"]
    assert all(len(e["error"]) < 200 for e in refused)
    assert env.poller.stats.failures.get("history", 0) == 0
    sizes = await rows(env.store, "SELECT MAX(LENGTH(fact)) AS n FROM facts")
    assert sizes[0]["n"] < 2000


# --- 3: fixed fields ----------------------------------------------------------------------------


async def test_amount_contradicting_the_first_fact_holds_booking_until_decided(
    env: Env, tmp_path: Path, capsys: pytest.CaptureFixture[str], make_store: StoreMaker
) -> None:
    """REQUIRED says 100, CREDITED says 90: stored, one critical alert, nothing booked; after
    `depositd resolve --set amount=90` the deposit is booked once, at 90, with who decided."""
    await deliver(env.store, webhook("DEPOSIT_WHITELIST_REQUIRED", "TXC", NOW))
    await deliver(env.store, webhook("DEPOSIT_WHITELIST_CREDITED", "TXC", NOW + 1, amount="90"))
    await deliver(env.store, webhook("DEPOSIT_WHITELIST_CREDITED", "TXC", NOW + 2, amount="90.0"))
    await env.processor.run_until_idle()
    assert await rows(env.store, "SELECT * FROM ledger") == []
    assert (await alerts(env.store)).count(("TXC", "fixed_field_conflict", "critical")) == 1
    [held] = await rows(env.store, "SELECT status, outcome FROM actions WHERE action='book'")
    assert held["status"] == "skipped" and held["outcome"].startswith("held: amount in conflict")
    assert len(await rows(env.store, "SELECT * FROM facts WHERE transaction_id='TXC'")) == 3

    report = await env.store.read(lambda db: status_report(db.conn))
    assert report["heldByConflict"] == 1
    cfg = str(write_config(tmp_path, make_config(make_store.storage("d.db"))))
    assert main(["resolve", "--config", cfg, "TXC"]) == 0
    assert "amount: was 100, webhook event" in capsys.readouterr().out
    assert main(["resolve", "--config", cfg, "TXC", "--set", "amount=-1", "--by", "ann"]) == 2
    args = ["resolve", "--config", cfg, "TXC", "--set", "amount=90", "--by", "ann", "--note", "ok"]
    assert main(args) == 0
    assert "booked" in capsys.readouterr().out
    assert main(args) == 1  # nothing open any more: decided once, booked once
    report = await env.store.read(lambda db: status_report(db.conn))
    assert report["heldByConflict"] == 0
    ledger = await rows(env.store, "SELECT amount FROM ledger WHERE transaction_id='TXC'")
    assert ledger == [{"amount": "90"}]
    [decision] = await rows(env.store, "SELECT decided_value, decided_by, note FROM conflicts")
    assert decision == {"decided_value": "90", "decided_by": "ann", "note": "ok"}
    await deliver(
        env.store, webhook("DEPOSIT_ORDER_NOTIFICATION", "TXC", NOW + 3, status="SUCCESS")
    )
    await env.processor.run_until_idle()
    assert len(await rows(env.store, "SELECT * FROM ledger")) == 1


# --- 4: far-future times ------------------------------------------------------------------------


async def test_far_future_timestamp_does_not_hide_a_later_rejection(env: Env) -> None:
    """A REQUIRED stamped a year ahead, then our submission: the genuine FAILED event an hour
    later still rejects the deposit (its time was capped at its arrival)."""
    year = 365 * 24 * 3600 * 1000
    ev = webhook("DEPOSIT_WHITELIST_REQUIRED", "TXT", NOW + year)
    await env.store.queue_event(
        event_row(
            ev["eventId"],
            ev["eventType"],
            "TXT",
            "TXT",
            jsonio.dumpb(ev),
            {},
            iso_from_ms(NOW - 3600 * 1000),
        )
    )
    await env.processor.run_until_idle()
    [row] = await rows(env.store, "SELECT * FROM deposits")
    after = Deposit.from_row(row).white_list_time() + 1
    submitted = Fact("TXT", "submit", after, white_list_status=WhiteListStatus.PENDING)
    await env.processor.observe_fact(submitted)
    failed = webhook("DEPOSIT_WHITELIST_FAILED", "TXT", NOW, failMessage="name mismatch")
    await deliver(env.store, failed)
    await env.processor.run_until_idle()
    [row] = await rows(env.store, "SELECT state, white_list_status FROM deposits")
    assert row == {"state": "rejected", "white_list_status": "rejected"}


async def test_a_rejection_right_after_a_far_future_fact_is_not_hidden(env: Env) -> None:
    """A REQUIRED stamped a year ahead, stored now, then a FAILED stamped a second later: the
    deposit is rejected at once (a fact's time is never later than its arrival), not after
    the webhook tolerance has passed."""
    year = 365 * 24 * 3600 * 1000
    await deliver(env.store, webhook("DEPOSIT_WHITELIST_REQUIRED", "TXY", now_ms() + year))
    await env.processor.run_until_idle()
    [row] = await rows(env.store, "SELECT * FROM deposits")
    assert Deposit.from_row(row).white_list_time() <= now_ms()
    failed = webhook("DEPOSIT_WHITELIST_FAILED", "TXY", now_ms() + 1000, failMessage="no")
    await deliver(env.store, failed)
    await env.processor.run_until_idle()
    [row] = await rows(env.store, "SELECT state, white_list_status FROM deposits")
    assert row == {"state": "rejected", "white_list_status": "rejected"}


@pytest.mark.parametrize("engine", ["postgres"])
async def test_two_instances_booking_a_likely_duplicate_at_once_book_one(
    env: Env, make_store: StoreMaker
) -> None:
    """PostgreSQL, READ COMMITTED: two instances booking two ids of one txHash (same amount,
    receiving address and currency) in the same moment: the second waits for the first's
    commit, then holds its deposit as a likely duplicate; one ledger row."""
    for tx in ("TXA", "TXB"):
        await env.processor.observe_fact(fact_of(order(tx, transactionHash="0xone")))
    found = await rows(env.store, "SELECT * FROM deposits ORDER BY transaction_id")
    credited = [replace(Deposit.from_row(r), state=State.CREDITED) for r in found]
    url = make_store.url("d.db")
    one, two = PgDatabase(pg_connect(url)), PgDatabase(pg_connect(url))
    try:
        one.execute("BEGIN")
        assert book_checked(one, credited[0], "credited") == ("done", "booked")  # type: ignore[arg-type]

        def second() -> tuple[str, str]:
            two.execute("BEGIN")
            try:
                return book_checked(two, credited[1], "credited")  # type: ignore[arg-type]
            finally:
                two.execute("COMMIT")

        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(second)
            await asyncio.sleep(0.5)
            assert not running.done()  # waits for the first's txHash
            one.execute("COMMIT")
            status, outcome = running.result(10)
    finally:
        one.close()
        two.close()
    assert status == "skipped" and outcome.startswith("held: likely duplicate of TXA")
    assert await rows(env.store, "SELECT transaction_id FROM ledger") == [{"transaction_id": "TXA"}]


@pytest.mark.parametrize("engine", ["postgres"])
async def test_two_resolves_at_once_on_postgres_decide_and_book_once(
    env: Env, make_store: StoreMaker
) -> None:
    """Two `depositd resolve --set` on their own connections at the same moment: one decides
    and books, the other finds nothing open; one decision, one booking."""
    await deliver(env.store, webhook("DEPOSIT_WHITELIST_REQUIRED", "TXC", NOW))
    await deliver(env.store, webhook("DEPOSIT_WHITELIST_CREDITED", "TXC", NOW + 1, amount="90"))
    await env.processor.run_until_idle()
    args = argparse.Namespace(transaction_id="TXC", set=["amount=90"], by="ann", note=None)
    url = make_store.url("d.db")
    holder = PgDatabase(pg_connect(url))  # holds the deposit until both resolves wait
    conns = [pg_connect(url) for _ in range(2)]
    outs = [io.StringIO() for _ in conns]
    try:
        holder.execute("BEGIN")
        lock_deposit(holder, "TXC")
        with ThreadPoolExecutor(2) as pool:
            running = [pool.submit(_resolve, c, args, o) for c, o in zip(conns, outs, strict=True)]
            await asyncio.sleep(0.5)
            assert not any(r.done() for r in running)
            holder.execute("COMMIT")
            codes = sorted(r.result(10) for r in running)
    finally:
        holder.close()
        for conn in conns:
            conn.close()
    assert codes == [0, 1]
    assert sum("booked" in out.getvalue() for out in outs) == 1
    assert len(await rows(env.store, "SELECT * FROM ledger WHERE transaction_id='TXC'")) == 1
    books = await rows(env.store, "SELECT outcome FROM actions WHERE action='book'")
    assert len([b for b in books if "after the decision" in (b["outcome"] or "")]) == 1


# --- the ledger row and what booking records ----------------------------------------------------


async def test_the_ledger_row_holds_the_deposit_as_credited_and_a_second_trigger_books_nothing(
    env: Env,
) -> None:
    """A credited deposit's ledger row holds its id, wallet, currency, network, exact amount,
    sending address, txHash and the trigger that booked it; the book action says `booked`
    (and the log line too); the completion that follows books nothing and says so."""
    credited = order("TXR", status="PROCESSING", creditStatus="CREDITED", amount="12.50")
    with capture_logs() as logs:
        await env.processor.observe_fact(fact_of(credited))
        await env.processor.observe_fact(
            fact_of({**credited, "status": "SUCCESS", "updateTime": 1_700_000_000_001})
        )
    [row] = await rows(env.store, "SELECT * FROM ledger")
    assert {k: v for k, v in row.items() if k not in ("booked_at", "id")} == {
        "transaction_id": "TXR",
        "wallet_id": 1001,
        "wallet_name": "main",
        "currency": "USDT",
        "network": "TRON",
        "amount": "12.50",
        "from_address": FROM,
        "tx_hash": "0xhash-txr",
        "trigger": "credited",
    }
    books = await rows(
        env.store,
        "SELECT trigger, status, outcome, params FROM actions WHERE action='book' ORDER BY id",
    )
    assert [jsonio.loads(b.pop("params")) for b in books] == [{}, {}]  # `book` takes none
    assert books == [
        {"trigger": "credited", "status": "done", "outcome": "booked"},
        {"trigger": "completed", "status": "done", "outcome": "already booked"},
    ]
    logged = [
        (e["event"], e.get("transactionId"), e.get("amount"), e.get("currency"))
        for e in logs
        if e["event"] in ("booked", "already booked")
    ]
    assert logged == [
        ("booked", "TXR", "12.50", "USDT"),
        ("already booked", "TXR", "12.50", "USDT"),
    ]


async def test_a_booked_deposit_later_in_conflict_says_already_booked_not_held(env: Env) -> None:
    """Booked at 100 on its credit; its completion then states another amount and network:
    the conflict is alerted, but the book action of the completion says the deposit is booked
    already (done), not held, and the ledger row keeps what was booked."""
    credited = order("TXK", status="PROCESSING", creditStatus="CREDITED")
    await env.processor.observe_fact(fact_of(credited))
    completed = {**credited, "status": "SUCCESS", "updateTime": 1_700_000_000_001}
    await env.processor.observe_fact(fact_of({**completed, "amount": "90", "network": "ETH"}))
    books = await rows(env.store, "SELECT status, outcome FROM actions WHERE action='book'")
    assert books == [
        {"status": "done", "outcome": "booked"},
        {"status": "done", "outcome": "already booked"},
    ]
    assert await rows(env.store, "SELECT amount, network FROM ledger") == [
        {"amount": "100", "network": "TRON"}
    ]


async def test_a_deposit_in_conflict_on_two_fields_is_held_naming_both(env: Env) -> None:
    """Not booked yet, two fixed fields contradicted: held, the outcome names both fields."""
    await env.processor.observe_fact(fact_of(order("TXH")))
    credited = order(
        "TXH", status="SUCCESS", amount="90", network="ETH", updateTime=1_700_000_000_5
    )
    await env.processor.observe_fact(fact_of(credited))
    assert await rows(env.store, "SELECT * FROM ledger") == []
    [book] = await rows(env.store, "SELECT status, outcome FROM actions WHERE action='book'")
    assert book == {
        "status": "skipped",
        "outcome": "held: amount, network in conflict; waiting for a decision (depositd resolve)",
    }


BOOK_TWICE = """\
wallet: '*'
rules:
  - {name: book on credit, on: [credited], then: [book]}
  - {name: book on completion, on: [completed], then: [book]}
"""


async def test_two_rules_booking_one_deposit_in_one_batch_book_it_once(env: Env) -> None:
    """The credit and the completion of a deposit applied in one processor batch, each booked
    by a rule of its own: one ledger row; the second book action says `already booked`."""
    env.rules_path.write_text(BOOK_TWICE)
    rulebook = RuleBook.load(env.rules_path, specs=SPECS)
    env.processor.reactor = RuleReactor(lambda: rulebook, Profiles.empty)
    await deliver(
        env.store, webhook("DEPOSIT_ORDER_NOTIFICATION", "TXD", NOW, creditStatus="CREDITED")
    )
    done = webhook("DEPOSIT_ORDER_NOTIFICATION", "TXD", NOW + 1, status="SUCCESS")
    await deliver(env.store, done)
    assert await env.processor.run_until_idle() == 2
    assert len(await rows(env.store, "SELECT * FROM ledger")) == 1
    books = await rows(
        env.store, "SELECT trigger, status, outcome FROM actions WHERE action='book' ORDER BY id"
    )
    assert [(b["status"], b["outcome"]) for b in books] == [
        ("done", "booked"),
        ("done", "already booked"),
    ]


async def test_a_likely_duplicate_held_again_on_its_completion_is_alerted_once(env: Env) -> None:
    """Held as a likely duplicate on its credit, held again (the hold now in force) on its
    completion: one alert, nothing booked."""
    done = {"status": "SUCCESS", "whiteListStatus": None, "transactionHash": "0xsame"}
    await env.processor.observe_fact(fact_of(order("TXA", **done)))
    credited = order("TXB", transactionHash="0xsame", creditStatus="CREDITED", whiteListStatus=None)
    await env.processor.observe_fact(fact_of(credited))
    await env.processor.observe_fact(fact_of(order("TXB", **done, updateTime=1_700_000_000_001)))
    books = await rows(
        env.store,
        "SELECT trigger, outcome FROM actions WHERE action='book' AND transaction_id='TXB'",
    )
    assert [b["trigger"] for b in books] == ["credited", "completed"]
    assert books[0]["outcome"].startswith("held: likely duplicate of TXA")
    assert books[1]["outcome"].startswith("held: duplicate in conflict")
    assert [a for a in await alerts(env.store) if a[0] == "TXB"] == [
        ("TXB", "duplicate_tx_hash", "critical")
    ]
    assert await rows(env.store, "SELECT transaction_id FROM ledger") == [{"transaction_id": "TXA"}]


# --- the journal: every booking and hold, with the rules that decided it -----------------------


async def journal_of(store: Store) -> list[journal.Entry]:
    """Every journal entry, in order; the chain checked whole first."""
    entries = await store.read(lambda db: list(journal.entries(db)))
    assert journal.chain_problem(entries) is None
    return entries


def rules_in_force(env: Env) -> str:
    """The rules hash of the env's rules (the file as it is) and no profiles."""
    return rules_hash(RuleBook.load(env.rules_path, specs=SPECS), Profiles.empty())


async def test_each_booking_of_a_batch_is_journalled_once_with_its_row_and_rules(
    env: Env,
) -> None:
    """A batch that books deposits, holds one until its txHash is known and holds a likely
    duplicate (the batch undone and applied again one event at a time): each ledger row has one
    BOOKED entry holding the row as written, the rule set and version that booked it, the rules
    hash and the event; each held deposit one HELD entry with its reason and trigger (the
    entries of the batch undone went with it)."""
    credited = {"status": "SUCCESS", "whiteListStatus": None}
    same = {**credited, "transactionHash": "0xshared"}
    for at, (tx, data) in enumerate(
        [
            ("TX1", credited),
            ("TXW", {**credited, "transactionHash": None}),
            ("TXA", same),
            ("TXB", same),
            ("TXC", {**same, "amount": "7.5"}),
        ]
    ):
        await deliver(env.store, webhook("DEPOSIT_ORDER_NOTIFICATION", tx, NOW + at, **data))
    assert await env.processor.run_until_idle() == 5
    await deliver(env.store, webhook("DEPOSIT_ORDER_NOTIFICATION", "TX2", NOW + 9, **credited))
    assert await env.processor.run_until_idle() == 1  # a batch that books without a retry
    entries = await journal_of(env.store)
    ledger = await rows(env.store, "SELECT * FROM ledger")
    books = {
        b["transaction_id"]: b
        for b in await rows(env.store, "SELECT * FROM actions WHERE action='book'")
    }
    booked = [e for e in entries if e.kind == journal.BOOKED]
    assert sorted(e.subject for e in booked) == sorted(r["transaction_id"] for r in ledger)
    row_of = {r["transaction_id"]: r for r in ledger}
    for entry in booked:
        book = books[entry.subject]
        assert entry.body == {
            **journal.ledger_body(row_of[entry.subject]),
            "rule_set": book["rule_set"],
            "rule_set_version": book["rule_set_version"],
            "rules_hash": rules_in_force(env),
            "event_id": book["event_id"],
        }
        assert book["rule_set"] == "rules.yaml" and book["event_id"]
    waiting, held = [e for e in entries if e.kind == journal.HELD]
    assert (waiting.subject, waiting.body["reason"]) == ("TXW", WAITING_FOR_TX_HASH)
    assert (held.subject, held.body["trigger"]) == ("TXB", "credited")
    assert held.body["reason"] == books["TXB"]["outcome"]
    assert held.body["reason"].startswith("held: likely duplicate of TXA")
    assert (held.body["rule_set"], held.body["rules_hash"]) == ("rules.yaml", rules_in_force(env))
    assert len(entries) == 6


async def test_a_hold_its_release_and_the_booking_it_makes_are_journalled_together(
    env: Env, tmp_path: Path, make_store: StoreMaker
) -> None:
    """A deposit held by an amount in conflict: a HELD entry; `depositd resolve` books it and
    journals, in its own transaction, the BOOKED row (under the rules that held it), the
    RELEASED decision with who and the note, and the operator's action."""
    await deliver(env.store, webhook("DEPOSIT_WHITELIST_REQUIRED", "TXC", NOW))
    await deliver(env.store, webhook("DEPOSIT_WHITELIST_CREDITED", "TXC", NOW + 1, amount="90"))
    await env.processor.run_until_idle()
    [held] = await journal_of(env.store)
    assert (held.kind, held.subject) == (journal.HELD, "TXC")
    assert held.body == {
        "reason": "held: amount in conflict; waiting for a decision (depositd resolve)",
        "trigger": "credited",
        "rule_set": "rules.yaml",
        "rules_hash": rules_in_force(env),
    }
    # The rules change before the person decides: the booking keeps the rules that held it.
    env.rules_path.write_text(BOOK_ON_CREDITED + "# edited\n")
    cfg = str(write_config(tmp_path, make_config(make_store.storage("d.db"))))
    args = ["resolve", "--config", cfg, "TXC", "--set", "amount=90", "--by", "ann"]
    assert main([*args, "--note", "checked on chain"]) == 0
    entries = await journal_of(env.store)
    assert [(e.kind, e.subject) for e in entries[1:]] == [
        (journal.BOOKED, "TXC"),
        (journal.RELEASED, "TXC"),
        (journal.OPERATOR, "TXC"),
    ]
    booked, released, operator = entries[1:]
    [row] = await rows(env.store, "SELECT * FROM ledger")
    [first, *_] = await rows(env.store, "SELECT * FROM actions WHERE action='book' ORDER BY id")
    assert booked.body == {
        **journal.ledger_body(row),
        "rule_set": "rules.yaml",
        "rule_set_version": first["rule_set_version"],
        "rules_hash": held.body["rules_hash"],
        "event_id": first["event_id"],
    }
    assert released.body == {
        "decision": "amount=90",
        "by": "ann",
        "note": "checked on chain",
        "booked": True,
    }
    assert operator.body["action"] == "resolve" and operator.body["by"] == "ann@cli"
    assert operator.body["note"] == "checked on chain"
    assert operator.body["outcome"].startswith("decided amount=90; booked")
    assert {e.at for e in entries[1:]} == {booked.at}  # one transaction


async def test_a_deposit_decided_a_duplicate_is_released_unbooked(
    env: Env, tmp_path: Path, make_store: StoreMaker
) -> None:
    """`resolve --set duplicate=yes`: RELEASED with booked false, no BOOKED entry for it."""
    done = {"status": "SUCCESS", "whiteListStatus": None, "transactionHash": "0xsame"}
    await env.processor.observe_fact(fact_of(order("TXA", **done)))
    await env.processor.observe_fact(fact_of(order("TXB", **done)))
    cfg = str(write_config(tmp_path, make_config(make_store.storage("d.db"))))
    assert main(["resolve", "--config", cfg, "TXB", "--set", "duplicate=yes", "--by", "bo"]) == 0
    entries = await journal_of(env.store)
    assert [(e.kind, e.subject) for e in entries] == [
        (journal.BOOKED, "TXA"),
        (journal.HELD, "TXB"),
        (journal.RELEASED, "TXB"),
        (journal.OPERATOR, "TXB"),
    ]
    assert entries[2].body == {"decision": "duplicate=yes", "by": "bo", "note": "", "booked": False}


async def test_a_journal_that_cannot_be_appended_leaves_the_booking_uncommitted(
    env: Env,
) -> None:
    """The booking and its entry commit together: while the database refuses the journal's
    rows, the processor's transaction is given back whole (no ledger row, no action, the event
    still pending); once it takes them again, the deposit is booked once, with its one entry."""
    credited = {"status": "SUCCESS", "whiteListStatus": None}
    await deliver(env.store, webhook("DEPOSIT_ORDER_NOTIFICATION", "TXJ", NOW, **credited))
    postgres = isinstance(env.store, PgStore)
    refuse = (
        [
            "CREATE FUNCTION refuse_journal() RETURNS trigger LANGUAGE plpgsql"
            " AS $$ BEGIN RAISE EXCEPTION 'no space left for the journal'; END $$",
            "CREATE TRIGGER refuse_journal BEFORE INSERT ON journal"
            " FOR EACH ROW EXECUTE FUNCTION refuse_journal()",
        ]
        if postgres
        else [
            "CREATE TRIGGER refuse_journal BEFORE INSERT ON journal"
            " BEGIN SELECT RAISE(ABORT, 'no space left for the journal'); END"
        ]
    )
    for sql in refuse:
        await env.store.write(lambda db, sql=sql: db.execute(sql))
    with pytest.raises(StorageError, match="no space left for the journal"):
        await env.processor.run_until_idle()
    assert await rows(env.store, "SELECT * FROM ledger") == []
    assert await rows(env.store, "SELECT * FROM actions") == []
    assert [e["status"] for e in await rows(env.store, "SELECT status FROM events")] == ["pending"]
    drop = "DROP TRIGGER refuse_journal" + (" ON journal" if postgres else "")
    await env.store.write(lambda db: db.execute(drop))
    assert await env.processor.run_until_idle() == 1
    [row] = await rows(env.store, "SELECT * FROM ledger")
    [entry] = await journal_of(env.store)
    assert (entry.kind, journal.ledger_body(entry.body)) == (journal.BOOKED, row)


@pytest.mark.parametrize("engine", ["postgres"])
async def test_two_instances_booking_at_once_on_postgres_leave_one_chain(
    env: Env, make_store: StoreMaker
) -> None:
    """Two stores (two instances) with their processors on one PostgreSQL database, applying a
    stream of deposits at the same time, holding a likely duplicate: one chain in one order,
    one BOOKED entry per ledger row, each holding the row."""
    other = make_store("d.db")
    await other.open()
    try:
        second = Processor(other, reactor=env.processor.reactor, batch_size=3)
        env.processor.batch_size = 3
        credited = {"status": "SUCCESS", "whiteListStatus": None}
        for i in range(40):
            data = {**credited, "transactionHash": "0xtwice"} if i in (7, 23) else credited
            await deliver(
                env.store, webhook("DEPOSIT_ORDER_NOTIFICATION", f"T{i:02d}", NOW + i, **data)
            )
        done = await asyncio.gather(env.processor.run_until_idle(), second.run_until_idle())
        assert sum(done) == 40 and all(done)  # both applied some
    finally:
        await other.close()
    entries = await journal_of(env.store)
    ledger = await rows(env.store, "SELECT * FROM ledger")
    assert len(ledger) == 39  # T23 held as a likely duplicate of T07 (or the other way)
    booked = {e.subject: e.body for e in entries if e.kind == journal.BOOKED}
    assert len(booked) == len([e for e in entries if e.kind == journal.BOOKED]) == 39
    assert {tx: journal.ledger_body(b) for tx, b in booked.items()} == {
        r["transaction_id"]: r for r in ledger
    }
    assert [e.subject for e in entries if e.kind == journal.HELD] in (["T23"], ["T07"])
