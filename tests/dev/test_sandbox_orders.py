"""The sandbox's stable orders, collection orders, e-mail verification, onboarding share and
quotes, each through the client in its envelope form, with the control calls and webhooks."""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from tests.support.configs import PROVIDER_KEY, PROVIDER_SECRET
from tests.support.sandboxes import StartSandbox
from worker.dev.sandbox import Sandbox
from worker.dev.sandbox.testing import WebhookRecorder
from worker.errors import ProviderAuthError, ProviderBusinessError
from worker.provider import jsonio
from worker.provider.client import ProviderClient
from worker.provider.signing import signed_headers

NOW = 1_795_000_000_000


@dataclass
class Env:
    sandbox: Sandbox
    server: TestServer
    client: ProviderClient
    hooks: WebhookRecorder
    clock: list[int]

    async def control(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """A control API call over HTTP."""
        data = None if body is None else jsonio.dumpb(body)
        url = str(self.server.make_url("/_sandbox/" + path))
        async with (
            aiohttp.ClientSession() as session,
            session.request(method, url, data=data) as resp,
        ):
            return resp.status, jsonio.loads(await resp.read())

    async def raw(self, method: str, target: str, body: Any = None) -> tuple[int, Any]:
        """A signed request outside the client (to see the envelope itself)."""
        raw = b"" if body is None else jsonio.dumpb(body)
        headers = signed_headers(PROVIDER_KEY, PROVIDER_SECRET, method, target, raw)
        url = str(self.server.make_url(target))
        async with (
            aiohttp.ClientSession() as session,
            session.request(method, url, data=raw, headers=headers) as resp,
        ):
            return resp.status, jsonio.loads(await resp.read())


@pytest.fixture
async def env(start_sandbox: StartSandbox) -> Env:
    s = await start_sandbox(hooks=True, clock=NOW, delivery_retry_base_s=0.01)
    assert s.hooks is not None and s.clock is not None
    return Env(s.sandbox, s.server, s.client, s.hooks, s.clock)


STABLE = {
    "merchantOrderId": "M-1",
    "businessType": "STABLE_BUY",
    "sourceCurrency": "USD",
    "targetCurrency": "USDT",
    "sourceAmount": "1000.00",
    "price": "0.9985",
}


# --- stable orders -------------------------------------------------------------------------------


async def test_stable_order_moves_with_a_webhook_each_time(env: Env) -> None:
    """A stable order created by the control API is read by orderId and merchantOrderId, and
    each status change sends a signed STABLE_ORDER_UPDATED."""
    status, order = await env.control("POST", "stable-orders", STABLE)
    assert status == 201
    oid = order["orderId"]
    detail = await env.client.stable_order_detail(order_id=oid)
    assert (detail.orderStatus, detail.merchantOrderId) == ("processing", "M-1")
    assert (detail.sourceAmount, detail.targetAmount) == (Decimal("1000.00"), Decimal("998.5"))
    status, _ = await env.control("POST", f"stable-orders/{oid}/status", {"orderStatus": "success"})
    assert status == 200
    by_merchant = await env.client.stable_order_detail(merchant_order_id="M-1")
    assert (by_merchant.orderId, by_merchant.orderStatus) == (oid, "success")
    await env.sandbox.delivered_idle()
    assert [e["eventType"] for e in env.hooks.of(oid)] == ["STABLE_ORDER_UPDATED"] * 2
    assert [e["data"]["orderStatus"] for e in env.hooks.of(oid)] == ["processing", "success"]
    assert env.hooks.rejected == []


async def test_stable_order_answer_carries_success(env: Env) -> None:
    """query-detail answers the stable form with success true, or success false at HTTP 200."""
    _, order = await env.control("POST", "stable-orders", STABLE)
    status, found = await env.raw(
        "GET", f"/v1/stable/order/query-detail?orderId={order['orderId']}"
    )
    assert (status, found["success"], found["msg"]) == (200, True, "OK")
    status, missing = await env.raw("GET", "/v1/stable/order/query-detail?orderId=nope")
    assert (status, missing["success"], missing["status"]) == (200, False, 500)


async def test_stable_order_failures_through_the_client(env: Env) -> None:
    """An unknown order or no identifier is a business error with its message."""
    with pytest.raises(ProviderBusinessError) as info:
        await env.client.stable_order_detail(order_id="nope")
    assert info.value.code == "ORDER_NOT_FOUND" and "nope" in info.value.msg
    status, _ = await env.raw("GET", "/v1/stable/order/query-detail")
    assert status == 200


async def test_stable_order_control_refusals(env: Env) -> None:
    """A final status never changes, an unknown status or order is refused."""
    _, order = await env.control("POST", "stable-orders", STABLE)
    oid = order["orderId"]
    assert (await env.control("POST", f"stable-orders/{oid}/status", {"orderStatus": "x"}))[
        0
    ] == 409
    await env.control("POST", f"stable-orders/{oid}/status", {"orderStatus": "fail"})
    again = await env.control("POST", f"stable-orders/{oid}/status", {"orderStatus": "success"})
    assert again[0] == 409
    assert (await env.control("POST", "stable-orders/nope/status", {"orderStatus": "fail"}))[
        0
    ] == 404
    assert (await env.control("POST", "stable-orders", STABLE))[0] == 409  # merchantOrderId reused
    detail = await env.client.stable_order_detail(order_id=oid)
    assert detail.orderStatus == "fail"


# --- collection orders ---------------------------------------------------------------------------


async def test_collection_order_status_and_webhooks(env: Env) -> None:
    """A collection order is read with its whiteListStatus; each change sends Collect Order
    Updated carrying whiteListStatus."""
    status, order = await env.control(
        "POST", "collect-orders", {"merchantOrderId": "C-1", "amount": "50", "currency": "USDT"}
    )
    assert status == 201
    oid = order["orderId"]
    got = await env.client.collection_order_status(orderId=oid)
    assert (got.status, got.whiteListStatus, got.merchantOrderId) == ("PROCESSING", "init", "C-1")
    await env.control("POST", f"collect-orders/{oid}/status", {"whiteListStatus": "approved"})
    await env.control("POST", f"collect-orders/{oid}/status", {"status": "SUCCESS"})
    got = await env.client.collection_order_status(merchantOrderId="C-1")
    assert (got.status, got.whiteListStatus) == ("SUCCESS", "approved")
    await env.sandbox.delivered_idle()
    events = env.hooks.of(oid)
    assert {e["eventType"] for e in events} == {"Collect Order Updated"}
    assert [(e["data"]["status"], e["data"]["whiteListStatus"]) for e in events] == [
        ("PROCESSING", "init"),
        ("PROCESSING", "approved"),
        ("SUCCESS", "approved"),
    ]
    with pytest.raises(ProviderBusinessError):
        await env.client.collection_order_status(orderId="nope")
    assert (await env.control("POST", f"collect-orders/{oid}/status", {"status": "BAD"}))[0] == 409


# --- e-mail verification -------------------------------------------------------------------------


async def test_email_code_sent_and_rate_limited_per_address(env: Env) -> None:
    """One code per address per minute: a second send is refused, another address is not, and
    after the interval the first address may ask again."""
    await env.client.send_email_verify_code("ops@merchant.example")
    with pytest.raises(ProviderBusinessError) as info:
        await env.client.send_email_verify_code("OPS@merchant.example")
    assert "too many requests" in info.value.msg and info.value.trace_id
    await env.client.send_email_verify_code("other@merchant.example")
    env.clock[0] += 60_000
    await env.client.send_email_verify_code("ops@merchant.example")


async def test_email_envelope_form(env: Env) -> None:
    """The answer is the e-mail verification form (status, message, traceId; no data), and an
    invalid address is refused in that form."""
    status, body = await env.raw(
        "POST", "/v1/virtual-account/email/send-verify-code", {"email": "a@b.example"}
    )
    assert status == 200 and set(body) == {"status", "message", "traceId"}
    assert body["status"] == 200
    with pytest.raises(ProviderBusinessError) as info:
        await env.client.send_email_verify_code("not-an-address")
    assert "e-mail address" in info.value.msg


# --- onboarding ----------------------------------------------------------------------------------

INDIVIDUAL = {
    "request_id": "r-1",
    "partner_user_id": "pu-1",
    "customer_type": "INDIVIDUAL",
    "sharing_scenario": "ON_RAMP",
    "kyc_info": {
        "first_name": "Ada",
        "last_name": "Lovelace",
        "nationality": "GB",
        "date_of_birth": "1990-12-10",
    },
}


async def test_onboarding_share_answers_status(env: Env) -> None:
    """A valid share answers platform_user_id and onboarding_status; the same user the same."""
    first = await env.client.onboarding_kyc_share(INDIVIDUAL)
    assert (first.onboarding_status, first.customer_type) == ("NOT_ONBOARDED", "INDIVIDUAL")
    again = await env.client.onboarding_kyc_share({**INDIVIDUAL, "request_id": "r-2"})
    assert again.platform_user_id == first.platform_user_id


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"kyc_info": None}, "kyc_info is required"),
        ({"kyc_info": {**INDIVIDUAL["kyc_info"], "nationality": "XX"}}, "nationality"),
        ({"kyc_info": {**INDIVIDUAL["kyc_info"], "last_name": None}}, "last_name"),
        ({"customer_type": "ENTITY"}, "kyb_info"),
        ({"partner_user_id": None}, "partner_user_id"),
        ({"documents": [{"content_base64": "***"}]}, "base64"),
    ],
)
async def test_onboarding_share_validates_groups(
    env: Env, change: dict[str, Any], words: str
) -> None:
    """A share with a missing or invalid group is a partner-form business error naming it."""
    body = {k: v for k, v in {**INDIVIDUAL, **change}.items() if v is not None}
    if isinstance(body.get("kyc_info"), dict):
        body["kyc_info"] = {k: v for k, v in body["kyc_info"].items() if v is not None}
    with pytest.raises(ProviderBusinessError) as info:
        await env.client.onboarding_kyc_share(body)
    assert info.value.code == "INVALID_PARAMETER"
    assert words in info.value.msg


