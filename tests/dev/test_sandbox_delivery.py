"""Webhook delivery of the sandbox: signed, retried with back-off, in order per deposit,
losable on purpose, and never a whitelist event for an ACTIVE source address."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from tests.support.sandboxes import StartSandbox, sandbox_settings
from worker.dev.sandbox import Sandbox
from worker.dev.sandbox.delivery import Deliverer
from worker.dev.sandbox.testing import ENTITY_PAYER, WebhookRecorder
from worker.provider.client import ProviderClient

SOURCE = "TQ5aXj8Tq6u2pG2Lw6xXw9zC3vGmZ5a1bB"
REQUIRED, FAILED, CREDITED, ORDER = (
    "DEPOSIT_WHITELIST_REQUIRED",
    "DEPOSIT_WHITELIST_FAILED",
    "DEPOSIT_WHITELIST_CREDITED",
    "DEPOSIT_ORDER_NOTIFICATION",
)


@dataclass
class Env:
    sandbox: Sandbox
    client: ProviderClient
    hooks: WebhookRecorder

    def deposit(self, wallet_id: int = 1002, source: str = SOURCE) -> str:
        order = self.sandbox.inject_deposit(wallet_id, "USDT", "TRON", "1", source)
        return str(order["transactionId"])

    async def credit(self, tx: str) -> None:
        await self.client.submit_payer(tx, ENTITY_PAYER, idempotency_key=f"k-{tx}")
        self.sandbox.approve_review(tx)

    async def settle(self) -> None:
        await self.sandbox.delivered_idle()
        assert self.hooks.rejected == []


Factory = Callable[..., Awaitable[Env]]


@pytest.fixture
def start(start_sandbox: StartSandbox) -> Factory:
    async def make(query: str = "", **overrides: Any) -> Env:
        settings = {"delivery_retry_base_s": 0.01, "delivery_retry_max_s": 0.04, **overrides}
        s = await start_sandbox(hooks=True, hooks_query=query, **settings)
        assert s.hooks is not None
        return Env(s.sandbox, s.client, s.hooks)

    return make


async def test_failed_delivery_retried_and_later_events_wait(start: Factory) -> None:
    """500, 500, then 200: the event arrives once, and the deposit's later events after it."""
    env = await start()
    env.hooks.fail_with.extend([500, 500])
    tx = env.deposit()
    await env.credit(tx)
    await env.settle()
    assert env.hooks.types(tx) == [REQUIRED, CREDITED, ORDER]
    assert [a["eventType"] for a in env.hooks.attempts] == [REQUIRED] * 3 + [CREDITED, ORDER]
    assert len({e["eventId"] for e in env.hooks.events}) == 3


async def test_one_failing_deposit_does_not_hold_up_another(start: Factory) -> None:
    """Retries of one deposit's events do not delay another deposit's events."""
    env = await start(delivery_retry_base_s=0.2, delivery_retry_max_s=0.2)
    stuck = env.deposit()
    env.hooks.fail_reference[stuck] = 3
    other = env.deposit()
    async with asyncio.timeout(1):
        await env.hooks.wait_for(lambda events: any(e["referenceId"] == other for e in events))
    assert env.hooks.types(stuck) == []
    await env.settle()
    assert env.hooks.types(stuck) == [REQUIRED]


async def test_timeout_is_retried(start: Factory) -> None:
    """A receiver slower than delivery_timeout_s gets the event again, accepted once."""
    env = await start(delivery_timeout_s=0.1)
    env.hooks.stall_s.append(0.5)
    tx = env.deposit()
    await env.settle()
    assert env.hooks.types(tx) == [REQUIRED]
    assert len(env.hooks.attempts) == 2


async def test_drop_webhooks_drops_exactly_n(start: Factory) -> None:
    """drop_webhooks(2) loses the next two events, and only those."""
    env = await start()
    env.sandbox.drop_webhooks(2)
    first, second, third = env.deposit(), env.deposit(), env.deposit()
    await env.credit(first)
    await env.settle()
    assert env.hooks.types(first) == [CREDITED, ORDER]
    assert env.hooks.types(second) == []
    assert env.hooks.types(third) == [REQUIRED]
    recent = env.sandbox.snapshot()["webhooks"]["recent"]
    assert [d["state"] for d in recent].count("dropped") == 2
    assert len(env.hooks.attempts) == 3


