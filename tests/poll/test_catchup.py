"""Catch-up in `serve`: deposits that completed while depositd was away are found and booked
(sandbox, worker, SMTP and Slack on loopback; worker.dev.harness)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from tests.support.processes import Processes
from tests.support.stacks import (
    ACTIVE_SOURCE,
    NEVER,
    UNKNOWN_SOURCE,
    MakeStack,
    catchups_done,
    make_active,
    scrape,
)
from worker.clock import iso_from_ms, now_ms
from worker.dev.harness import Stack
from worker.dev.sandbox.testing import ENTITY_PAYER
from worker.poll.catchup import covered_until

ROOT = Path(__file__).resolve().parents[2]


async def metric(stack: Stack, name: str) -> float:
    """One sample of the worker's /metrics."""
    for (sample, _), value in (await scrape(stack)).items():
        if sample == name:
            return float(value)
    raise AssertionError(f"{name} not in /metrics")


def book_counts(ledger: list[dict[str, Any]]) -> dict[str, int]:
    """How many ledger rows each transactionId has."""
    counts: dict[str, int] = {}
    for row in ledger:
        counts[row["transaction_id"]] = counts.get(row["transaction_id"], 0) + 1
    return counts


def complete_while_away(stack: Stack) -> list[str]:
    """Deposits that complete at the sandbox with every webhook dropped: from an ACTIVE source
    (a wallet without and one with auto-collection), and one whose payer details were sent on
    the provider's hosted page and approved."""
    stack.sandbox.drop_webhooks(10)
    plain = stack.sandbox.inject_deposit(1002, "USDT", "TRON", "12.50", ACTIVE_SOURCE)
    swept = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "7.25", ACTIVE_SOURCE)
    stack.sandbox.finish_sweep(swept["transactionId"])
    gated = stack.sandbox.inject_deposit(1002, "USDT", "TRON", "3.00", UNKNOWN_SOURCE)
    tx = gated["transactionId"]
    stack.sandbox.submit(tx, {**ENTITY_PAYER, "walletType": "SELF_HOSTED"})
    stack.sandbox.approve_review(tx)
    return [plain["transactionId"], swept["transactionId"], tx]


async def test_deposits_completed_while_serve_was_down_are_booked_once_by_the_catchup(
    start_stack: MakeStack,
) -> None:
    """serve stopped, deposits complete with their webhooks lost; at the next start the
    catch-up books each once, and a second restart books nothing again."""
    stack = await start_stack(history_interval_s=NEVER, detail_interval_s=NEVER)
    make_active(stack, 1001)
    make_active(stack, 1002)
    await catchups_done(stack)
    await stack.sandbox.delivered_idle()
    await stack.settle()
    await stack.stop_worker()

    txs = complete_while_away(stack)

    await stack.start_worker()
    await catchups_done(stack)
    await stack.settle()
    counts = book_counts(await stack.ledger())
    assert {tx: counts.get(tx, 0) for tx in txs} == dict.fromkeys(txs, 1)
    assert await metric(stack, "depositd_catchup_deposits_found") == 3
    assert await metric(stack, "depositd_catchup_last_timestamp_seconds") > 0
    actions = await stack.actions()
    mark = await stack.store.read(covered_until)
    assert mark is not None

    await stack.restart_worker()
    await catchups_done(stack)
    await stack.settle()
    assert book_counts(await stack.ledger()) == counts
    assert await stack.actions() == actions
    assert await metric(stack, "depositd_catchup_deposits_found") == 0
    later = await stack.store.read(covered_until)
    assert later is not None and later >= mark


async def test_catchup_follows_when_the_provider_answers_again(start_stack: MakeStack) -> None:
    """A deposit completed while the provider was unreachable (its webhook lost) is booked by
    the catch-up that follows the first successful call, not an hour later."""
    stack = await start_stack(history_interval_s=0.3, detail_interval_s=NEVER)
    make_active(stack, 1002)
    await catchups_done(stack)
    catchup = stack.runtime.catchup
    assert catchup is not None
    first = catchup.last
    stack.sandbox.set_fault("*", "5xx", count=None)
    await stack.wait_for(
        lambda: (
            stack.runtime.poller is not None
            and stack.runtime.poller.stats.failures.get("history", 0) > 0
        ),
        10,
        "a failed history poll",
    )
    stack.sandbox.drop_webhooks(1)
    tx = stack.sandbox.inject_deposit(1002, "USDT", "TRON", "5.00", ACTIVE_SOURCE)["transactionId"]
    stack.sandbox.clear_faults()
    await stack.wait_for(lambda: catchup.last is not first, 10, "a catch-up after the outage")

    async def booked() -> bool:
        return book_counts(await stack.ledger()).get(tx) == 1

    await stack.wait_for(booked, 10, "the deposit booked")