# --- quotes --------------------------------------------------------------------------------------

QUOTE = {
    "request_id": "q-1",
    "business_type": "ON_RAMP",
    "from_currency": "USD",
    "to_currency": "USDT",
    "from_amount": "1000",
}


async def test_quote_price_and_expiry(env: Env) -> None:
    """A quote carries the pair's rate, a 0.1 % fee, the exact resulting amount and an expiry
    30 s ahead."""
    q = await env.client.quote(QUOTE)
    assert (q.rate, q.fee_amount, q.to_amount) == (
        Decimal("0.9985"),
        Decimal("1.00"),
        Decimal("997.501500"),
    )
    assert q.expires_at == dt.datetime.fromtimestamp((NOW + 30_000) / 1000, dt.UTC)
    assert (q.quote_type, q.business_type) == ("STANDARD", "ON_RAMP")


@pytest.mark.parametrize(
    ("amount", "ok"),
    [("99.99", False), ("100", True), ("500000", True), ("500000.01", False)],
)
async def test_quote_amount_range(env: Env, amount: str, ok: bool) -> None:
    """from_amount outside 100..500000 is AMOUNT_OUT_OF_RANGE naming the range and value."""
    if ok:
        assert (await env.client.quote({**QUOTE, "from_amount": amount})).from_amount == Decimal(
            amount
        )
        return
    with pytest.raises(ProviderBusinessError) as info:
        await env.client.quote({**QUOTE, "from_amount": amount})
    assert info.value.code == "AMOUNT_OUT_OF_RANGE"
    assert "between 100 and 500000" in info.value.msg and amount in info.value.msg


