"""Reconciliation's matching: each report record and each ledger row of a day ends matched once
or as a finding (by id, then txHash case-blind; amount, asset, network and txHash compared), so
no day is `clean` while money is missing, doubled or in another asset (sandbox, worker and
Slack on loopback; worker.dev.harness)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from tests.support.stacks import (
    ACTIVE_SOURCE,
    NEVER,
    MakeStack,
    booked_day,
    catchups_done,
    make_active,
    open_findings,
)
from worker.dev.harness import Stack

# Every test here runs on SQLite and on PostgreSQL, its stacks too.
pytestmark = pytest.mark.usefixtures("engine")


async def one_booked(start_stack: MakeStack) -> tuple[Stack, dt.date, dict[str, Any]]:
    """A stack with one deposit of 1.25 USDT on TRON booked today; its ledger row."""
    stack = await start_stack(history_interval_s=NEVER, detail_interval_s=NEVER)
    await catchups_done(stack)
    day, _ = await booked_day(stack, 1)
    [row] = await stack.ledger()
    return stack, day, row


async def kinds(stack: Stack, day: dt.date) -> list[tuple[str, str | None]]:
    """(kind, transactionId) of each finding of one run of `day`, in order found."""
    money = stack.runtime.money
    assert money is not None
    result = await money.daily.reconcile(day)
    assert result is not None and result.outcome != "failed", result
    return [(f.kind, f.transaction_id) for f in result.findings]


def extra(day: dt.date, row: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """An extra report record like the booked deposit's, with `changes`."""
    return {
        "kind": "extra",
        "date": day.isoformat(),
        "asset": row["currency"],
        "network": row["network"],
        "amount": row["amount"],
        "txHash": row["tx_hash"],
        **changes,
    }


async def test_more_money_under_a_booked_tx_hash_is_missing_in_ledger(
    start_stack: MakeStack,
) -> None:
    """The report lists 5000 USDT more under the txHash the ledger booked once (1.25): not
    clean, the 5000 is money the books do not hold."""
    stack, day, row = await one_booked(start_stack)
    stack.sandbox.add_discrepancy(extra(day, row, amount="5000", transactionId="PX-2"))
    assert await kinds(stack, day) == [("missing_in_ledger", "PX-2")]
    found = await open_findings(stack, day)
    assert found["missing_in_ledger"]["report_amount"] == "5000"


async def test_two_deposits_of_one_transaction_booked_once_is_missing_in_ledger(
    start_stack: MakeStack,
) -> None:
    """A batch transfer: two provider deposits (two ids) of one on-chain transaction, the
    ledger holds one: the report's second is missing in the ledger."""
    stack, day, row = await one_booked(start_stack)
    stack.sandbox.add_discrepancy(extra(day, row, transactionId="PX-BATCH"))
    assert await kinds(stack, day) == [("missing_in_ledger", "PX-BATCH")]


async def test_another_asset_and_network_under_the_same_id_differs(
    start_stack: MakeStack,
) -> None:
    """A ledger row of 1.25 USDT on TRON against a record of 1.25 USDC on ETH for the same
    deposit: `asset_differs`, not clean."""
    stack, day, row = await one_booked(start_stack)
    tx = row["transaction_id"]
    sb = stack.sandbox
    sb.add_discrepancy({"kind": "drop", "date": day.isoformat(), "transactionId": tx})
    sb.add_discrepancy(extra(day, row, asset="USDC", network="ETH", transactionId=tx))
    assert await kinds(stack, day) == [("asset_differs", tx)]
    found = await open_findings(stack, day)
    assert (found["asset_differs"]["currency"], found["asset_differs"]["network"]) == (
        "USDC",
        "ETH",
    )
    assert "USDT on TRON" in found["asset_differs"]["detail"]


async def test_a_deposit_listed_on_two_days_is_a_finding_of_the_other_day(
    start_stack: MakeStack,
) -> None:
    """The deposit credited today also listed in yesterday's settlement: yesterday is not
    clean (`settled_on_other_day`); today, where the ledger has its credit, is."""
    stack, day, row = await one_booked(start_stack)
    yesterday = day - dt.timedelta(days=1)
    tx = row["transaction_id"]
    stack.sandbox.add_discrepancy(extra(yesterday, row, transactionId=tx))
    assert await kinds(stack, yesterday) == [("settled_on_other_day", tx)]
    found = await open_findings(stack, yesterday)
    assert found["settled_on_other_day"]["detail"] == f"the ledger books {tx} on {day}"
    assert await kinds(stack, day) == []


async def test_records_without_an_id_match_by_tx_hash_case_blind_and_once(
    start_stack: MakeStack,
) -> None:
    """A record without the provider's id matches its ledger row by txHash whatever its case;
    a second such record of the same txHash matches a row already matched: a finding."""
    stack, day, row = await one_booked(start_stack)
    tx, upper = row["transaction_id"], row["tx_hash"].upper()  # a TRON hash: bare hex
    sb = stack.sandbox
    sb.add_discrepancy({"kind": "drop", "date": day.isoformat(), "transactionId": tx})
    sb.add_discrepancy(extra(day, row, transactionId="", txHash=upper))
    assert await kinds(stack, day) == []
    sb.add_discrepancy(extra(day, row, transactionId="", txHash=row["tx_hash"]))
    assert await kinds(stack, day) == [("duplicate_in_report", None)]


async def test_two_deposits_of_one_batch_transfer_are_booked_and_reconciled(
    start_stack: MakeStack,
) -> None:
    """A batch transfer: one txHash, two outputs (500 and 250), two transactionIds at the
    provider: each is booked once under its own id, no alert, and the day is clean."""
    stack = await start_stack(history_interval_s=NEVER, detail_interval_s=NEVER)
    await catchups_done(stack)
    make_active(stack, 1002)
    tx_hash = "0x" + "ab" * 32
    txs = [
        stack.sandbox.inject_deposit(1002, "USDT", "TRON", amount, ACTIVE_SOURCE, tx_hash=tx_hash)[
            "transactionId"
        ]
        for amount in ("500", "250")
    ]
    await stack.wait_for(lambda: ledger_size(stack, 2), 20, "both deposits booked")
    ledger = await stack.ledger()
    assert sorted(r["transaction_id"] for r in ledger) == sorted(txs)
    assert {r["tx_hash"] for r in ledger} == {tx_hash}
    day = dt.datetime.now(dt.UTC).date()
    assert await kinds(stack, day) == []
    assert not [p for p in stack.slack if "duplicate_tx_hash" in str(p)]


async def ledger_size(stack: Stack, size: int) -> bool:
    """Are `size` deposits booked (after the sandbox's webhooks are processed)?"""
    await stack.settle()  # bounded: gives up with a failure
    return len(await stack.ledger()) >= size
