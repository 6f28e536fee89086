"""ProviderClient against a real loopback server that verifies every signature."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from tests.support.ports import free_port
from worker.errors import (
    ProviderAuthError,
    ProviderBusinessError,
    ProviderProtocolError,
    ProviderRetryLater,
    ProviderUnavailable,
)
from worker.provider import jsonio
from worker.provider.client import ProviderClient
from worker.provider.models import AddressStatus, WhiteListStatus
from worker.provider.signing import SignatureError, verify

API_KEY = "test-key"
API_SECRET = "test-secret"
TX = "tx-1"


@dataclass
class Reply:
    """One scripted answer: a JSON-able body (or raw bytes), an HTTP status, a delay."""

    body: Any = None
    status: int = 200
    delay_s: float = 0.0


@dataclass
class Seen:
    """One request as the server received it."""

    method: str
    target: str
    headers: dict[str, str]
    body: bytes
    signature_ok: bool


class FakeProvider:
    """Answers scripted replies in order (or from `responder`) after verifying the signature."""

    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.responder: Callable[[web.Request], Reply] | None = None
        self.seen: list[Seen] = []
        self.base_url = ""

    def script(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        try:
            verify(
                request.headers,
                request.method,
                request.raw_path,
                body,
                api_key=API_KEY,
                secrets=[API_SECRET],
                tolerance_s=30,
            )
            verified = True
        except SignatureError:
            verified = False
        seen = Seen(request.method, request.raw_path, dict(request.headers), body, verified)
        self.seen.append(seen)
        if not verified:
            answer = {"status": 401, "msg": "signature invalid", "traceId": "t-auth"}
            return web.json_response(answer, status=401)
        if self.replies:
            reply = self.replies.popleft()
        elif self.responder is not None:
            reply = self.responder(request)
        else:
            reply = Reply(ok(None))
        if reply.delay_s:
            await asyncio.sleep(reply.delay_s)
        raw = reply.body if isinstance(reply.body, bytes) else jsonio.dumpb(reply.body)
        return web.Response(body=raw, status=reply.status, content_type="application/json")


def ok(data: Any) -> dict[str, Any]:
    """A wallet-form success."""
    return {"status": 200, "code": None, "msg": "OK", "traceId": "t-ok", "data": data}


def fail(code: str | None, msg: str, trace: str = "t-fail") -> dict[str, Any]:
    """A wallet-form business failure."""
    return {
        "status": 500,
        "code": code,
        "msg": msg,
        "success": False,
        "traceId": trace,
        "data": None,
    }


def order(tx: str = TX, amount: Any = "100.5", **more: Any) -> dict[str, Any]:
    """A deposit order record."""
    return {
        "transactionId": tx,
        "walletId": 1001,
        "currency": "USDT",
        "network": "TRON",
        "amount": amount,
        "status": "PROCESSING",
        "whiteListStatus": "init",
        **more,
    }


def address(status: str = "PROCESSING") -> dict[str, Any]:
    """A source address record."""
    return {
        "id": "a1",
        "walletId": 1001,
        "walletAddress": "TQ5a",
        "network": "TRON",
        "status": status,
    }


def page(records: list[Any], number: int = 1, total_page: int = 1) -> dict[str, Any]:
    """The page wrapper."""
    return {
        "pageNumber": number,
        "pageSize": 50,
        "totalPage": total_page,
        "totalRow": len(records),
        "records": records,
    }


@pytest.fixture
async def provider(aiohttp_server: AiohttpServer) -> FakeProvider:
    fake = FakeProvider()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fake.handle)
    server = await aiohttp_server(app)
    fake.base_url = str(server.make_url("/")).rstrip("/")
    return fake


Calls = list[tuple[str, str]]
ClientFactory = Callable[..., ProviderClient]


@pytest.fixture
async def calls() -> Calls:
    return []


@pytest.fixture
async def make_client(provider: FakeProvider, calls: Calls) -> AsyncIterator[ClientFactory]:
    made: list[ProviderClient] = []

    def make(**kwargs: Any) -> ProviderClient:
        options: dict[str, Any] = {
            "timeout_s": 2,
            "retries": 3,
            "backoff_s": 0.01,
            "backoff_max_s": 0.05,
            "on_call": lambda endpoint, outcome: calls.append((endpoint, outcome)),
        }
        options.update(kwargs)
        base_url = options.pop("base_url", provider.base_url)
        secret = options.pop("api_secret", API_SECRET)
        client = ProviderClient(base_url, API_KEY, secret, **options)
        made.append(client)
        return client

    yield make
    for client in made:
        await client.close()


@pytest.fixture
def client(make_client: ClientFactory) -> ProviderClient:
    return make_client()


PAYER = {"correspondentType": "ENTITY", "fullName": "Acme", "countryCode": "SG"}


# --- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize("http_status", [200, 500])
@pytest.mark.parametrize(
    "code", ["10000100", "10000101", "10000102", "10000103", "10000105", "10000106", "10000107"]
)
async def test_wallet_codes_raise_business_error(
    client: ProviderClient, provider: FakeProvider, calls: Calls, code: str, http_status: int
) -> None:
    """Each wallet code raises ProviderBusinessError with code, msg and traceId, no retry."""
    provider.script(Reply(fail(code, f"msg {code}", f"trace-{code}"), status=http_status))
    with pytest.raises(ProviderBusinessError) as info:
        await client.submit_payer(TX, PAYER, idempotency_key="k1")
    exc = info.value
    assert type(exc) is ProviderBusinessError
    assert (exc.code, exc.msg, exc.trace_id) == (code, f"msg {code}", f"trace-{code}")
    assert exc.endpoint == "submit_payer"
    assert len(provider.seen) == 1
    assert calls == [("submit_payer", "business_error")]


@pytest.mark.parametrize("http_status", [200, 500])
async def test_code_10000104_is_retry_later_without_retry(
    client: ProviderClient, provider: FakeProvider, calls: Calls, http_status: int
) -> None:
    """10000104 raises ProviderRetryLater at once: the later retry is the caller's."""
    provider.script(Reply(fail("10000104", "cannot submit now", "t-104"), status=http_status))
    with pytest.raises(ProviderRetryLater) as info:
        await client.submit_payer(TX, PAYER, idempotency_key="k1")
    assert (info.value.code, info.value.msg, info.value.trace_id) == (
        "10000104",
        "cannot submit now",
        "t-104",
    )
    assert len(provider.seen) == 1
    assert calls == [("submit_payer", "business_error")]


