"""A BLOCKED deposit that support releases: found, booked once, told once (sandbox, worker,
SMTP and Slack on loopback through worker.dev.harness)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from tests.support.stacks import NEVER, MakeStack
from worker.clock import now_ms
from worker.dev.harness import Stack
from worker.provider.models import CreditStatus, DepositOrder
from worker.track.facts import fact_from_order
from worker.track.tracker import State, observe

FAST = 0.3
PAYER = "TReleasedPayer0000000000000000001"  # wallet 1002: its fallback profile applies


def detail(at: int, status: str, credit: str, white: str = "pending") -> DepositOrder:
    """A transaction detail of one whitelisted deposit, updated at `at`."""
    return DepositOrder.model_validate(
        {
            "transactionId": "tx-released-1",
            "walletId": 1002,
            "currency": "USDT",
            "network": "TRON",
            "amount": "12.5",
            "status": status,
            "whiteListStatus": white,
            "creditStatus": credit,
            "updateTime": at,
        }
    )


def test_blocked_then_credited_then_success_is_released_and_completed() -> None:
    """BLOCKED, then CREDITED, then SUCCESS: released with credited (so the booking rule books
    it), then completed; a late BLOCKED reading changes nothing."""
    t0 = 1_790_000_000_000
    deposit, blocked = observe(
        None, fact_from_order(sent_at=t0, order=detail(t0, "PROCESSING", "BLOCKED"))
    )
    assert [t.key for t in blocked] == ["submitted", "blocked"] and deposit.state is State.BLOCKED
    deposit, released = observe(
        deposit,
        fact_from_order(sent_at=t0 + 5, order=detail(t0 + 5, "PROCESSING", "CREDITED", "approved")),
    )
    assert [t.key for t in released] == ["released", "credited"]
    assert deposit.state is State.CREDITED
    deposit, done = observe(
        deposit,
        fact_from_order(sent_at=t0 + 9, order=detail(t0 + 9, "SUCCESS", "CREDITED", "approved")),
    )
    assert [t.key for t in done] == ["completed"] and deposit.state is State.COMPLETED
    again, late = observe(
        deposit, fact_from_order(sent_at=t0 + 1, order=detail(t0 + 1, "PROCESSING", "BLOCKED"))
    )
    assert late == [] and again.state is State.COMPLETED


async def reach(stack: Stack, tx: str, state: State, timeout: float = 10) -> None:  # noqa: ASYNC109
    """Wait until the worker tracks `tx` in `state`."""

    async def there() -> bool:
        deposit = await stack.deposit(tx)
        return deposit is not None and deposit.state is state

    await stack.wait_for(there, timeout, f"{tx} to be {state.value}")


async def blocked_deposit(stack: Stack, amount: str) -> str:
    """A deposit submitted by the worker, then BLOCKED at the provider and seen blocked."""
    order = stack.sandbox.inject_deposit(1002, "USDT", "TRON", amount, PAYER)
    tx = str(order["transactionId"])
    await reach(stack, tx, State.SUBMITTED)
    await stack.settle()
    stack.sandbox.block(tx)
    poller = stack.runtime.poller
    assert poller is not None
    await poller.poll_detail()
    await stack.settle()
    await reach(stack, tx, State.BLOCKED)
    return tx


async def redeliver_dropped(stack: Stack, tx: str) -> int:
    """Deliver again every webhook about `tx` that the sandbox dropped; how many."""
    dropped = [
        d
        for d in stack.sandbox.deliverer.history
        if d.state == "dropped" and d.envelope["referenceId"] == tx
    ]
    for d in dropped:
        stack.sandbox.deliverer.enqueue(dict(d.envelope))
    await stack.settle()
    return len(dropped)


async def told(stack: Stack, tx: str, condition: str) -> tuple[int, int]:
    """(Slack messages, e-mails) about `tx` for one alert condition."""
    return len(stack.slack_for(tx, condition)), len(stack.emails_for(tx, condition))


async def booked_once(stack: Stack, tx: str, amount: str) -> None:
    """One ledger row for `tx` with its exact amount, one book action that booked."""
    ledger = [r for r in await stack.ledger() if r["transaction_id"] == tx]
    assert [Decimal(r["amount"]) for r in ledger] == [Decimal(amount)]
    assert ledger[0]["amount"] == amount
    books = [a for a in await stack.actions(tx) if a["action"] == "book"]
    assert [a["outcome"] for a in books if a["outcome"] == "booked"] == ["booked"]


@pytest.mark.parametrize("first", ["poll", "webhook"])
async def test_release_after_blocked_books_once_across_webhook_poll_and_restart(
    start_stack: MakeStack, first: str
) -> None:
    """A released BLOCKED deposit is booked once and alerted once as released, whether the
    blocked-deposit poll or the webhook sees the release first, across a restart and a replay."""
    stack = await start_stack(
        history_interval_s=NEVER, detail_interval_s=NEVER, blocked_interval_s=FAST
    )
    amount = "4321.000000000000000001"
    tx = await blocked_deposit(stack, amount)
    assert await stack.ledger() == []

    if first == "poll":
        stack.sandbox.drop_webhooks(2)  # CREDITED and ORDER_NOTIFICATION of the release: lost
    stack.sandbox.release(tx)
    await reach(stack, tx, State.COMPLETED)  # the blocked poll (or the webhooks) saw it
    await stack.settle()
    await booked_once(stack, tx, amount)

    await stack.restart_worker()
    if first == "poll":
        assert await redeliver_dropped(stack, tx) == 2  # the webhooks arrive late, after it
    poller = stack.runtime.poller
    assert poller is not None
    await poller.poll_detail()
    await poller.poll_blocked()
    detail = await stack.runtime.client.transaction_detail(tx)  # type: ignore[union-attr]
    assert detail.creditStatus is CreditStatus.CREDITED
    await stack.processor.observe_fact(fact_from_order(detail, source="poll", sent_at=now_ms()))
    await stack.settle()

    deposit = await stack.deposit(tx)
    assert deposit is not None and deposit.state is State.COMPLETED
    assert {"blocked", "released", "credited", "completed"} <= deposit.emitted
    await booked_once(stack, tx, amount)
    assert await told(stack, tx, "released") == (1, 1)
    assert await told(stack, tx, "blocked") == (1, 1)


async def test_blocked_poll_reads_only_blocked_deposits_within_the_watch(
    start_stack: MakeStack,
) -> None:
    """The blocked-deposit poll reads blocked deposits only, and only for blocked_watch_days."""
    stack = await start_stack(
        history_interval_s=NEVER, detail_interval_s=NEVER, blocked_interval_s=NEVER
    )
    await blocked_deposit(stack, "12.5")
    other = stack.sandbox.inject_deposit(1002, "USDT", "TRON", "3", PAYER + "x")
    await reach(stack, str(other["transactionId"]), State.SUBMITTED)
    poller = stack.runtime.poller
    assert poller is not None
    assert await poller.poll_blocked() == 1  # the blocked one, not the submitted one

    watch: Any = poller._settings  # the watch ends for this test
    poller._settings = watch.model_copy(update={"blocked_watch_days": 1e-9})
    assert await poller.poll_blocked() == 0  # blocked longer than the watch: not read again