@pytest.mark.parametrize("wallet_id", [1001, 1002], ids=["auto-collect", "plain"])
async def test_never_whitelist_events_for_active_source(start: Factory, wallet_id: int) -> None:
    """Deposits from an ACTIVE address of the wallet never emit DEPOSIT_WHITELIST_*."""
    env = await start()
    body = {**ENTITY_PAYER, "walletId": wallet_id, "walletAddress": SOURCE, "network": "TRON"}
    record = await env.client.register_address(body, idempotency_key="reg")
    env.sandbox.approve_address(record.id)
    txs = [env.deposit(wallet_id) for _ in range(3)]
    if wallet_id == 1001:
        for tx in txs:
            env.sandbox.finish_sweep(tx)
    await env.settle()
    assert env.hooks.types(record.id) == ["WALLET_ADDRESS_UPDATED"]
    for tx in txs:
        assert env.hooks.types(tx) == [ORDER]
    assert not {REQUIRED, FAILED, CREDITED} & set(env.hooks.types())


async def test_active_elsewhere_or_disabled_source_is_still_gated(start: Factory) -> None:
    """An address ACTIVE for another wallet, or disabled, does not skip the whitelist."""
    env = await start()
    body = {**ENTITY_PAYER, "walletId": 1001, "walletAddress": SOURCE, "network": "TRON"}
    record = await env.client.register_address(body, idempotency_key="reg")
    env.sandbox.approve_address(record.id)
    other_wallet = env.deposit(1002)
    await env.client.disable_address(record.id, idempotency_key="dis")
    disabled = env.deposit(1001)
    await env.settle()
    assert env.hooks.types(other_wallet) == [REQUIRED]
    assert env.hooks.types(disabled) == [REQUIRED]


async def test_signed_over_path_and_query(start: Factory) -> None:
    """The signature covers the webhook URL's path and query; the receiver verifies it."""
    env = await start(query="?tenant=acme")
    tx = env.deposit()
    await env.settle()
    (event,) = env.hooks.of(tx)
    assert set(event) == {"eventId", "eventType", "referenceId", "status", "timestamp", "data"}
    assert event["data"]["transactionId"] == tx and isinstance(event["timestamp"], int)


async def test_rejection_event_carries_fail_message(start: Factory) -> None:
    """DEPOSIT_WHITELIST_FAILED data is the notification shape plus failMessage."""
    env = await start()
    tx = env.deposit()
    await env.client.submit_payer(tx, ENTITY_PAYER, idempotency_key="k")
    env.sandbox.reject_review(tx, "wrong country")
    await env.settle()
    data = env.hooks.of(tx)[-1]["data"]
    assert set(data) == {
        "transactionId",
        "transactionHash",
        "transactionType",
        "amount",
        "currency",
        "network",
        "fromAddress",
        "walletId",
        "walletName",
        "status",
        "timestamp",
        "whiteListStatus",
        "failMessage",
    }
    assert (data["whiteListStatus"], data["failMessage"]) == ("rejected", "wrong country")


async def test_without_webhook_url_nothing_is_sent(start: Factory) -> None:
    """Without a webhook URL events are kept as unsent and delivered_idle returns at once."""
    env = await start(webhook_url=None)
    env.deposit()
    await env.settle()
    assert env.hooks.attempts == []
    assert [d["state"] for d in env.sandbox.snapshot()["webhooks"]["recent"]] == ["unsent"]


def test_backoff_doubles_up_to_the_cap() -> None:
    """Retry delays double from the base and stop growing at the maximum."""
    cfg = sandbox_settings(delivery_retry_base_s=0.5, delivery_retry_max_s=30)
    deliverer = Deliverer(cfg)
    assert [deliverer.backoff(n) for n in (1, 2, 3, 4, 7, 8, 20)] == [
        0.5,
        1.0,
        2.0,
        4.0,
        30.0,
        30.0,
        30.0,
    ]
