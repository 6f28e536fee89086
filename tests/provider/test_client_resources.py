"""Typed answers of the client against the sandbox: paging helpers fetch one page at a time,
quote expiry, and the sandbox's new state surviving a restart."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from tests.support.configs import PROVIDER_KEY, PROVIDER_SECRET
from tests.support.sandboxes import sandbox_settings
from worker.dev.sandbox import SANDBOX_KEY, create_app, orders
from worker.dev.sandbox.testing import ENTITY_PAYER
from worker.provider.client import ProviderClient
from worker.provider.resources import AbnormalFund, QuoteResponse, SettlementRecord

SOURCE = "TQ5aXj8Tq6u2pG2Lw6xXw9zC3vGmZ5a1bB"
FUND = {"amount": "1", "currency": "USDT", "network": "TRON", "fromAddress": "a", "toAddress": "b"}


NOW = 1_795_000_000_000  # 2026-11-18T11:06:40Z, fixed: a test never straddles midnight
DAY = dt.datetime.fromtimestamp(NOW / 1000, dt.UTC).date().isoformat()


async def start(aiohttp_server: Any, **cfg: Any) -> tuple[Any, ProviderClient]:
    app = create_app(sandbox_settings(**cfg), clock=lambda: NOW)
    server = await aiohttp_server(app)
    client = ProviderClient(str(server.make_url("/")), PROVIDER_KEY, PROVIDER_SECRET, retries=0)
    return app, client


async def test_abnormal_pages_fetched_as_consumed(
    aiohttp_server: Any, recorded: list[dict[str, Any]]
) -> None:
    """The abnormal-fund iterator asks for the next page only when the previous one is used up,
    and stops after the last page."""
    app, client = await start(aiohttp_server)
    for i in range(5):
        app[SANDBOX_KEY].inject_abnormal_fund({**FUND, "txHash": f"0x{i}"})
    try:
        it = client.iter_abnormal_funds(page_size=2, statuses=["UNMATCHED"])
        first: AbnormalFund = await anext(it)
        assert (first.txHash, len(recorded)) == ("0x0", 1)
        rest = [r.txHash async for r in it]
    finally:
        await client.close()
    assert rest == ["0x1", "0x2", "0x3", "0x4"]
    assert len(recorded) == 3


async def test_settlement_pages_fetched_as_consumed(
    aiohttp_server: Any, recorded: list[dict[str, Any]]
) -> None:
    """The settlement iterator reads page by page and stops at `total`."""
    app, client = await start(aiohttp_server)
    sandbox = app[SANDBOX_KEY]
    try:
        for i in range(3):
            tx = sandbox.inject_deposit(1002, "USDT", "TRON", f"{i + 1}", SOURCE)["transactionId"]
            await client.submit_payer(tx, ENTITY_PAYER, idempotency_key=f"k{i}")
            sandbox.approve_review(tx)
        before = len(recorded)
        it = client.iter_settlement_records(settlement_date=DAY, page_size=2)
        first: SettlementRecord = await anext(it)
        assert len(recorded) == before + 1
        amounts = [first.amount] + [r.amount async for r in it]
    finally:
        await client.close()
    assert sorted(str(a) for a in amounts) == ["1", "2", "3"]  # one credit instant: any order
    assert len(recorded) == before + 2


@pytest.mark.parametrize(
    ("offset_s", "expired"), [(-1, False), (0, True), (1, True)], ids=["before", "at", "after"]
)
def test_quote_expiry(offset_s: int, expired: bool) -> None:
    """A quote is expired from its expires_at on, never before."""
    q = QuoteResponse.model_validate({"quote_id": "q", "expires_at": "2026-11-22T10:00:00.000Z"})
    moment = dt.datetime(2026, 11, 22, 10, tzinfo=dt.UTC) + dt.timedelta(seconds=offset_s)
    assert q.expired(moment) is expired


async def test_new_state_survives_a_restart(aiohttp_server: Any, tmp_path: Path) -> None:
    """Abnormal funds, discrepancies, orders, onboardings, quotes and link tokens are in the
    state file and read back after a restart, amounts exact."""
    state = tmp_path / "sandbox.db"
    app, client = await start(aiohttp_server, state_path=state)
    sandbox = app[SANDBOX_KEY]
    sandbox.inject_abnormal_fund({**FUND, "amount": "0.10"})
    tx = sandbox.inject_deposit(1002, "USDT", "TRON", "5", SOURCE)["transactionId"]
    sandbox.add_discrepancy(
        {"kind": "amount", "date": "2026-11-22", "transactionId": tx, "amount": "4.5"}
    )
    order = orders.create_stable_order(sandbox, {"merchantOrderId": "M", "sourceAmount": "150.5"})
    quote = await client.quote(
        {"from_currency": "USD", "to_currency": "USDT", "from_amount": "100"}
    )
    link = await client.travel_rule_link(1002)
    await client.close()
    await app.shutdown()
    await app.cleanup()

    again = create_app(sandbox_settings(state_path=state))
    restored = again[SANDBOX_KEY].state
    assert str(restored.abnormal_funds[1]["amount"]) == "0.10"
    assert str(restored.settlement_changes[0]["amount"]) == "4.5"
    assert str(restored.stable_orders[order["orderId"]]["sourceAmount"]) == "150.5"
    assert quote.quote_id in restored.quotes
    assert link.url.split("token=")[1] in restored.travel_rule_tokens
    await again[SANDBOX_KEY].stop()
