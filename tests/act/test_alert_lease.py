"""An alert send that outlasts the claim lease: the channel stays claimed while it is in
flight, so a second instance does not send the same alert again (both engines)."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from typing import Any

import pytest
import sqlite_utils
from aiohttp import web
from structlog.testing import capture_logs

from worker.act.outbox import Outbox
from worker.act.queue import enqueue_alert
from worker.config.profiles import Profiles
from worker.notify import SlackNotifier
from worker.provider.client import ProviderClient
from worker.store import actions, alerts
from worker.store.deposits import upsert_deposit_row
from worker.store.sqlitestore import Store
from worker.track.tracker import Deposit, Fact, observe

LEASE_S = 0.6


@pytest.fixture
async def slow_slack(aiohttp_server: Any) -> tuple[str, list[Any], asyncio.Event]:
    """A Slack endpoint that takes four leases to answer each post (the event: one came)."""
    posts: list[Any] = []
    posted = asyncio.Event()

    async def hook(request: web.Request) -> web.Response:
        posts.append(await request.json())
        posted.set()
        await asyncio.sleep(LEASE_S * 4)
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/hook", hook)
    server = await aiohttp_server(app)
    return str(server.make_url("/hook")), posts, posted


def _deposit() -> Deposit:
    fact = Fact(
        transaction_id="tx-1",
        source="webhook",
        observed_at=1_700_000_000_000,
        wallet_id=1001,
        wallet_name="Main",
        currency="USDT",
        network="TRON",
        amount=Decimal("100.5"),
        from_address="TAbcDef",
    )
    return observe(None, fact)[0]


def _outbox(store: Store, client: ProviderClient, url: str, instance: str) -> Outbox:
    async def no_fact(fact: Fact) -> None:
        return None

    return Outbox(
        store,
        client=client,
        notifiers={"slack": SlackNotifier(url)},
        profiles=Profiles.empty,
        observe=no_fact,
        instance=instance,
        lease_s=LEASE_S,
    )


async def test_a_send_longer_than_the_lease_is_not_repeated_by_another_instance(
    store: Store, slow_slack: tuple[str, list[Any], asyncio.Event]
) -> None:
    """Two instances run two rows of the same alert (same deposit, condition, channel) while
    the first send takes four leases: Slack gets it once and one send is recorded."""
    url, posts, posted = slow_slack
    deposit = _deposit()

    def queue(db: sqlite_utils.Database) -> None:
        upsert_deposit_row(db, deposit.to_row())
        for _ in range(2):
            enqueue_alert(db, deposit, "rejected", "warning", trigger="rejected")

    await store.write(queue)
    client = ProviderClient("http://127.0.0.1:9", "key", "secret", retries=0)
    first, second = (_outbox(store, client, url, name) for name in ("a", "b"))
    try:
        sending = asyncio.create_task(first.run_once())
        await asyncio.wait_for(posted.wait(), timeout=10)
        # The second instance runs its row once the first claim's lease would have lapsed,
        # the first send still in flight.
        await asyncio.sleep(LEASE_S * 1.5)
        assert not sending.done()
        await second.run_once(include_delayed=True)
        await sending
        await second.run_once(include_delayed=True)
    finally:
        await client.close()
    assert len(posts) == 1
    [row] = await store.read(lambda db: alerts.alerts_of(db, "tx-1"))
    assert (row["status"], row["attempts"], row["claimed_by"]) == ("sent", 1, "a")


async def test_a_running_action_whose_claim_was_taken_over_stops_and_records_nothing(
    store: Store, slow_slack: tuple[str, list[Any], asyncio.Event]
) -> None:
    """Another instance took the row over while the send was in flight (this one's claim
    lapsed): the renewal stops the send, nothing is recorded by the first instance, the log
    and the claims-lost count say so."""
    url, _, posted = slow_slack
    deposit = _deposit()

    def queue(db: sqlite_utils.Database) -> int:
        upsert_deposit_row(db, deposit.to_row())
        return enqueue_alert(db, deposit, "rejected", "warning", trigger="rejected")

    action_id = await store.write(queue)
    client = ProviderClient("http://127.0.0.1:9", "key", "secret", retries=0)
    outbox = _outbox(store, client, url, "a")
    lost: list[str] = []
    outbox._rows._on_lost = lost.append
    far = "9999-01-01T00:00:00.000Z"
    try:
        with capture_logs() as logs:
            sending = asyncio.create_task(outbox.run_once())
            await asyncio.wait_for(posted.wait(), timeout=10)
            # As if "a" had paused past its lease and "b" had claimed the row meanwhile.
            assert await store.write(
                lambda db: actions.claim_action(db, action_id, instance="b", now=far, until=far)
            )
            assert await asyncio.wait_for(sending, timeout=LEASE_S * 2) == 1
    finally:
        await client.close()
    [row] = await store.read(lambda db: actions.actions_of(db, "tx-1"))
    assert (row["status"], row["claimed_by"], row["outcome"]) == ("running", "b", None)
    [sent] = await store.read(lambda db: alerts.alerts_of(db, "tx-1"))
    assert (sent["status"], sent["attempts"]) == ("pending", 0)
    assert lost == ["renewal"]
    assert any("claim lost to another instance" in line["event"] for line in logs)