async def run_backfill(processes: Processes, stack: Stack, since_ms: int) -> tuple[int, str]:
    """`depositd backfill --since ...` as a subprocess beside the running worker."""
    proc = processes.own(
        await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", "worker", "backfill", "--config", str(stack.config_path)],
            *["--since", iso_from_ms(since_ms)],
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            cwd=ROOT,
        )
    )
    out, _ = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def test_backfill_beside_a_running_serve_books_a_lost_deposit_once(
    start_stack: MakeStack, processes: Processes
) -> None:
    """While serve runs, backfill books a deposit whose webhook was lost, once; run again, and
    serve's own catch-up after it, nothing changes."""
    stack = await start_stack(history_interval_s=NEVER, detail_interval_s=NEVER)
    make_active(stack, 1002)
    await catchups_done(stack)
    since = now_ms() - 60_000
    seen = stack.sandbox.inject_deposit(1002, "USDT", "TRON", "1.00", ACTIVE_SOURCE)

    async def seen_booked() -> bool:
        return seen["transactionId"] in book_counts(await stack.ledger())

    await stack.wait_for(seen_booked, 10, "the deposit announced by its webhook")
    stack.sandbox.drop_webhooks(1)
    lost = stack.sandbox.inject_deposit(1002, "USDT", "TRON", "2.00", ACTIVE_SOURCE)
    await stack.sandbox.delivered_idle()
    await stack.settle()

    code, out = await run_backfill(processes, stack, since)
    assert code == 0, out
    assert "new deposits 1," in out
    await stack.settle()
    counts = book_counts(await stack.ledger())
    assert counts == {seen["transactionId"]: 1, lost["transactionId"]: 1}
    actions = await stack.actions()

    code, out = await run_backfill(processes, stack, since)
    assert code == 0 and "new deposits 0," in out and "new facts 0," in out, out
    catchup = stack.runtime.catchup
    assert catchup is not None
    stats = await catchup.catch_up()
    assert stats is not None and stats.complete and stats.new_deposits == 0
    await stack.settle()
    assert book_counts(await stack.ledger()) == counts
    assert await stack.actions() == actions


async def test_sandbox_history_without_filter_is_every_deposit_by_time_and_page(
    start_stack: MakeStack,
) -> None:
    """The sandbox's history without whiteListStatus holds every deposit (gated, ordinary,
    failed), filtered by createTime and paged."""
    stack = await start_stack(history_interval_s=NEVER, detail_interval_s=NEVER)
    make_active(stack, 1002)
    txs = [
        stack.sandbox.inject_deposit(1002, "USDT", "TRON", f"{i}.00", source)["transactionId"]
        for i, source in enumerate([ACTIVE_SOURCE, UNKNOWN_SOURCE, UNKNOWN_SOURCE], start=1)
    ]
    stack.sandbox.fail_order(txs[2])
    client = stack.runtime.client
    assert client is not None
    first = await client.history_records(page_size=2)
    second = await client.history_records(page_size=2, page_num=2)
    assert (first.totalRow, first.totalPage) == (3, 2)
    paged = [r["transactionId"] for r in first.records + second.records]
    assert sorted(paged) == sorted(txs)
    created = stack.sandbox.state.order(txs[1]).create_time
    only = await client.history_records(start_time=created, end_time=created)
    assert {r["transactionId"] for r in only.records} == {
        tx for tx in txs if stack.sandbox.state.order(tx).create_time == created
    }
    after = await client.history_records(start_time=created + 1)
    assert {r["transactionId"] for r in after.records} == {
        tx for tx in txs if stack.sandbox.state.order(tx).create_time > created
    }
