"""The sandbox's money operations through the client: abnormal funds (inject, filters, pages,
notification), the daily settlement report built from the day's credited deposits (summary,
pages, injected discrepancies), the release of a BLOCKED deposit, and the Travel Rule link."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from yarl import URL

from tests.support.configs import PROVIDER_KEY, PROVIDER_SECRET
from tests.support.sandboxes import StartSandbox
from worker.dev.sandbox import Sandbox
from worker.dev.sandbox.testing import ENTITY_PAYER, WebhookRecorder
from worker.errors import ProviderAuthError, ProviderBusinessError
from worker.provider import jsonio
from worker.provider.client import ProviderClient

SOURCE = "TQ5aXj8Tq6u2pG2Lw6xXw9zC3vGmZ5a1bB"
DAY = dt.date(2026, 11, 22)


def at(day: dt.date, hour: int, minute: int = 0, tz: str = "UTC") -> int:
    """Epoch ms of a wall-clock time on `day` in `tz`."""
    from zoneinfo import ZoneInfo

    moment = dt.datetime(day.year, day.month, day.day, hour, minute, tzinfo=ZoneInfo(tz))
    return int(moment.timestamp() * 1000)


@dataclass
class Env:
    sandbox: Sandbox
    server: TestServer
    client: ProviderClient
    hooks: WebhookRecorder
    clock: list[int] = field(default_factory=lambda: [at(DAY, 10)])

    def url(self, path: str) -> str:
        return str(self.server.make_url(path))

    async def control(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """A control API call over HTTP."""
        data = None if body is None else jsonio.dumpb(body)
        async with (
            aiohttp.ClientSession() as session,
            session.request(method, self.url("/_sandbox/" + path), data=data) as resp,
        ):
            return resp.status, jsonio.loads(await resp.read())

    async def credited(self, amount: str, when: int, wallet_id: int = 1002) -> dict[str, Any]:
        """A gated deposit received and credited at `when` (epoch ms)."""
        self.clock[0] = when
        order = self.sandbox.inject_deposit(wallet_id, "USDT", "TRON", amount, SOURCE)
        tx = order["transactionId"]
        await self.client.submit_payer(tx, ENTITY_PAYER, idempotency_key=f"k-{tx}")
        return self.sandbox.approve_review(tx)


@pytest.fixture
async def env(start_sandbox: StartSandbox) -> Env:
    s = await start_sandbox(hooks=True, clock=at(DAY, 10), delivery_retry_base_s=0.01)
    assert s.hooks is not None and s.clock is not None
    return Env(s.sandbox, s.server, s.client, s.hooks, s.clock)


def fund(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "amount": "250.75",
        "currency": "USDT",
        "network": "TRON",
        "fromAddress": "TFromAbc",
        "toAddress": "TToXyz",
        "txHash": "0xfeed01",
        "txTime": at(DAY, 9),
        "expiresTime": at(DAY, 9) + 86_400_000,
        "addressRiskStatus": "HIGH",
        "addressRiskRemark": "sanctioned cluster",
    }
    return {**base, **changes}


# --- abnormal funds ------------------------------------------------------------------------------


async def test_abnormal_fund_injected_is_listed_with_every_field(env: Env) -> None:
    """A fund injected over the control API is listed by the client with its exact amount,
    status UNMATCHED, risk status and remark, and expiry."""
    status, record = await env.control("POST", "abnormal-funds", fund())
    assert status == 201
    status, state = await env.control("GET", "state")
    assert [f["id"] for f in state["abnormalFunds"]] == [record["id"]]
    page = await env.client.abnormal_funds({"pageNum": 1, "pageSize": 10})
    assert (page.totalRow, page.totalPage) == (1, 1)
    [got] = page.records
    assert got.id == record["id"]
    assert got.amount == Decimal("250.75")
    assert (got.status, got.addressRiskStatus, got.addressRiskRemark) == (
        "UNMATCHED",
        "HIGH",
        "sanctioned cluster",
    )
    assert (got.txHash, got.txTime, got.expiresTime) == (
        "0xfeed01",
        at(DAY, 9),
        at(DAY, 9) + 86_400_000,
    )


async def test_abnormal_fund_amount_is_a_json_number(env: Env) -> None:
    """The list carries amount as a number with its exact digits, as the interface shows it."""
    env.sandbox.inject_abnormal_fund(fund(amount="0.10"))
    raw = b'{"pageNum":1}'
    from worker.provider.signing import signed_headers

    path = "/v1/stable/collect/abnormal-fund/list"
    headers = signed_headers(PROVIDER_KEY, PROVIDER_SECRET, "POST", path, raw)
    async with (
        aiohttp.ClientSession() as session,
        session.post(env.url(path), data=raw, headers=headers) as resp,
    ):
        text = (await resp.read()).decode()
    assert '"amount":0.10' in text


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        ({"statuses": ["UNMATCHED"]}, ["0xa", "0xc"]),
        ({"statuses": ["MATCHED"]}, ["0xb"]),
        ({"network": "ETH"}, ["0xc"]),
        ({"currency": "USDC"}, ["0xb"]),
        ({"searchKeyword": "0XA"}, ["0xa"]),
        ({"searchKeyword": "tfromother"}, ["0xc"]),
        ({"startTime": at(DAY, 11), "endTime": at(DAY, 12)}, ["0xb", "0xc"]),
        ({"startTime": at(DAY, 12, 1)}, []),
    ],
)
async def test_abnormal_fund_filters(
    env: Env, filters: dict[str, Any], expected: list[str]
) -> None:
    """The list filters by statuses, network, currency, keyword (case-blind) and txTime."""
    env.sandbox.inject_abnormal_fund(fund(txHash="0xa", txTime=at(DAY, 10)))
    second = env.sandbox.inject_abnormal_fund(
        fund(txHash="0xb", currency="USDC", txTime=at(DAY, 11))
    )
    env.sandbox.set_abnormal_status(second["id"], "MATCHED")
    env.sandbox.inject_abnormal_fund(
        fund(txHash="0xc", network="ETH", fromAddress="TFromOther", txTime=at(DAY, 12))
    )
    page = await env.client.abnormal_funds({**filters, "pageNum": 1, "pageSize": 50})
    assert [r.txHash for r in page.records] == expected


async def test_abnormal_funds_iterated_across_pages(env: Env) -> None:
    """The paging helper yields every record of a multi-page list once, in order."""
    for i in range(7):
        env.sandbox.inject_abnormal_fund(fund(txHash=f"0x{i}"))
    page = await env.client.abnormal_funds({"pageNum": 2, "pageSize": 3})
    assert (page.pageNumber, page.totalPage, page.totalRow) == (2, 3, 7)
    seen = [r.txHash async for r in env.client.iter_abnormal_funds(page_size=3)]
    assert seen == [f"0x{i}" for i in range(7)]


async def test_abnormal_fund_bad_filter_is_a_business_error(env: Env) -> None:
    """A malformed filter is refused with 10000103 in the wallet envelope."""
    with pytest.raises(ProviderBusinessError) as info:
        await env.client.abnormal_funds({"statuses": "UNMATCHED"})
    assert info.value.code == "10000103"


async def test_abnormal_fund_notification(env: Env) -> None:
    """With notify, a signed ABNORMAL_FUND_NOTIFICATION carries the record (amount a number)."""
    status, record = await env.control("POST", "abnormal-funds", {**fund(), "notify": True})
    assert status == 201
    await env.sandbox.delivered_idle()
    [event] = env.hooks.events
    assert event["eventType"] == "ABNORMAL_FUND_NOTIFICATION"
    assert event["referenceId"] == str(record["id"])
    assert event["data"]["amount"] == Decimal("250.75")
    assert event["data"]["status"] == "UNMATCHED"


async def test_abnormal_fund_control_errors(env: Env) -> None:
    """Control calls refuse a fund without a network or with a non-boolean notify (409) and an
    unknown id (404), recording nothing."""
    status, _ = await env.control("POST", "abnormal-funds", fund(network=None))
    assert status == 409
    status, _ = await env.control("POST", "abnormal-funds/99/status", {"status": "MATCHED"})
    assert status == 404
    status, _ = await env.control("POST", "abnormal-funds", {**fund(), "notify": "yes"})
    assert status == 409
    assert env.sandbox.state.abnormal_funds == {}


# --- settlement ----------------------------------------------------------------------------------


async def test_settlement_report_lists_the_days_credited_deposits(env: Env) -> None:
    """The report of a day holds one MATCHED IN record per deposit credited that day, with
    amount, tx hash and addresses, and a summary computed from them."""
    before = await env.credited("5", at(DAY - dt.timedelta(days=1), 23, 59))
    first = await env.credited("100.50", at(DAY, 0, 0))
    second = await env.credited("0.25", at(DAY, 23, 59))
    await env.credited("7", at(DAY + dt.timedelta(days=1), 0, 0))
    env.clock[0] = at(DAY, 20)
    gated = env.sandbox.inject_deposit(1002, "USDT", "TRON", "999", SOURCE)  # never credited
    report = await env.client.settlement_daily_records(settlement_date=DAY.isoformat())
    assert report.settlement_date == DAY
    assert report.timezone == "UTC"
    assert [r.tx_hash for r in report.records] == [
        first["transactionHash"],
        second["transactionHash"],
    ]
    rec = report.records[0]
    assert (rec.record_type, rec.reconciliation_status, rec.amount) == (
        "IN",
        "MATCHED",
        Decimal("100.50"),
    )
    assert (rec.platform_order_id, rec.asset, rec.network) == (
        first["transactionId"],
        "USDT",
        "TRON",
    )
    assert rec.from_address == SOURCE
    assert gated["transactionId"] not in {r.platform_order_id for r in report.records}
    s = report.summary
    assert (s.opening_balance, s.total_in_amount, s.closing_balance) == (
        Decimal(before["amount"]),
        Decimal("100.75"),
        Decimal("105.75"),
    )
    assert (s.record_count, s.matched_count, s.mismatched_count, s.manual_review_count) == (
        2,
        2,
        0,
        0,
    )
    assert (report.total, report.page, report.business_type) == (2, 1, "ALL")


async def test_settlement_day_follows_the_timezone(env: Env) -> None:
    """A deposit credited 23:30 UTC belongs to the next day in Asia/Singapore."""
    late = await env.credited("3", at(DAY, 23, 30))
    utc = await env.client.settlement_daily_records(settlement_date=DAY.isoformat())
    sgt = await env.client.settlement_daily_records(
        settlement_date=(DAY + dt.timedelta(days=1)).isoformat(), timezone="Asia/Singapore"
    )
    assert [r.tx_hash for r in utc.records] == [late["transactionHash"]]
    assert [r.tx_hash for r in sgt.records] == [late["transactionHash"]]
    assert sgt.timezone == "Asia/Singapore"


async def test_settlement_records_iterated_across_pages(env: Env) -> None:
    """Pages split the records; the paging helper yields each once; the summary covers all."""
    hashes = [(await env.credited("1", at(DAY, 1, i)))["transactionHash"] for i in range(5)]
    page2 = await env.client.settlement_daily_records(
        settlement_date=DAY.isoformat(), page=2, page_size=2
    )
    assert ([r.tx_hash for r in page2.records], page2.total) == (hashes[2:4], 5)
    assert page2.summary.record_count == 5
    seen = [
        r.tx_hash
        async for r in env.client.iter_settlement_records(
            settlement_date=DAY.isoformat(), page_size=2
        )
    ]
    assert seen == hashes


async def test_settlement_discrepancies(env: Env) -> None:
    """Injected discrepancies show in the report: a dropped record, a changed amount, a record
    no deposit backs, and records set MISMATCHED and MANUAL_REVIEW (counted in the summary)."""
    dropped, changed, flagged, reviewed = [
        await env.credited("10", at(DAY, 8, i)) for i in range(4)
    ]
    calls = [
        {"kind": "drop", "transactionId": dropped["transactionId"]},
        {"kind": "amount", "transactionId": changed["transactionId"], "amount": "9.99"},
        {"kind": "extra", "asset": "USDT", "network": "TRON", "amount": "42", "txHash": "0xnew"},
        {
            "kind": "status",
            "transactionId": flagged["transactionId"],
            "reconciliationStatus": "MISMATCHED",
        },
        {
            "kind": "status",
            "transactionId": reviewed["transactionId"],
            "reconciliationStatus": "MANUAL_REVIEW",
        },
    ]
    for call in calls:
        status, _ = await env.control(
            "POST", "settlement/discrepancies", {**call, "date": DAY.isoformat()}
        )
        assert status == 201
    report = await env.client.settlement_daily_records(settlement_date=DAY.isoformat())
    by_hash = {r.tx_hash: r for r in report.records}
    assert dropped["transactionHash"] not in by_hash
    assert by_hash[changed["transactionHash"]].amount == Decimal("9.99")
    assert by_hash["0xnew"].amount == Decimal("42")
    assert by_hash[flagged["transactionHash"]].reconciliation_status == "MISMATCHED"
    s = report.summary
    assert (s.record_count, s.matched_count, s.mismatched_count, s.manual_review_count) == (
        4,
        2,
        1,
        1,
    )
    assert s.total_in_amount == Decimal("71.99")
    mismatched = await env.client.settlement_daily_records(
        settlement_date=DAY.isoformat(), reconciliation_status="MISMATCHED"
    )
    assert [r.tx_hash for r in mismatched.records] == [flagged["transactionHash"]]
    other_day = await env.client.settlement_daily_records(
        settlement_date=(DAY + dt.timedelta(days=1)).isoformat()
    )
    assert other_day.records == []
    status, _ = await env.control("DELETE", "settlement/discrepancies")
    assert status == 200
    clean = await env.client.settlement_daily_records(settlement_date=DAY.isoformat())
    assert clean.summary.matched_count == clean.summary.record_count == 4


async def test_settlement_discrepancy_control_errors(env: Env) -> None:
    """Unknown kinds and dates are refused (409), an unknown deposit is 404."""
    status, _ = await env.control("POST", "settlement/discrepancies", {"kind": "x", "date": "d"})
    assert status == 409
    status, _ = await env.control(
        "POST",
        "settlement/discrepancies",
        {"kind": "drop", "date": DAY.isoformat(), "transactionId": "Tnope"},
    )
    assert status == 404
    assert env.sandbox.state.settlement_changes == []


@pytest.mark.parametrize(
    "query",
    [
        {},
        {"settlement_date": "22/11/2026"},
        {"settlement_date": DAY.isoformat(), "timezone": "Mars/Olympus"},
        {"settlement_date": DAY.isoformat(), "page_size": 0},
    ],
)
async def test_settlement_bad_query_is_a_partner_failure(env: Env, query: dict[str, Any]) -> None:
    """A missing or malformed query is a business error from the partner envelope."""
    with pytest.raises(ProviderBusinessError) as info:
        await env.client.settlement_daily_records(**query)
    assert info.value.code == "INVALID_PARAMETER"
    assert info.value.trace_id


# --- release of a BLOCKED deposit ----------------------------------------------------------------


@pytest.mark.parametrize("wallet_id", [1001, 1002])
async def test_blocked_deposit_released(env: Env, wallet_id: int) -> None:
    """Release moves a BLOCKED deposit to CREDITED and SUCCESS, unavailable -> available, with
    DEPOSIT_WHITELIST_CREDITED and DEPOSIT_ORDER_NOTIFICATION SUCCESS."""
    order = env.sandbox.inject_deposit(wallet_id, "USDT", "TRON", "12.5", SOURCE)
    tx = order["transactionId"]
    await env.client.submit_payer(tx, ENTITY_PAYER, idempotency_key="k1")
    status, _ = await env.control("POST", f"deposits/{tx}/block")
    assert status == 200
    [held] = await env.client.asset_balance(wallet_id, "USDT")
    assert (held.available, held.unavailable) == (Decimal(0), Decimal("12.5"))
    status, _ = await env.control("POST", f"deposits/{tx}/release")
    assert status == 200
    detail = await env.client.transaction_detail(tx)
    assert (detail.status.value, detail.creditStatus.value) == ("SUCCESS", "CREDITED")
    assert detail.whiteListStatus is not None and detail.whiteListStatus.value == "approved"
    # With auto-collection (1001) the release ends with the sweep into the main account (1000).
    [bal] = await env.client.asset_balance(1000 if wallet_id == 1001 else wallet_id, "USDT")
    assert (bal.available, bal.unavailable) == (Decimal("12.5"), Decimal(0))
    [receiving] = await env.client.asset_balance(wallet_id, "USDT")
    assert receiving.unavailable == Decimal(0)
    await env.sandbox.delivered_idle()
    assert env.hooks.types(tx) == [
        "DEPOSIT_WHITELIST_REQUIRED",
        "DEPOSIT_WHITELIST_CREDITED",
        "DEPOSIT_ORDER_NOTIFICATION",
    ]
    assert env.hooks.of(tx)[-1]["data"]["status"] == "SUCCESS"
    report = await env.client.settlement_daily_records(settlement_date=DAY.isoformat())
    assert [r.platform_order_id for r in report.records] == [tx]


async def test_release_refused_unless_blocked(env: Env) -> None:
    """Releasing a deposit that is not BLOCKED is 409 and changes nothing; unknown is 404."""
    order = env.sandbox.inject_deposit(1002, "USDT", "TRON", "1", SOURCE)
    status, _ = await env.control("POST", f"deposits/{order['transactionId']}/release")
    assert status == 409
    status, _ = await env.control("POST", "deposits/Tnope/release")
    assert status == 404
    detail = await env.client.transaction_detail(order["transactionId"])
    assert detail.creditStatus.value == "PENDING"


# --- Travel Rule link ----------------------------------------------------------------------------


async def test_travel_rule_link(env: Env) -> None:
    """The link operation answers a hosted-page URL with a fresh token and its expiry."""
    order = env.sandbox.inject_deposit(1002, "USDT", "TRON", "1", SOURCE)
    link = await env.client.travel_rule_link(1002, transaction_id=order["transactionId"])
    url = URL(link.url)
    assert url.path == "/hosted/en/deposit-travel-rule"
    token = url.query["token"]
    assert len(token) >= 24
    assert link.expiresTime == env.clock[0] + 900_000
    other = await env.client.travel_rule_link(1002, lng="de")
    assert URL(other.url).query["token"] != token
    assert URL(other.url).path == "/hosted/de/deposit-travel-rule"
    stored = env.sandbox.state.travel_rule_tokens[token]
    assert stored["transactionId"] == order["transactionId"]


async def test_travel_rule_link_refusals(env: Env) -> None:
    """An unknown wallet is 10000107, an unknown deposit 10000100."""
    with pytest.raises(ProviderBusinessError) as info:
        await env.client.travel_rule_link(4242)
    assert info.value.code == "10000107"
    with pytest.raises(ProviderBusinessError) as info:
        await env.client.travel_rule_link(1002, transaction_id="Tnope")
    assert info.value.code == "10000100"


# --- authentication ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.abnormal_funds({"pageNum": 1}),
        lambda c: c.settlement_daily_records(settlement_date="2026-11-22"),
        lambda c: c.travel_rule_link(1002),
    ],
    ids=["wallet form", "partner form", "link"],
)
async def test_signature_refused(env: Env, call: Callable[[ProviderClient], Any]) -> None:
    """A call signed with the wrong secret is refused as an auth failure."""
    bad = ProviderClient(env.url("/"), PROVIDER_KEY, "wrong-secret", retries=0)
    try:
        with pytest.raises(ProviderAuthError):
            await call(bad)
    finally:
        await bad.close()
