"""What the tests do to a running `Stack` (worker/dev/harness.py: sandbox, worker, Slack and
SMTP on loopback) and read from it: sources made ACTIVE at the sandbox, the catch-up at start
waited for, a day of booked deposits, the day's open findings, its /metrics."""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from worker.dev.harness import Stack
from worker.dev.sandbox.testing import ENTITY_PAYER
from worker.store import findings as findings_store

MakeStack = Callable[..., Awaitable[Stack]]  # the `start_stack` fixture
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]  # one /metrics page
NEVER = 3600.0  # poll intervals: only the polls at start run, the catch-up does the rest
ACTIVE_SOURCE = "TActiveSource000000000000000000001"
UNKNOWN_SOURCE = "TUnknownSource00000000000000000001"


async def scrape(stack: Stack) -> Samples:
    """GET /metrics from the worker: (sample name, sorted labels) -> value."""
    async with (
        aiohttp.ClientSession() as http,
        http.get(stack.worker_url + "/metrics") as resp,
    ):
        assert resp.status == 200
        text = await resp.text()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def make_active(stack: Stack, wallet_id: int) -> None:
    """ACTIVE_SOURCE registered and approved (ACTIVE) at the sandbox for the wallet."""
    body = {**ENTITY_PAYER, "walletId": wallet_id, "walletAddress": ACTIVE_SOURCE}
    record = stack.sandbox.register_address({**body, "network": "TRON"})
    stack.sandbox.approve_address(record["id"])


async def catchups_done(stack: Stack) -> None:
    """Wait until the running worker finished a catch-up (the one at start). The catch-up is
    made once this instance leads the scheduler, which on a busy machine may come after the
    stack is up."""

    def done() -> bool:
        catchup = stack.runtime.catchup
        return catchup is not None and catchup.last is not None

    await stack.wait_for(done, 10, "the catch-up")


async def booked_day(stack: Stack, count: int) -> tuple[dt.date, list[str]]:
    """`count` deposits from an ACTIVE source, booked; their credit day and transactionIds."""
    make_active(stack, 1002)
    txs = [
        stack.sandbox.inject_deposit(1002, "USDT", "TRON", f"{i + 1}.25", ACTIVE_SOURCE)[
            "transactionId"
        ]
        for i in range(count)
    ]

    async def booked() -> bool:
        await stack.settle()  # gives up with a failure: a webhook never delivered fails here
        return len(await stack.ledger()) >= count

    await stack.wait_for(booked, 30, f"{count} deposits booked")
    assert len(await stack.ledger()) == count
    return dt.datetime.now(dt.UTC).date(), txs


async def open_findings(stack: Stack, day: dt.date) -> dict[str, dict[str, Any]]:
    """The open findings of the day by kind."""
    rows = await stack.store.read(lambda db: findings_store.findings_of_day(db, day.isoformat()))
    return {r["kind"]: r for r in rows}
