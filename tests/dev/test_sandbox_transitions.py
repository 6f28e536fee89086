"""The sandbox follows every row of the interface's Transitions and Combined reading tables.

Driven through the signed HTTP API with the real ProviderClient and the in-process Sandbox
handle; webhooks are received by a real, signature-checking receiver on loopback.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pytest

from tests.support.sandboxes import StartSandbox
from worker.dev.sandbox import Sandbox
from worker.dev.sandbox.testing import ENTITY_PAYER, WebhookRecorder
from worker.errors import SandboxError
from worker.provider.client import ProviderClient
from worker.provider.models import AddressStatus, CreditStatus, OrderStatus, WhiteListStatus

AUTO, PLAIN = 1001, 1002  # wallet with auto-collection, wallet without
MAIN = 1000  # the main account auto-collection sweeps into
SOURCE = "TQ5aXj8Tq6u2pG2Lw6xXw9zC3vGmZ5a1bB"
WL_EVENTS = {"DEPOSIT_WHITELIST_REQUIRED", "DEPOSIT_WHITELIST_FAILED", "DEPOSIT_WHITELIST_CREDITED"}


@dataclass
class Env:
    sandbox: Sandbox
    client: ProviderClient
    hooks: WebhookRecorder

    def deposit(self, wallet_id: int = AUTO, amount: str = "125.5", source: str = SOURCE) -> str:
        order = self.sandbox.inject_deposit(wallet_id, "USDT", "TRON", amount, source)
        return str(order["transactionId"])

    async def reading(self, tx_id: str) -> tuple[OrderStatus, WhiteListStatus | None, Any]:
        order = await self.client.transaction_detail(tx_id)
        return order.status, order.whiteListStatus, order.creditStatus

    async def balance(self, wallet_id: int = AUTO) -> tuple[Decimal, Decimal]:
        (row,) = await self.client.asset_balance(wallet_id, "USDT")
        return row.available, row.unavailable

    async def submit(self, tx_id: str, key: str = "k1", **changes: Any) -> str:
        result = await self.client.submit_payer(
            tx_id, {**ENTITY_PAYER, **changes}, idempotency_key=key
        )
        return result.whiteListStatus.value

    async def delivered(self, reference_id: str) -> list[dict[str, Any]]:
        await self.sandbox.delivered_idle()
        assert self.hooks.rejected == []
        return self.hooks.of(reference_id)

    async def types(self, reference_id: str) -> list[str]:
        return [e["eventType"] for e in await self.delivered(reference_id)]

    async def register(self, wallet_id: int = PLAIN, key: str = "reg-1") -> str:
        body = {**ENTITY_PAYER, "walletId": wallet_id, "walletAddress": SOURCE, "network": "TRON"}
        record = await self.client.register_address(body, idempotency_key=key)
        return record.id


@pytest.fixture
async def env(start_sandbox: StartSandbox) -> Env:
    s = await start_sandbox(
        hooks=True, client_timeout_s=5, delivery_retry_base_s=0.01, delivery_retry_max_s=0.05
    )
    assert s.hooks is not None
    return Env(s.sandbox, s.client, s.hooks)


# --- Transitions table, one test per row --------------------------------------------------------


async def test_confirmed_from_unknown_source_needs_details(env: Env) -> None:
    """Not ACTIVE source: PROCESSING/init/PENDING, DEPOSIT_WHITELIST_REQUIRED, funds unavailable."""
    tx = env.deposit(amount="125.5")
    assert await env.reading(tx) == (
        OrderStatus.PROCESSING,
        WhiteListStatus.INIT,
        CreditStatus.PENDING,
    )
    assert await env.balance() == (Decimal(0), Decimal("125.5"))
    (event,) = await env.delivered(tx)
    assert event["eventType"] == "DEPOSIT_WHITELIST_REQUIRED"
    assert event["status"] == "PROCESSING"
    assert event["data"]["whiteListStatus"] == "init"
    # A JSON number, as the interface's event table has it (parsed straight to Decimal).
    assert event["data"]["amount"] == Decimal("125.5")


@pytest.mark.parametrize(
    ("wallet_id", "final_at_once"), [(PLAIN, True), (AUTO, False)], ids=["plain", "auto-collect"]
)
async def test_confirmed_from_active_source_is_ordinary(
    env: Env, wallet_id: int, final_at_once: bool
) -> None:
    """ACTIVE source: no whitelist, credited; DEPOSIT_ORDER_NOTIFICATION only on completion."""
    address_id = await env.register(wallet_id)
    env.sandbox.approve_address(address_id)
    tx = env.deposit(wallet_id, amount="10")
    status, wls, credit = await env.reading(tx)
    assert (wls, credit) == (None, CreditStatus.CREDITED)
    assert await env.balance(wallet_id) == (Decimal(10), Decimal(0))
    if not final_at_once:
        assert status is OrderStatus.PROCESSING
        assert await env.types(tx) == []
        env.sandbox.finish_sweep(tx)
        assert (await env.reading(tx))[0] is OrderStatus.SUCCESS
    else:
        assert status is OrderStatus.SUCCESS
    (event,) = await env.delivered(tx)
    assert event["eventType"] == "DEPOSIT_ORDER_NOTIFICATION"
    assert event["data"]["status"] == "SUCCESS"
    assert event["data"]["whiteListStatus"] is None


async def test_submit_on_init_makes_pending(env: Env) -> None:
    """init + valid payer details -> pending; no webhook for the submission itself."""
    tx = env.deposit()
    assert await env.submit(tx) == "pending"
    assert await env.reading(tx) == (
        OrderStatus.PROCESSING,
        WhiteListStatus.PENDING,
        CreditStatus.PENDING,
    )
    assert await env.types(tx) == ["DEPOSIT_WHITELIST_REQUIRED"]


async def test_resubmit_on_rejected_makes_pending(env: Env) -> None:
    """rejected + valid payer details again -> pending, failMessage cleared."""
    tx = env.deposit()
    await env.submit(tx, key="first")
    env.sandbox.reject_review(tx, "name mismatch")
    assert (await env.reading(tx))[1] is WhiteListStatus.REJECTED
    assert await env.submit(tx, key="second", fullName="Acme Trading Pte Ltd") == "pending"
    order = await env.client.transaction_detail(tx)
    assert (order.whiteListStatus, order.failMessage) == (WhiteListStatus.PENDING, None)


async def test_review_passes_credits(env: Env) -> None:
    """pending + review passes -> approved, CREDITED, WHITELIST_CREDITED, funds available."""
    tx = env.deposit(AUTO, amount="99.99")
    await env.submit(tx)
    env.sandbox.approve_review(tx)
    assert await env.reading(tx) == (
        OrderStatus.PROCESSING,
        WhiteListStatus.APPROVED,
        CreditStatus.CREDITED,
    )
    assert await env.balance(AUTO) == (Decimal("99.99"), Decimal(0))
    events = await env.delivered(tx)
    assert [e["eventType"] for e in events] == [
        "DEPOSIT_WHITELIST_REQUIRED",
        "DEPOSIT_WHITELIST_CREDITED",
    ]
    credited = events[1]["data"]
    assert credited["whiteListStatus"] == "approved"
    assert isinstance(credited["creditTime"], int)


async def test_review_rejects_keeps_funds_unavailable(env: Env) -> None:
    """pending + review rejects -> rejected, DEPOSIT_WHITELIST_FAILED with failMessage."""
    tx = env.deposit(amount="7")
    await env.submit(tx)
    env.sandbox.reject_review(tx, "payer name does not match")
    assert await env.reading(tx) == (
        OrderStatus.PROCESSING,
        WhiteListStatus.REJECTED,
        CreditStatus.PENDING,
    )
    assert await env.balance() == (Decimal(0), Decimal(7))
    failed = (await env.delivered(tx))[-1]
    assert failed["eventType"] == "DEPOSIT_WHITELIST_FAILED"
    assert failed["data"]["failMessage"] == "payer name does not match"
    assert failed["data"]["status"] == "PROCESSING"


async def test_sweep_finishes_with_auto_collection(env: Env) -> None:
    """PROCESSING approved + sweep finishes (auto-collection) -> SUCCESS + notification."""
    tx = env.deposit(AUTO)
    await env.submit(tx)
    env.sandbox.approve_review(tx)
    assert "DEPOSIT_ORDER_NOTIFICATION" not in await env.types(tx)
    env.sandbox.finish_sweep(tx)
    assert (await env.reading(tx))[0] is OrderStatus.SUCCESS
    last = (await env.delivered(tx))[-1]
    assert (last["eventType"], last["status"]) == ("DEPOSIT_ORDER_NOTIFICATION", "SUCCESS")
    assert last["data"]["whiteListStatus"] == "approved"


async def test_review_passes_without_auto_collection_succeeds(env: Env) -> None:
    """approved without auto-collection -> SUCCESS at once, CREDITED then ORDER_NOTIFICATION."""
    tx = env.deposit(PLAIN, amount="3")
    await env.submit(tx)
    env.sandbox.approve_review(tx)
    assert await env.reading(tx) == (
        OrderStatus.SUCCESS,
        WhiteListStatus.APPROVED,
        CreditStatus.CREDITED,
    )
    assert await env.balance(PLAIN) == (Decimal(3), Decimal(0))
    assert await env.types(tx) == [
        "DEPOSIT_WHITELIST_REQUIRED",
        "DEPOSIT_WHITELIST_CREDITED",
        "DEPOSIT_ORDER_NOTIFICATION",
    ]


async def test_register_address_is_processing(env: Env) -> None:
    """A new source address record starts PROCESSING; no webhook yet."""
    address_id = await env.register()
    record = await env.client.address_detail(address_id)
    assert (record.status, record.walletAddress, record.network) == (
        AddressStatus.PROCESSING,
        SOURCE,
        "TRON",
    )
    assert await env.types(address_id) == []


async def test_address_review_passes_active(env: Env) -> None:
    """PROCESSING + review passes -> ACTIVE with WALLET_ADDRESS_UPDATED."""
    address_id = await env.register()
    env.sandbox.approve_address(address_id)
    assert (await env.client.address_detail(address_id)).status is AddressStatus.ACTIVE
    (event,) = await env.delivered(address_id)
    assert event["eventType"] == "WALLET_ADDRESS_UPDATED"
    assert event["data"] == {
        "id": address_id,
        "walletAddress": SOURCE,
        "network": "TRON",
        "status": "ACTIVE",
        "failMessage": None,
    }


async def test_address_review_rejects_failed_then_disable_and_register_new(env: Env) -> None:
    """PROCESSING + review rejects -> FAILED; the caller disables it and registers a new one."""
    address_id = await env.register(key="reg-a")
    env.sandbox.reject_address(address_id, "document unreadable")
    record = await env.client.address_detail(address_id)
    assert (record.status, record.failMessage) == (AddressStatus.FAILED, "document unreadable")
    (event,) = await env.delivered(address_id)
    assert (event["status"], event["data"]["failMessage"]) == ("FAILED", "document unreadable")
    disabled = await env.client.disable_address(address_id, idempotency_key="dis-a")
    assert disabled is not None and disabled.status is AddressStatus.DISABLED
    new_id = await env.register(key="reg-b")
    assert new_id != address_id
    assert (await env.client.address_detail(new_id)).status is AddressStatus.PROCESSING


# --- Combined reading table, one case per row ---------------------------------------------------


COMBINED = [
    ("init", [], OrderStatus.PROCESSING, WhiteListStatus.INIT, CreditStatus.PENDING, False),
    (
        "pending",
        ["submit"],
        OrderStatus.PROCESSING,
        WhiteListStatus.PENDING,
        CreditStatus.PENDING,
        False,
    ),
    (
        "rejected",
        ["submit", "reject"],
        OrderStatus.PROCESSING,
        WhiteListStatus.REJECTED,
        CreditStatus.PENDING,
        False,
    ),
    (
        "approved-sweeping",
        ["submit", "approve"],
        OrderStatus.PROCESSING,
        WhiteListStatus.APPROVED,
        CreditStatus.CREDITED,
        True,
    ),
    (
        "success",
        ["submit", "approve", "sweep"],
        OrderStatus.SUCCESS,
        WhiteListStatus.APPROVED,
        CreditStatus.CREDITED,
        True,
    ),
]


@pytest.mark.parametrize(
    ("steps", "status", "wls", "credit", "spendable"),
    [row[1:] for row in COMBINED],
    ids=[row[0] for row in COMBINED],
)
async def test_combined_reading(
    env: Env,
    steps: list[str],
    status: OrderStatus,
    wls: WhiteListStatus,
    credit: CreditStatus,
    spendable: bool,
) -> None:
    """Each Combined reading row: detail shows the triple, the balance says spendable or not."""
    tx = env.deposit(AUTO, amount="42")
    for step in steps:
        if step == "submit":
            await env.submit(tx)
        elif step == "reject":
            env.sandbox.reject_review(tx, "incomplete")
        elif step == "approve":
            env.sandbox.approve_review(tx)
        else:
            env.sandbox.finish_sweep(tx)
    assert await env.reading(tx) == (status, wls, credit)
    expected = (Decimal(42), Decimal(0)) if spendable else (Decimal(0), Decimal(42))
    if "sweep" in steps:  # auto-collection moved the credited funds to the main account
        assert await env.balance(MAIN) == expected
        expected = (Decimal(0), Decimal(0))
    assert await env.balance(AUTO) == expected
    history = await env.client.history(wallet_id=AUTO)
    assert [(o.status, o.whiteListStatus) for o in history.records] == [(status, wls)]


# --- rows the interface leaves open (sandbox choices, docs/sandbox.md) ----------------------------


async def test_block_shows_only_in_detail(env: Env) -> None:
    """block -> creditStatus BLOCKED in transaction detail, no webhook, funds stay unavailable."""
    tx = env.deposit(amount="5")
    await env.submit(tx)
    env.sandbox.block(tx)
    assert await env.reading(tx) == (
        OrderStatus.PROCESSING,
        WhiteListStatus.PENDING,
        CreditStatus.BLOCKED,
    )
    assert await env.types(tx) == ["DEPOSIT_WHITELIST_REQUIRED"]
    assert await env.balance() == (Decimal(0), Decimal(5))
    (record,) = (await env.client.history(white_list_status=None)).records
    assert record.creditStatus is None  # history does not carry creditStatus


async def test_fail_order_notifies_fail(env: Env) -> None:
    """fail_order -> status FAIL with DEPOSIT_ORDER_NOTIFICATION FAIL; held funds released."""
    tx = env.deposit(amount="8")
    env.sandbox.fail_order(tx)
    assert (await env.reading(tx))[0] is OrderStatus.FAIL
    last = (await env.delivered(tx))[-1]
    assert (last["eventType"], last["status"]) == ("DEPOSIT_ORDER_NOTIFICATION", "FAIL")
    assert await env.balance() == (Decimal(0), Decimal(0))


@pytest.mark.parametrize("end", ["fail", "block"])
async def test_failed_or_blocked_deposit_is_never_decided(env: Env, end: str) -> None:
    """A review decision on a deposit that failed or was blocked while under review is refused:
    no SUCCESS out of FAIL, no second release of its funds, no late webhook."""
    tx = env.deposit(PLAIN, amount="10")
    await env.submit(tx)
    getattr(env.sandbox, "fail_order" if end == "fail" else "block")(tx)
    before = (await env.reading(tx), await env.balance(PLAIN), await env.types(tx))
    for decide in (env.sandbox.approve_review, lambda t: env.sandbox.reject_review(t, "late")):
        with pytest.raises(SandboxError):
            decide(tx)
    assert (await env.reading(tx), await env.balance(PLAIN), await env.types(tx)) == before


async def test_failed_deposit_leaves_the_work_queue(env: Env) -> None:
    """History's init queue lists deposits waiting for details, never a failed one."""
    waiting, failed = env.deposit(), env.deposit()
    env.sandbox.fail_order(failed)
    page = await env.client.history(white_list_status="init")
    assert [r.transactionId for r in page.records] == [waiting]