async def test_numeric_code_is_read_as_string(
    client: ProviderClient, provider: FakeProvider
) -> None:
    """A wallet code sent as a JSON number still maps to its error class."""
    provider.script(Reply({"status": 500, "code": 10000104, "msg": "later", "traceId": "t"}))
    with pytest.raises(ProviderRetryLater):
        await client.submit_payer(TX, PAYER, idempotency_key="k1")


@pytest.mark.parametrize(
    "body",
    [
        {"status": 200, "success": False, "msg": "sourceAmount is required", "traceId": "t-s"},
        {"status": 500, "code": None, "msg": "sourceAmount is required", "traceId": "t-s"},
    ],
)
async def test_business_failure_under_http_200(
    client: ProviderClient, provider: FakeProvider, body: dict[str, Any]
) -> None:
    """HTTP 200 with success false or status 500 is a business error, not data."""
    provider.script(Reply(body))
    with pytest.raises(ProviderBusinessError) as info:
        await client.stable_order_detail(order_id="o1")
    assert info.value.msg == "sourceAmount is required"
    assert info.value.trace_id == "t-s"
    assert len(provider.seen) == 1


async def test_http_401_is_auth_error_not_retried(
    client: ProviderClient, provider: FakeProvider, calls: Calls
) -> None:
    """HTTP 401 raises ProviderAuthError with its traceId after one attempt."""
    provider.script(Reply({"status": 401, "msg": "unauthorized", "traceId": "t-401"}, status=401))
    with pytest.raises(ProviderAuthError) as info:
        await client.submit_payer(TX, PAYER, idempotency_key="k1")
    assert info.value.trace_id == "t-401"
    assert info.value.http_status == 401
    assert len(provider.seen) == 1
    assert calls == [("submit_payer", "auth_error")]