async def test_quote_unknown_pair_and_missing_amount(env: Env) -> None:
    """An unsupported pair and a missing amount are partner-form business errors."""
    with pytest.raises(ProviderBusinessError) as info:
        await env.client.quote({**QUOTE, "to_currency": "DOGE"})
    assert info.value.code == "PAIR_NOT_SUPPORTED"
    with pytest.raises(ProviderBusinessError) as info:
        await env.client.quote({k: v for k, v in QUOTE.items() if k != "from_amount"})
    assert "from_amount is required" in info.value.msg


# --- authentication ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.stable_order_detail(order_id="x"),
        lambda c: c.send_email_verify_code("a@b.example"),
        lambda c: c.quote(QUOTE),
    ],
    ids=["stable form", "e-mail form", "partner form"],
)
async def test_signature_refused(
    env: Env, call: Callable[[ProviderClient], Awaitable[Any]]
) -> None:
    """A call signed with the wrong secret is refused as an auth failure, nothing recorded."""
    bad = ProviderClient(str(env.server.make_url("/")), PROVIDER_KEY, "wrong", retries=0)
    try:
        with pytest.raises(ProviderAuthError):
            await call(bad)
    finally:
        await bad.close()
    assert env.sandbox.email_codes == {} and env.sandbox.state.quotes == {}
