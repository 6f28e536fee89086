"""The tracker's edges that decide money: late facts, replayed facts, stored times, JSON shapes.

Each test states what an operator or the ledger would see go wrong if the tracker slipped.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from tests.support.facts import (
    T0,
    TX,
    credited,
    event,
    failed,
    notification,
    poll,
    required,
    run,
    submitted,
)
from worker.clock import iso_from_ms
from worker.provider.models import CreditStatus, OrderStatus, WhiteListStatus
from worker.track.tracker import (
    Deposit,
    Fact,
    State,
    Trigger,
    conflicts,
    observe,
)


def test_whitelist_webhook_after_success_does_not_ask_for_details() -> None:
    """A whitelist-required webhook that arrives after the order is already SUCCESS (seen by a
    history poll that said nothing about the whitelist) fires no needs_details: the deposit is
    complete and stays so."""
    done, first = run([poll(T0 + 50, "SUCCESS", None)])
    assert done.state is State.COMPLETED and Trigger.COMPLETED in {t.trigger for t in first}
    after, transitions = observe(done, required(T0 + 10))
    assert transitions == []
    assert after.state is State.COMPLETED
    assert after.white_list_status is WhiteListStatus.APPROVED


@pytest.mark.parametrize("source", ["webhook", "poll"])
def test_replayed_fact_acts_like_the_original(source: str) -> None:
    """A stored fact replayed from its JSON (`replay`, a restart) moves the deposit exactly as
    the original did: a replayed SUCCESS is completed and credited, not processing."""
    original = Fact(
        TX,
        source,
        T0,
        status=OrderStatus.SUCCESS,
        white_list_status=WhiteListStatus.APPROVED,
        credit_status=CreditStatus.CREDITED,
        amount=Decimal("10.5"),
    )
    replayed = Fact.from_json(original.to_json())
    assert isinstance(replayed.status, OrderStatus)
    assert isinstance(replayed.white_list_status, WhiteListStatus)
    assert isinstance(replayed.credit_status, CreditStatus)
    deposit, transitions = observe(None, replayed)
    assert deposit.state is State.COMPLETED
    assert [t.trigger for t in transitions] == [Trigger.CREDITED, Trigger.COMPLETED]
    assert deposit.to_row() == observe(None, original)[0].to_row()


def test_replayed_rejection_asks_again() -> None:
    """A replayed rejection reads rejected (its whitelist status typed), with its message."""
    fact = Fact.from_json(failed(T0 + 5, "name mismatch").to_json())
    deposit, transitions = run([required(T0), submitted(T0 + 2), fact])
    assert deposit.state is State.REJECTED
    assert transitions[-1].trigger is Trigger.REJECTED
    assert transitions[-1].fail_message == "name mismatch"


def test_credit_and_status_times_are_stored() -> None:
    """The time the provider credited and completed the deposit is kept per field: the booking
    day and the blocked watch read it, not the time of the newest fact."""
    deposit, _ = run(
        [required(T0), credited(T0 + 1000), notification(T0 + 9000, "SUCCESS", "approved")]
    )
    assert deposit.field_times["credit_status"] == T0 + 1000
    assert deposit.field_times["status"] == T0 + 9000
    assert deposit.updated_at == T0 + 9000


def test_success_without_credit_status_stores_the_credit_time() -> None:
    """A history record reading SUCCESS (no creditStatus) means credited at that record's time."""
    deposit, _ = run([poll(T0 + 700, "SUCCESS", None)])
    assert deposit.credit_status is CreditStatus.CREDITED
    assert deposit.field_times["credit_status"] == T0 + 700


def test_older_fact_filling_a_field_keeps_updated_at() -> None:
    """A late, older fact that fills a missing field never moves updated_at backwards."""
    bare = Fact(TX, "submit", T0 + 100, white_list_status=WhiteListStatus.PENDING)
    deposit, _ = observe(None, bare)
    assert deposit.tx_hash is None
    filled, _ = observe(deposit, required(T0 + 50))
    assert filled.tx_hash == "0xabc"
    assert filled.updated_at == T0 + 100


def test_later_trigger_of_a_fact_survives_an_already_emitted_one() -> None:
    """When one trigger of a fact was emitted before (stored key), the fact's later triggers
    still fire: credited already recorded, the SUCCESS still completes the deposit."""
    deposit, _ = observe(None, required(T0))
    row = deposit.to_row() | {"emitted": '["credited", "needs_details"]'}
    again, transitions = observe(Deposit.from_row(row), notification(T0 + 1, "SUCCESS", "approved"))
    assert [t.key for t in transitions] == ["completed"]
    assert again.state is State.COMPLETED


def test_only_a_rejection_carries_the_fail_message() -> None:
    """The provider's fail message rides on the rejected trigger only, not on what follows."""
    deposit, transitions = run(
        [required(T0), submitted(T0 + 1), failed(T0 + 2, "bad name"), submitted(T0 + 3)]
    )
    assert deposit.fail_message == "bad name"
    by_key = {t.key: t.fail_message for t in transitions}
    assert by_key["rejected"] == "bad name"
    assert by_key["needs_details"] is None and by_key["submitted#2"] is None
    _, more = observe(deposit, credited(T0 + 4, status="SUCCESS"))
    assert [t.fail_message for t in more] == [None, None]


def test_white_list_time_is_the_whitelist_fact_time() -> None:
    """A submission's `after` is the time of the fact that set the whitelist status held, not
    of a newer unrelated fact."""
    deposit, _ = run([required(T0 + 10), poll(T0 + 90, "PROCESSING", "init", credit="PENDING")])
    assert deposit.white_list_time() == T0 + 10
    assert deposit.updated_at == T0 + 90
    bare, _ = observe(None, Fact(TX, "poll", T0 + 5, status=OrderStatus.PROCESSING))
    assert bare.white_list_time() == T0 + 5