async def test_wrong_secret_is_auth_error(
    make_client: ClientFactory, provider: FakeProvider
) -> None:
    """A signature the server rejects surfaces as ProviderAuthError, without retry."""
    client = make_client(api_secret="not-the-secret")
    with pytest.raises(ProviderAuthError):
        await client.options()
    assert [s.signature_ok for s in provider.seen] == [False]


async def test_auth_message_under_http_200(client: ProviderClient, provider: FakeProvider) -> None:
    """A failure whose message is about the timestamp is an auth error even under HTTP 200."""
    provider.script(Reply(fail(None, "API-TIMESTAMP outside the allowed window", "t-ts")))
    with pytest.raises(ProviderAuthError) as info:
        await client.options()
    assert info.value.trace_id == "t-ts"


async def test_unreadable_answer_is_protocol_error(
    client: ProviderClient, provider: FakeProvider, calls: Calls
) -> None:
    """A 200 answer that is not JSON raises ProviderProtocolError and is not retried."""
    provider.script(Reply(b"<html>hello</html>"))
    with pytest.raises(ProviderProtocolError):
        await client.options()
    assert len(provider.seen) == 1
    assert calls == [("options", "protocol_error")]


async def test_data_of_wrong_shape_is_protocol_error(
    client: ProviderClient, provider: FakeProvider, calls: Calls
) -> None:
    """Success whose data lacks required fields raises ProviderProtocolError naming the field,
    and the call counts as a protocol error (a provider schema change must not look healthy)."""
    provider.script(Reply(ok({"transactionId": TX})))
    with pytest.raises(ProviderProtocolError, match="walletId"):
        await client.transaction_detail(TX)
    assert len(provider.seen) == 1
    assert calls == [("transaction_detail", "protocol_error")]


# --- retries ---------------------------------------------------------------------------------


async def test_5xx_twice_then_success_keeps_key(
    client: ProviderClient, provider: FakeProvider, calls: Calls
) -> None:
    """Two 500s then success: three signed attempts, one Idempotency-Key, fresh timestamps."""
    provider.script(
        Reply(b"Internal Server Error", status=500),
        Reply(b"", status=502),
        Reply(ok({"transactionId": TX, "whiteListStatus": "pending"})),
    )
    result = await client.submit_payer(TX, PAYER, idempotency_key="key-123")
    assert result.whiteListStatus is WhiteListStatus.PENDING
    assert len(provider.seen) == 3
    assert all(s.signature_ok for s in provider.seen)
    assert {s.headers["Idempotency-Key"] for s in provider.seen} == {"key-123"}
    assert len({s.headers["API-TIMESTAMP"] for s in provider.seen}) == 3
    assert {s.body for s in provider.seen} == {jsonio.dumpb(PAYER)}
    assert calls == [
        ("submit_payer", "unavailable"),
        ("submit_payer", "unavailable"),
        ("submit_payer", "ok"),
    ]


async def test_timeout_retried_with_same_key(
    make_client: ClientFactory, provider: FakeProvider
) -> None:
    """A reply slower than timeout_s is abandoned and the call retried with the same key."""
    client = make_client(timeout_s=0.2)
    provider.script(Reply(ok(address()), delay_s=0.5), Reply(ok(address())))
    record = await client.register_address(PAYER, idempotency_key="reg-1")
    assert record.status is AddressStatus.PROCESSING
    assert [s.headers["Idempotency-Key"] for s in provider.seen] == ["reg-1", "reg-1"]


