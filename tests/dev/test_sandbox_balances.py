"""Balances agree with the deposits at every step: a walk through every row of the interface's
Transitions table, reading detail, asset balance and the wallet list after each step."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import aiohttp
import pytest

from tests.support.configs import PROVIDER_KEY, PROVIDER_SECRET
from tests.support.sandboxes import StartSandbox
from worker.dev.sandbox import Sandbox
from worker.dev.sandbox.testing import ENTITY_PAYER, INDIVIDUAL_PAYER, WebhookRecorder
from worker.errors import ProviderBusinessError
from worker.provider.client import ProviderClient
from worker.provider.signing import signed_headers

MAIN, AUTO, PLAIN = 1000, 1001, 1002
SOURCE = "TQ5aXj8Tq6u2pG2Lw6xXw9zC3vGmZ5a1bB"
D = Decimal


class Walk:
    def __init__(
        self, sandbox: Sandbox, client: ProviderClient, hooks: WebhookRecorder, base: str
    ) -> None:
        self.sandbox, self.client, self.hooks, self.base = sandbox, client, hooks, base

    async def balances(self) -> dict[int, tuple[Decimal, Decimal]]:
        """(available, unavailable) of USDT per wallet, from asset-balance; the wallet list
        must say the same."""
        out = {}
        for wallet_id in (MAIN, AUTO, PLAIN):
            [row] = await self.client.asset_balance(wallet_id, "USDT")
            out[wallet_id] = (row.available, row.unavailable)
        listed = {
            g.walletId: (w.available, w.unavailable)
            for g in await self.client.list_wallets()
            for w in g.wallets
            if w.currency == "USDT"
        }
        assert {k: v for k, v in out.items() if v != (0, 0)} == {
            k: v for k, v in listed.items() if v != (0, 0)
        }
        return out

    async def check(
        self,
        tx: str,
        reading: tuple[str, str | None, str],
        balances: dict[int, tuple[str, str]],
        events: list[str],
    ) -> None:
        detail = await self.client.transaction_detail(tx)
        wls = detail.whiteListStatus.value if detail.whiteListStatus else None
        assert (detail.status.value, wls, detail.creditStatus.value) == reading
        assert await self.balances() == {
            w: (D(balances.get(w, ("0", "0"))[0]), D(balances.get(w, ("0", "0"))[1]))
            for w in (MAIN, AUTO, PLAIN)
        }
        await self.sandbox.delivered_idle()
        assert self.hooks.types(tx) == events


@pytest.fixture
async def walk(start_sandbox: StartSandbox) -> Walk:
    s = await start_sandbox(hooks=True)
    assert s.hooks is not None
    return Walk(s.sandbox, s.client, s.hooks, s.url)


REQ, FAILED, CREDITED, ORDER = (
    "DEPOSIT_WHITELIST_REQUIRED",
    "DEPOSIT_WHITELIST_FAILED",
    "DEPOSIT_WHITELIST_CREDITED",
    "DEPOSIT_ORDER_NOTIFICATION",
)


async def test_gated_deposit_with_auto_collection_walks_every_row(walk: Walk) -> None:
    """Confirmed (not ACTIVE) -> submit -> reject -> resubmit -> approve -> sweep: the funds sit
    unavailable until approval, then available in the receiving wallet, then in the main
    account after the sweep; each step with the Transitions table's event."""
    tx = walk.sandbox.inject_deposit(AUTO, "USDT", "TRON", "40.25", SOURCE)["transactionId"]
    held = {AUTO: ("0", "40.25")}
    await walk.check(tx, ("PROCESSING", "init", "PENDING"), held, [REQ])
    await walk.client.submit_payer(tx, ENTITY_PAYER, idempotency_key="k1")
    await walk.check(tx, ("PROCESSING", "pending", "PENDING"), held, [REQ])
    walk.sandbox.reject_review(tx, "name mismatch")
    await walk.check(tx, ("PROCESSING", "rejected", "PENDING"), held, [REQ, FAILED])
    await walk.client.submit_payer(tx, INDIVIDUAL_PAYER, idempotency_key="k2")
    await walk.check(tx, ("PROCESSING", "pending", "PENDING"), held, [REQ, FAILED])
    walk.sandbox.approve_review(tx)
    credited = {AUTO: ("40.25", "0")}
    await walk.check(tx, ("PROCESSING", "approved", "CREDITED"), credited, [REQ, FAILED, CREDITED])
    walk.sandbox.finish_sweep(tx)
    swept = {MAIN: ("40.25", "0")}
    events = [REQ, FAILED, CREDITED, ORDER]
    await walk.check(tx, ("SUCCESS", "approved", "CREDITED"), swept, events)