async def test_sweep_needs_auto_collection(env: Env) -> None:
    """Only a wallet with auto-collection sweeps (without it, approval made it SUCCESS)."""
    tx = env.deposit(AUTO)
    await env.submit(tx)
    env.sandbox.approve_review(tx)
    env.sandbox.put_wallet(AUTO, "Main USDT", auto_collection=False)
    with pytest.raises(SandboxError, match="no auto-collection"):
        env.sandbox.finish_sweep(tx)
    assert (await env.reading(tx))[0] is OrderStatus.PROCESSING


async def test_balance_of_a_currency_never_held_is_zero_and_not_kept(env: Env) -> None:
    """Asking for a currency the wallet never held answers zero without adding it to the wallet."""
    (row,) = await env.client.asset_balance(PLAIN, "FOO")
    assert (row.available, row.unavailable) == (Decimal(0), Decimal(0))
    wallets = await env.client.list_wallets(PLAIN)
    assert "FOO" not in {w.currency for g in wallets for w in g.wallets}


async def test_no_whitelist_event_ever_for_active_source(env: Env) -> None:
    """A deposit from an ACTIVE address never emits a DEPOSIT_WHITELIST_* event."""
    address_id = await env.register(AUTO)
    env.sandbox.approve_address(address_id)
    tx = env.deposit(AUTO)
    env.sandbox.finish_sweep(tx)
    assert not WL_EVENTS & set(await env.types(tx))
    assert await env.types(tx) == ["DEPOSIT_ORDER_NOTIFICATION"]