async def test_retries_run_out(
    client: ProviderClient, provider: FakeProvider, calls: Calls
) -> None:
    """After 1 + retries unavailable attempts, ProviderUnavailable (with traceId) is raised."""
    provider.responder = lambda _req: Reply(
        {"status": 503, "msg": "maintenance", "traceId": "t-503"}, status=503
    )
    with pytest.raises(ProviderUnavailable) as info:
        await client.history(white_list_status="init")
    assert info.value.trace_id == "t-503"
    assert len(provider.seen) == 4
    assert calls == [("history", "unavailable")] * 4


async def test_connection_error_is_unavailable(make_client: ClientFactory, calls: Calls) -> None:
    """A refused connection is retried, then raises ProviderUnavailable."""
    port = free_port()  # nothing listens there
    client = make_client(base_url=f"http://127.0.0.1:{port}", retries=1)
    with pytest.raises(ProviderUnavailable, match="connection"):
        await client.options()
    assert calls == [("options", "unavailable")] * 2


async def test_email_send_is_not_retried(client: ProviderClient, provider: FakeProvider) -> None:
    """The e-mail code call is sent once even on 503: a second send would void the first code."""
    provider.responder = lambda _req: Reply(b"", status=503)
    with pytest.raises(ProviderUnavailable):
        await client.send_email_verify_code("ops@merchant.example")
    assert len(provider.seen) == 1


# --- envelopes and decimals ------------------------------------------------------------------


async def test_partner_envelope(client: ProviderClient, provider: FakeProvider) -> None:
    """Partner form: code SUCCESS gives data; any other code is a business error with trace_id."""
    quote = {
        "quote_id": "q1",
        "rate": "7.1234567890123456789",
        "expires_at": "2026-11-22T10:00:00.000Z",
    }
    provider.script(
        Reply({"code": "SUCCESS", "message": "ok", "data": quote, "trace_id": "p1"}),
        Reply(
            {"code": "AMOUNT_OUT_OF_RANGE", "message": "between 100 and 500000", "trace_id": "p2"}
        ),
    )
    data = await client.quote({"request_id": "r1", "from_amount": Decimal("150.00")})
    assert data.rate == Decimal("7.1234567890123456789")
    assert provider.seen[0].body == b'{"request_id":"r1","from_amount":"150.00"}'
    with pytest.raises(ProviderBusinessError) as info:
        await client.quote({"request_id": "r2"})
    assert (info.value.code, info.value.trace_id) == ("AMOUNT_OUT_OF_RANGE", "p2")
    assert info.value.msg == "between 100 and 500000"


async def test_email_envelope(client: ProviderClient, provider: FakeProvider) -> None:
    """E-mail form: status 200 is success; another status is a business error with traceId."""
    provider.script(
        Reply({"status": 200, "message": "sent", "traceId": "e1"}),
        Reply({"status": 400, "message": "email invalid", "traceId": "e2"}),
    )
    await client.send_email_verify_code("ops@merchant.example")
    assert jsonio.loads(provider.seen[0].body) == {"email": "ops@merchant.example"}
    with pytest.raises(ProviderBusinessError) as info:
        await client.send_email_verify_code("nope")
    assert (info.value.msg, info.value.trace_id) == ("email invalid", "e2")