async def test_gated_deposit_without_auto_collection_succeeds_on_approval(walk: Walk) -> None:
    """Without auto-collection, review passes -> SUCCESS at once, funds available in place."""
    tx = walk.sandbox.inject_deposit(PLAIN, "USDT", "TRON", "3", SOURCE)["transactionId"]
    await walk.client.submit_payer(tx, ENTITY_PAYER, idempotency_key="k1")
    walk.sandbox.approve_review(tx)
    await walk.check(
        tx, ("SUCCESS", "approved", "CREDITED"), {PLAIN: ("3", "0")}, [REQ, CREDITED, ORDER]
    )


async def test_active_source_deposits_credit_at_once(walk: Walk) -> None:
    """Source address register -> ACTIVE, then deposits from it are ordinary: credited at once,
    no whitelist event; with auto-collection SUCCESS (and the main account) after the sweep; a
    rejected address (FAILED) still gates."""
    body = {**ENTITY_PAYER, "walletId": PLAIN, "walletAddress": SOURCE, "network": "TRON"}
    record = await walk.client.register_address(body, idempotency_key="r1")
    assert record.status.value == "PROCESSING"
    walk.sandbox.approve_address(record.id)
    assert (await walk.client.address_detail(record.id)).status.value == "ACTIVE"
    plain = walk.sandbox.inject_deposit(PLAIN, "USDT", "TRON", "2", SOURCE)["transactionId"]
    await walk.check(plain, ("SUCCESS", None, "CREDITED"), {PLAIN: ("2", "0")}, [ORDER])

    auto_body = {**body, "walletId": AUTO}
    auto_record = await walk.client.register_address(auto_body, idempotency_key="r2")
    walk.sandbox.approve_address(auto_record.id)
    tx = walk.sandbox.inject_deposit(AUTO, "USDT", "TRON", "5", SOURCE)["transactionId"]
    both = {PLAIN: ("2", "0"), AUTO: ("5", "0")}
    await walk.check(tx, ("PROCESSING", None, "CREDITED"), both, [])
    walk.sandbox.finish_sweep(tx)
    await walk.check(
        tx, ("SUCCESS", None, "CREDITED"), {PLAIN: ("2", "0"), MAIN: ("5", "0")}, [ORDER]
    )

    other = "TOtherSource000000000000000000000"
    failed = await walk.client.register_address(
        {**body, "walletAddress": other}, idempotency_key="r3"
    )
    walk.sandbox.reject_address(failed.id, "document unreadable")
    assert (await walk.client.address_detail(failed.id)).status.value == "FAILED"
    gated = walk.sandbox.inject_deposit(PLAIN, "USDT", "TRON", "1", other)["transactionId"]
    await walk.check(
        gated,
        ("PROCESSING", "init", "PENDING"),
        {PLAIN: ("2", "1"), MAIN: ("5", "0")},
        [REQ],
    )


async def test_wallet_list_amounts_are_numbers(walk: Walk) -> None:
    """The wallet list carries available and unavailable as JSON numbers with exact digits."""
    walk.sandbox.inject_deposit(PLAIN, "USDT", "TRON", "1.50", SOURCE)
    origin = walk.base
    headers = signed_headers(
        PROVIDER_KEY, PROVIDER_SECRET, "GET", "/v1/wallet/list?walletId=1002", b""
    )
    async with (
        aiohttp.ClientSession() as session,
        session.get(origin + "/v1/wallet/list?walletId=1002", headers=headers) as resp,
    ):
        text = (await resp.read()).decode()
    assert '"available":0,"unavailable":1.50' in text


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda c: c.create_sub_wallet({"name": "x"}, idempotency_key=""), "Idempotency-Key"),
        (lambda c: c.deposit_address(AUTO, "USDT"), "network"),
        (lambda c: c.deposit_address(None), "walletId"),  # type: ignore[arg-type]
    ],
    ids=["idempotency key", "network", "walletId"],
)
async def test_missing_input_is_a_plain_400(walk: Walk, call: Any, words: str) -> None:
    """A missing Idempotency-Key or query parameter is HTTP 400 with a message naming it, not a
    wallet code (10000102 means payer details incomplete)."""
    with pytest.raises(ProviderBusinessError) as info:
        await call(walk.client)
    assert (info.value.http_status, info.value.code) == (400, None)
    assert words in info.value.msg