def test_conflicts_name_each_contradicted_fixed_field() -> None:
    """A later fact stating another amount or address is a conflict for a person, field by field;
    a fact that leaves a field out, or repeats it, contradicts nothing."""
    deposit, _ = observe(None, required(T0))
    assert conflicts(None, required(T0)) == []
    assert conflicts(deposit, required(T0 + 1)) == []
    other = event(
        "DEPOSIT_ORDER_NOTIFICATION", T0 + 2, amount="99", fromAddress="TOther", currency="USDC"
    )
    assert conflicts(deposit, other) == [
        ("currency", "USDT", "USDC"),
        ("amount", Decimal("1234.5678"), Decimal("99")),
        ("from_address", "TQ5aXj8Tq6u2pG2Lw6xXw9zC3vGmZ5a1bB", "TOther"),
    ]
    silent = Fact(TX, "poll", T0 + 3, amount=None, network=None)
    assert conflicts(deposit, silent) == []
    wallet = event("DEPOSIT_ORDER_NOTIFICATION", T0 + 4, walletId=2002, network="ETH")
    assert conflicts(deposit, wallet) == [("wallet_id", 1001, 2002), ("network", "TRON", "ETH")]


def test_deposit_without_amount_or_whitelist_round_trips() -> None:
    """A deposit first known from our own submission (no amount, whitelist unknown) stores and
    prints nulls, and reads back the same."""
    deposit, _ = observe(None, Fact(TX, "submit", T0))
    row = deposit.to_row()
    assert row["amount"] is None and row["whitelisted"] is None
    assert deposit.as_json()["amount"] is None
    assert Deposit.from_row(row) == deposit


def test_rows_from_a_json_decoding_driver_or_old_rows_read_the_same() -> None:
    """`emitted` and `fact_time` read the same whether the driver hands text, decoded JSON or
    NULL (an old row): nothing emitted is forgotten and nothing is emitted twice."""
    deposit, _ = run([required(T0), credited(T0 + 5)])
    row = deposit.to_row()
    decoded = row | {"emitted": sorted(deposit.emitted), "fact_time": dict(deposit.field_times)}
    assert Deposit.from_row(decoded) == deposit
    empty = Deposit.from_row(row | {"emitted": None, "fact_time": None})
    assert empty.emitted == frozenset() and dict(empty.field_times) == {}


def test_float_amount_in_a_row_is_refused_with_a_reason() -> None:
    """A float in deposits.amount is refused, saying amounts are stored as decimal strings."""
    deposit, _ = observe(None, required(T0))
    with pytest.raises(
        TypeError, match=r"^deposits\.amount holds a float; amounts are stored as decimal strings$"
    ):
        Deposit.from_row(deposit.to_row() | {"amount": 1.5})


def test_bad_facts_are_refused_with_a_reason() -> None:
    """A fact without a transactionId, from an unknown source or with a float amount is refused,
    and the error says why."""
    with pytest.raises(ValueError, match=r"^a fact needs a transaction_id$"):
        Fact("", "poll", T0)
    with pytest.raises(ValueError, match=r"one of \['poll', 'submit', 'webhook'\], not 'guess'"):
        Fact(TX, "guess", T0)
    with pytest.raises(TypeError, match=r"^amounts are Decimal, never float$"):
        Fact(TX, "poll", T0, amount=1.5)  # type: ignore[arg-type]
    deposit, _ = observe(None, required(T0))
    with pytest.raises(ValueError, match="fact for tx-other applied to deposit " + TX):
        observe(deposit, Fact("tx-other", "poll", T0))


def test_as_json_is_the_whole_documented_object() -> None:
    """`deposits --json` and the `forward` body carry every field, spelled as documented."""
    deposit, _ = run([required(T0), poll(T0 + 3, "SUCCESS", "approved", credit="CREDITED")])
    expected: dict[str, Any] = {
        "transactionId": TX,
        "walletId": 1001,
        "walletName": "main",
        "currency": "USDT",
        "network": "TRON",
        "amount": "1234.5678",
        "fromAddress": "TQ5aXj8Tq6u2pG2Lw6xXw9zC3vGmZ5a1bB",
        "toAddress": "TWalletReceiving111111111111111111",
        "txHash": "0xabc",
        "status": "SUCCESS",
        "whiteListStatus": "approved",
        "creditStatus": "CREDITED",
        "failMessage": None,
        "state": "completed",
        "createdAt": iso_from_ms(T0),
        "updatedAt": iso_from_ms(T0 + 3),
    }
    assert deposit.as_json() == expected


def test_row_without_fact_times_still_takes_a_rejection() -> None:
    """A deposit read from a row that holds no per-field times (written before they were kept)
    still takes a later rejection and its newer message."""
    deposit, _ = run([required(T0), submitted(T0 + 1), failed(T0 + 2, "first")])
    old = Deposit.from_row(deposit.to_row() | {"fact_time": None})
    again, _ = observe(old, failed(T0 + 9, "second"))
    assert again.fail_message == "second"
    resubmitted = Deposit.from_row(
        run([required(T0), submitted(T0 + 1)])[0].to_row() | {"fact_time": None}
    )
    rejected, more = observe(resubmitted, failed(T0 + 9, "late"))
    assert rejected.state is State.REJECTED
    assert [t.trigger for t in more] == [Trigger.REJECTED]