async def test_amounts_are_exact_decimals(client: ProviderClient, provider: FakeProvider) -> None:
    """Amounts sent as long JSON numbers or strings arrive as the exact Decimal."""
    raw = (
        b'{"status":200,"msg":"OK","traceId":"t","data":{"pageNumber":1,"pageSize":50,'
        b'"totalPage":1,"totalRow":2,"records":['
        + jsonio.dumpb(order("a", amount="0.1"))[:-1].replace(b'"0.1"', b"0.10000000000000000555")
        + b"},"
        + jsonio.dumpb(order("b", amount="123456789012345678.000000001"))
        + b"]}}"
    )
    provider.script(
        Reply(raw),
        Reply(ok([{"walletId": 1001, "currency": "USDT", "available": 1.1, "unavailable": "0"}])),
    )
    hist = await client.history(white_list_status="init")
    assert [o.amount for o in hist.records] == [
        Decimal("0.10000000000000000555"),
        Decimal("123456789012345678.000000001"),
    ]
    [balance] = await client.asset_balance(1001)
    assert balance.available == Decimal("1.1")
    assert isinstance(balance.available, Decimal)


# --- paging and signing ----------------------------------------------------------------------


async def test_iter_history_pages_lazily(client: ProviderClient, provider: FakeProvider) -> None:
    """iter_history fetches page n+1 only once page n is consumed, and stops after the last."""

    def responder(request: web.Request) -> Reply:
        num = int(request.query["pageNum"])
        records = [order(f"tx-{num}-{i}") for i in range(2)]
        return Reply(ok(page(records, number=num, total_page=3)))

    provider.responder = responder
    it = client.iter_history(white_list_status="rejected", page_size=2, wallet_id=1001)
    first = await anext(it)
    assert first.transactionId == "tx-1-0"
    assert len(provider.seen) == 1
    rest = [o.transactionId async for o in it]
    assert rest == ["tx-1-1", "tx-2-0", "tx-2-1", "tx-3-0", "tx-3-1"]
    assert [s.target for s in provider.seen] == [
        f"/v1/wallet/history?pageNum={n}&pageSize=2&walletId=1001&whiteListStatus=rejected"
        for n in (1, 2, 3)
    ]


async def test_signature_covers_query_string(
    client: ProviderClient, provider: FakeProvider
) -> None:
    """The query string is sent sorted by name and signed as sent; without it the signature
    does not verify."""
    provider.script(Reply(ok(page([]))))
    await client.history(white_list_status="init", currency="USD T&x=1", start_time=5)
    [seen] = provider.seen
    assert seen.signature_ok
    assert seen.target == (
        "/v1/wallet/history?currency=USD+T%26x%3D1&pageNum=1&pageSize=50&startTime=5"
        "&whiteListStatus=init"
    )
    with pytest.raises(SignatureError):
        verify(
            seen.headers,
            "GET",
            "/v1/wallet/history",
            b"",
            api_key=API_KEY,
            secrets=[API_SECRET],
            tolerance_s=30,
        )


async def test_base_url_path_prefix_is_signed(
    make_client: ClientFactory, provider: FakeProvider
) -> None:
    """A base URL with a path prefix sends and signs the prefixed target."""
    client = make_client(base_url=provider.base_url + "/gw/")
    provider.script(Reply(ok({"providers": ["Binance"]})))
    assert await client.options() == ["Binance"]
    assert provider.seen[0].target == "/gw/v1/wallet/deposit-whitelist/options"
    assert provider.seen[0].signature_ok


@pytest.mark.parametrize(
    "data",
    [{"providers": ["Binance", "OKX"]}, [{"name": "Binance"}, {"name": "OKX"}], ["Binance", "OKX"]],
)
async def test_options_accepts_every_form(
    client: ProviderClient, provider: FakeProvider, data: Any
) -> None:
    """Options data as an object, a list of names or a list of {name} gives the names."""
    provider.script(Reply(ok(data)))
    assert await client.options() == ["Binance", "OKX"]


Call = Callable[[ProviderClient], Awaitable[Any]]

ROUTES: list[tuple[str, Call, str, str, Any, bool]] = [
    # (name, call, method, target, data answered, carries Idempotency-Key)
    ("options", lambda c: c.options(), "GET", "/v1/wallet/deposit-whitelist/options", [], False),
    (
        "register",
        lambda c: c.register_address(PAYER, idempotency_key="k"),
        "POST",
        "/v1/wallet/deposit-whitelist/addresses",
        address(),
        True,
    ),
    (
        "list addresses",
        lambda c: c.list_addresses(status="FAILED", page_size=100),
        "GET",
        "/v1/wallet/deposit-whitelist/addresses?pageNum=1&pageSize=100&status=FAILED",
        page([address("FAILED")]),
        False,
    ),
    (
        "address detail",
        lambda c: c.address_detail("a/1"),
        "GET",
        "/v1/wallet/deposit-whitelist/addresses/a%2F1",
        address("ACTIVE"),
        False,
    ),
    (
        "disable",
        lambda c: c.disable_address("a1", idempotency_key="k"),
        "POST",
        "/v1/wallet/deposit-whitelist/addresses/a1/disable",
        None,
        True,
    ),
    (
        "submit",
        lambda c: c.submit_payer(TX, PAYER, idempotency_key="k"),
        "POST",
        f"/v1/wallet/deposit-whitelist/transactions/{TX}/submit",
        {"transactionId": TX, "whiteListStatus": "pending"},
        True,
    ),
    (
        "detail",
        lambda c: c.transaction_detail(TX),
        "GET",
        f"/v1/wallet/transactions/{TX}",
        order(),
        False,
    ),
    (
        "detail alt",
        lambda c: c.transaction_detail(TX, alt_path=True),
        "GET",
        f"/v1/wallet/transaction/detail?transactionId={TX}",
        order(),
        False,
    ),
    (
        "history alt",
        lambda c: c.history(alt_path=True, end_time=9),
        "GET",
        "/v1/wallet/transaction/list?endTime=9&pageNum=1&pageSize=50",
        page([order()]),
        False,
    ),
    (
        "deposit address",
        lambda c: c.deposit_address(1001, "USDT", "TRON"),
        "GET",
        "/v1/wallet/deposit-address?currency=USDT&network=TRON&walletId=1001",
        {"address": "T1"},
        False,
    ),
    (
        "asset balance",
        lambda c: c.asset_balance(1001, "USDT"),
        "GET",
        "/v1/wallet/asset-balance?currency=USDT&walletId=1001",
        [],
        False,
    ),
    (
        "create sub",
        lambda c: c.create_sub_wallet({"name": "s"}, idempotency_key="k"),
        "POST",
        "/v1/wallet/create/sub",
        {"walletId": 7},
        True,
    ),
    (
        "withdraw whitelist",
        lambda c: c.add_withdraw_whitelist({"address": "T"}, idempotency_key="k"),
        "POST",
        "/v1/wallet/add-withdraw-whitelist",
        None,
        True,
    ),
    (
        "list wallets",
        lambda c: c.list_wallets(),
        "GET",
        "/v1/wallet/list",
        [{"walletId": 1, "wallets": [{"currency": "USDT", "available": "1", "unavailable": "0"}]}],
        False,
    ),
    (
        "abnormal funds",
        lambda c: c.abnormal_funds({"pageNum": 1, "statuses": ["UNMATCHED"]}),
        "POST",
        "/v1/stable/collect/abnormal-fund/list",
        page([{"id": 1, "amount": 5, "currency": "USDT", "status": "UNMATCHED"}]),
        False,
    ),
    (
        "stable order",
        lambda c: c.stable_order_detail(merchant_order_id="m1"),
        "GET",
        "/v1/stable/order/query-detail?merchantOrderId=m1",
        {"orderId": "o1", "orderStatus": "success"},
        False,
    ),
    (
        "collection status",
        lambda c: c.collection_order_status(orderId="c1"),
        "GET",
        "/v2/stable/collect/order-status?orderId=c1",
        {"whiteListStatus": "init"},
        False,
    ),
]

SUMMARY = dict.fromkeys(
    ("opening_balance", "closing_balance", "total_in_amount", "total_out_amount"), "0"
) | dict.fromkeys(("total_fee_amount", "net_amount", "adjustment_amount"), "0")
DAILY = {
    "settlement_date": "2026-11-22",
    "summary": SUMMARY
    | dict.fromkeys(("record_count", "matched_count", "mismatched_count"), 0)
    | {"manual_review_count": 0},
    "page": 2,
    "page_size": 50,
    "total": 0,
    "generated_at": "2026-11-23T00:00:00Z",
}

PARTNER_ROUTES: list[tuple[str, Call, str, str, dict[str, Any]]] = [
    (
        "kyc share",
        lambda c: c.onboarding_kyc_share({"request_id": "r"}),
        "POST",
        "/api/v1/onboarding/kyc-share",
        {"platform_user_id": "p1", "onboarding_status": "NOT_ONBOARDED"},
    ),
    (
        "quote",
        lambda c: c.quote({"request_id": "r"}),
        "POST",
        "/api/v1/quotes",
        {"quote_id": "q1", "expires_at": "2026-11-22T10:00:00.500Z"},
    ),
    (
        "settlement",
        lambda c: c.settlement_daily_records(settlement_date="2026-11-22", page=2),
        "GET",
        "/api/v1/settlement/daily-records?page=2&settlement_date=2026-11-22",
        DAILY,
    ),
]


@pytest.mark.parametrize(
    ("call", "method", "target", "data", "keyed"),
    [r[1:] for r in ROUTES],
    ids=[r[0] for r in ROUTES],
)
async def test_wallet_routes(
    client: ProviderClient,
    provider: FakeProvider,
    call: Call,
    method: str,
    target: str,
    data: Any,
    keyed: bool,
) -> None:
    """Each wallet operation uses its method and path; writes alone carry an Idempotency-Key."""
    provider.script(Reply(ok(data)))
    await call(client)
    [seen] = provider.seen
    assert (seen.method, seen.target, seen.signature_ok) == (method, target, True)
    assert ("Idempotency-Key" in seen.headers) is keyed
    if method == "POST":
        assert seen.headers["Content-Type"] == "application/json"
        jsonio.loads(seen.body)
    else:
        assert seen.body == b""


@pytest.mark.parametrize(
    ("call", "method", "target", "data"),
    [r[1:] for r in PARTNER_ROUTES],
    ids=[r[0] for r in PARTNER_ROUTES],
)
async def test_partner_routes(
    client: ProviderClient,
    provider: FakeProvider,
    call: Call,
    method: str,
    target: str,
    data: dict[str, Any],
) -> None:
    """Each partner operation uses its method and path and reads the partner envelope."""
    provider.script(Reply({"code": "SUCCESS", "message": "ok", "data": data, "trace_id": "p"}))
    assert jsonio.loads(jsonio.dumps((await call(client)).to_json_dict())) == data
    [seen] = provider.seen
    assert (seen.method, seen.target, seen.signature_ok) == (method, target, True)


async def test_malformed_http_answer_is_unavailable_and_retried(
    make_client: ClientFactory, calls: Calls
) -> None:
    """An answer aiohttp cannot parse (a bad Content-Length) is no answer: ProviderUnavailable,
    retried with the same key and counted, never a raw aiohttp error."""
    keys: list[bytes] = []

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        keys.extend(line for line in head.split(b"\r\n") if line.startswith(b"Idempotency-Key"))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n{}")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(garbage, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        client = make_client(base_url=f"http://127.0.0.1:{port}", retries=1)
        with pytest.raises(ProviderUnavailable, match="transport error"):
            await client.submit_payer(TX, PAYER, idempotency_key="key-9")
    finally:
        server.close()
        await server.wait_closed()
    assert keys == [b"Idempotency-Key: key-9"] * 2
    assert calls == [("submit_payer", "unavailable")] * 2
