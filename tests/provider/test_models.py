"""Provider data model: exact amounts, envelopes, enums and the other resources."""

from __future__ import annotations

import base64
import datetime as dt
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from pydantic import ValidationError

from worker.provider import jsonio
from worker.provider.models import (
    AssetBalance,
    CreditStatus,
    DepositAddress,
    DepositEventData,
    DepositOrder,
    EmailEnvelope,
    Options,
    OrderStatus,
    Page,
    PartnerEnvelope,
    SubmitResult,
    WalletEnvelope,
    WebhookEnvelope,
    WhiteListStatus,
)
from worker.provider.resources import (
    AbnormalFundListRequest,
    AbnormalFundPage,
    OnboardingResponse,
    OnboardingShareRequest,
    QuoteRequest,
    QuoteResponse,
    SettlementDaily,
    StableOrderDetail,
    WalletGroup,
)


def order(**changes: Any) -> dict[str, Any]:
    """A deposit order payload as history returns it."""
    base: dict[str, Any] = {
        "transactionId": "tx-1",
        "transactionHash": "0xabc",
        "transactionType": "DEPOSIT",
        "walletId": 1001,
        "walletName": "main",
        "currency": "USDT",
        "network": "TRON",
        "amount": "1234.5678",
        "fromAddress": "TQ5a",
        "toAddress": "TXyz",
        "status": "PROCESSING",
        "whiteListStatus": "init",
        "creditStatus": "PENDING",
        "createTime": 1_700_000_000_000,
    }
    return base | changes


# --- exact decimals --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "text"),
    [
        (b'"0.000000000000000001"', "0.000000000000000001"),
        (b'"123456789012345678.123456789"', "123456789012345678.123456789"),
        (b"123456789012345678.123456789", "123456789012345678.123456789"),
        (b"1e-7", "0.0000001"),
        (b"5", "5"),
        (b'"100.500"', "100.500"),
    ],
)
def test_amount_exact(raw: bytes, text: str) -> None:
    """Amounts from JSON strings or numbers keep their exact value and serialise as plain text."""
    body = b'{"transactionId":"t","walletId":1,"currency":"USDT","network":"TRON","amount":'
    parsed = DepositOrder.model_validate(jsonio.loads(body + raw + b',"status":"SUCCESS"}'))
    assert isinstance(parsed.amount, Decimal)
    assert parsed.amount == Decimal(text)
    assert parsed.to_json_dict()["amount"] == text
    assert jsonio.loads(jsonio.dumps(parsed))["amount"] == text


def test_loads_never_goes_through_float() -> None:
    """jsonio.loads parses non-integer numbers straight to Decimal."""
    value = jsonio.loads(b'{"n": 0.1, "m": 123456789012345678.123456789}')
    assert value["n"] == Decimal("0.1")
    assert value["m"] == Decimal("123456789012345678.123456789")
    assert jsonio.dumps(value) == '{"n":"0.1","m":"123456789012345678.123456789"}'


def test_loads_reads_utf8_bytes() -> None:
    """Bodies are UTF-8 (a BOM is tolerated); other encodings are not JSON here."""
    assert jsonio.loads('\ufeff{"name": "Zoë"}'.encode()) == {"name": "Zoë"}
    with pytest.raises(ValueError):
        jsonio.loads('{"name": "Zoë"}'.encode("utf-16"))


@given(st.decimals(allow_nan=False, allow_infinity=False), st.text())
def test_decimals_as_numbers_round_trip_exactly(value: Decimal, text: str) -> None:
    """Written as a JSON number (the sandbox's webhook amounts), a decimal reads back as the
    same value with the same digits; strings beside it, whatever they hold, stay strings."""
    assume(not (value.is_zero() and value.is_signed()))  # "-0" reads back as the integer 0
    raw = jsonio.dumpb({"amount": value, "text": text}, decimals_as_numbers=True)
    assert b'"amount":"' not in raw
    back = jsonio.loads(raw)
    assert back["text"] == text
    assert Decimal(back["amount"]) == value
    assert jsonio.decimal_str(Decimal(back["amount"])) == jsonio.decimal_str(value)


@pytest.mark.parametrize("value", [0.1, 1e-7, 5.0])
def test_float_amount_refused(value: float) -> None:
    """A Python float amount is refused: money never passes through float."""
    with pytest.raises(ValidationError, match="not float"):
        DepositOrder.model_validate(order(amount=value))


def test_balances_exact() -> None:
    """Asset balances are exact decimals too."""
    row = AssetBalance.model_validate(
        jsonio.loads(b'{"walletId":1,"currency":"USDT","available":0.1,"unavailable":"2"}')
    )
    assert row.available == Decimal("0.1")
    assert row.to_json_dict() == {
        "walletId": 1,
        "currency": "USDT",
        "available": "0.1",
        "unavailable": "2",
    }


# --- enums and the deposit order ---------------------------------------------------------------


def test_deposit_order_enums() -> None:
    """status, lowercase whiteListStatus and creditStatus parse into their enums."""
    parsed = DepositOrder.model_validate(order(whiteListStatus="rejected", failMessage="bad name"))
    assert parsed.status is OrderStatus.PROCESSING
    assert parsed.whiteListStatus is WhiteListStatus.REJECTED
    assert parsed.creditStatus is CreditStatus.PENDING
    assert parsed.to_json_dict()["whiteListStatus"] == "rejected"


def test_statuses_read_in_any_case_and_padding() -> None:
    """whiteListStatus is lowercase on the wire and the order statuses upper-case; another case
    or blanks around read as the same status, blank text says nothing (as an absent key),
    and a word that is no status is refused."""
    assert [s.value for s in WhiteListStatus] == ["init", "pending", "approved", "rejected"]
    parsed = DepositOrder.model_validate(
        order(whiteListStatus=" INIT ", creditStatus="credited", status=" success")
    )
    assert parsed.whiteListStatus is WhiteListStatus.INIT
    assert parsed.creditStatus is CreditStatus.CREDITED
    assert parsed.status is OrderStatus.SUCCESS
    blank = DepositOrder.model_validate(order(whiteListStatus="  ", creditStatus=""))
    assert "whiteListStatus" not in blank.model_fields_set
    assert blank.creditStatus is None
    with pytest.raises(ValidationError):
        DepositOrder.model_validate(order(whiteListStatus="initial"))


def test_white_list_status_null_for_ordinary_deposits() -> None:
    """A deposit not subject to the whitelist has whiteListStatus null."""
    parsed = DepositOrder.model_validate(order(whiteListStatus=None, creditStatus=None))
    assert parsed.whiteListStatus is None


def test_unknown_fields_kept() -> None:
    """Fields the model does not name are kept, so nothing the provider adds is lost."""
    parsed = DepositOrder.model_validate(order(newField="x"))
    assert parsed.to_json_dict()["newField"] == "x"


# --- envelopes -------------------------------------------------------------------------------


def test_wallet_envelope_success_and_page() -> None:
    """A wallet success envelope with a page of deposit orders parses."""
    raw = jsonio.dumpb(
        {
            "status": 200,
            "code": None,
            "msg": "OK",
            "traceId": "t-1",
            "data": {
                "pageNumber": 1,
                "pageSize": 50,
                "totalPage": 1,
                "totalRow": 1,
                "records": [order()],
            },
        }
    )
    env = WalletEnvelope.model_validate(jsonio.loads(raw))
    assert env.status == 200 and env.msg == "OK" and env.traceId == "t-1"
    page = Page[DepositOrder].model_validate(env.data)
    assert page.records[0].amount == Decimal("1234.5678")


def test_wallet_envelope_failure() -> None:
    """The wallet failure form carries status 500, the code, msg, success false, traceId."""
    env = WalletEnvelope.model_validate(
        {
            "status": 500,
            "code": "10000103",
            "msg": "invalid countryCode",
            "success": False,
            "traceId": "t-2",
            "data": None,
        }
    )
    assert (env.status, env.code, env.success, env.data) == (500, "10000103", False, None)


def test_email_and_partner_envelopes() -> None:
    """The e-mail verification and partner forms parse."""
    email = EmailEnvelope.model_validate({"status": 200, "message": "ok", "traceId": "t"})
    assert email.message == "ok"
    partner = PartnerEnvelope.model_validate(
        {"code": "SUCCESS", "message": "ok", "data": {"x": 1}, "trace_id": "t"}
    )
    assert partner.code == "SUCCESS" and partner.trace_id == "t"


def test_webhook_envelope() -> None:
    """A DEPOSIT_WHITELIST_FAILED delivery parses with its data."""
    env = WebhookEnvelope.model_validate(
        jsonio.loads(
            b'{"eventId":"e-1","eventType":"DEPOSIT_WHITELIST_FAILED","referenceId":"tx-1",'
            b'"status":"PROCESSING","timestamp":1700000000000,"data":{"transactionId":"tx-1",'
            b'"amount":10.25,"currency":"USDT","network":"TRON","walletId":1001,'
            b'"status":"PROCESSING","whiteListStatus":"rejected","failMessage":"name mismatch"}}'
        )
    )
    data = DepositEventData.model_validate(env.data)
    assert data.amount == Decimal("10.25")
    assert data.failMessage == "name mismatch"


@pytest.mark.parametrize("missing", ["eventId", "eventType"])
def test_webhook_envelope_requires_ids(missing: str) -> None:
    """An envelope without eventId or eventType is refused."""
    body = {"eventId": "e", "eventType": "X", "data": {}}
    del body[missing]
    with pytest.raises(ValidationError):
        WebhookEnvelope.model_validate(body)


def test_submit_options_and_address() -> None:
    """Submit answer, options (both forms) and deposit address parse."""
    assert (
        SubmitResult.model_validate(
            {"transactionId": "tx", "whiteListStatus": "pending"}
        ).whiteListStatus
        is WhiteListStatus.PENDING
    )
    opts = Options.model_validate({"providers": ["Binance", {"name": "OKX"}]})
    assert opts.names() == ["Binance", "OKX"]
    addr = DepositAddress.model_validate({"walletId": 1, "address": "TXyz", "network": "TRON"})
    assert addr.address == "TXyz"


# --- the other resources ---------------------------------------------------------------------


def test_wallet_group() -> None:
    """A wallet group from GET /v1/wallet/list parses with exact balances."""
    group = WalletGroup.model_validate(
        jsonio.loads(
            b'{"walletId":1001,"name":"ops","walletType":"operation_prime","autoCollection":true,'
            b'"wallets":[{"currency":"USDT","available":100.5,"unavailable":0}]}'
        )
    )
    assert group.autoCollection is True
    assert group.wallets[0].available == Decimal("100.5")
    assert group.to_json_dict()["wallets"][0] == {
        "currency": "USDT",
        "available": "100.5",
        "unavailable": "0",
    }


def test_abnormal_fund_page() -> None:
    """An abnormal-fund page parses; the numeric amount is an exact decimal."""
    page = AbnormalFundPage.model_validate(
        jsonio.loads(
            b'{"pageNumber":1,"pageSize":20,"totalPage":1,"totalRow":1,"records":[{"id":7,'
            b'"accountId":"a","userId":"u","amount":0.000001,"currency":"USDT","network":"TRON",'
            b'"fromAddress":"f","toAddress":"t","txHash":"h","txTime":1700000000000,'
            b'"expiresTime":1700086400000,"status":"UNMATCHED","orderId":"o",'
            b'"addressRiskStatus":"LOW","addressRiskRemark":""}]}'
        )
    )
    record = page.records[0]
    assert record.amount == Decimal("0.000001")
    assert record.to_json_dict()["amount"] == "0.000001"
    assert record.expiresTime == 1_700_086_400_000


def test_abnormal_fund_list_request_body() -> None:
    """The abnormal-fund list request writes only the fields given."""
    req = AbnormalFundListRequest(pageNum=1, pageSize=20, statuses=["UNMATCHED"])
    assert req.to_json_dict() == {"pageNum": 1, "pageSize": 20, "statuses": ["UNMATCHED"]}


def test_stable_order_detail() -> None:
    """A stable order detail parses with decimal amounts and lowercase orderStatus."""
    detail = StableOrderDetail.model_validate(
        {
            "merchantOrderId": "m-1",
            "orderId": "o-1",
            "orderStatus": "success",
            "businessType": "STABLE_SWAP",
            "paymentMethod": "VIRTUAL_ACCOUNT",
            "sourceCurrency": "USD",
            "targetCurrency": "USDT",
            "sourceAmount": "100.00",
            "targetAmount": "99.8",
            "price": "1.002004",
        }
    )
    assert detail.price == Decimal("1.002004")
    assert detail.to_json_dict()["sourceAmount"] == "100.00"


def test_settlement_daily() -> None:
    """A daily settlement report parses: dates, UTC timestamps, decimal summary."""
    summary_amounts = {
        k: "0.5"
        for k in (
            "opening_balance",
            "closing_balance",
            "total_in_amount",
            "total_out_amount",
            "total_fee_amount",
            "net_amount",
            "adjustment_amount",
        )
    }
    data = {
        "settlement_date": "2026-11-21",
        "timezone": "UTC",
        "asset": "USDT",
        "network": "TRON",
        "business_type": "ALL",
        "summary": summary_amounts
        | {"record_count": 1, "matched_count": 1, "mismatched_count": 0, "manual_review_count": 0},
        "records": [
            {
                "settlement_record_id": "s-1",
                "settlement_date": "2026-11-21",
                "record_type": "IN",
                "business_type": "OFF_RAMP",
                "platform_order_id": "p",
                "exchange_order_id": "x",
                "rd_order_id": "r",
                "asset": "USDT",
                "network": "TRON",
                "amount": "1000.000001",
                "fee_amount": "1.5",
                "fee_asset": "USDT",
                "from_address": "f",
                "to_address": "t",
                "tx_hash": "h",
                "confirmations": 20,
                "order_status": "PROCESSING",
                "reconciliation_status": "MATCHED",
                "occurred_at": "2026-11-21T10:00:00Z",
                "settled_at": "2026-11-21T10:05:00.250Z",
                "remark": "",
            }
        ],
        "page": 1,
        "page_size": 50,
        "total": 1,
        "generated_at": "2026-11-22T00:10:00Z",
    }
    report = SettlementDaily.model_validate(data)
    assert report.settlement_date == dt.date(2026, 11, 21)
    assert report.summary.net_amount == Decimal("0.5")
    assert report.records[0].amount == Decimal("1000.000001")
    assert report.generated_at.tzinfo is not None
    out = report.to_json_dict()
    assert out["records"][0]["settled_at"] == "2026-11-21T10:05:00.250Z"
    assert out["generated_at"] == "2026-11-22T00:10:00Z"
    assert out["settlement_date"] == "2026-11-21"


def test_timestamp_without_zone_refused() -> None:
    """An ISO timestamp without a zone is refused (the interface says UTC)."""
    with pytest.raises(ValidationError, match="time zone"):
        QuoteResponse.model_validate({"quote_id": "q", "expires_at": "2026-11-22T10:00:00"})


def test_onboarding_request_every_group() -> None:
    """An onboarding share request with every group parses and writes back unchanged."""
    address = {
        "line1": "1 Main St",
        "line2": "Unit 2",
        "city": "Singapore",
        "region": "SG",
        "postal_code": "048616",
        "country": "SG",
        "full_address": "1 Main St, Unit 2, Singapore 048616",
    }
    content = base64.b64encode(b"%PDF-1.7").decode()
    body = {
        "request_id": "r-1",
        "partner_user_id": "u-1",
        "customer_type": "INDIVIDUAL",
        "sharing_scenario": "ON_RAMP",
        "kyc_info": {
            "mobile_number": "+6512345678",
            "email": "a@example.com",
            "first_name": "Ada",
            "last_name": "Lovelace",
            "date_of_birth": "1990-02-28",
            "nationality": "SG",
            "id_type": "PASSPORT",
            "id_number": "E1234567",
            "residential_address": address,
            "account_purpose": "investment",
            "occupation": "engineer",
        },
        "kyb_info": {
            "entity_details": {
                "business_name_en": "Acme",
                "business_name_zh": "阿克米",
                "registered_business_number": "201912345A",
                "certificate_of_incorporation_number": "C-1",
                "place_of_incorporation": "SG",
                "registered_country_region": "SG",
                "business_type": "PRIVATE_LIMITED",
                "company_incorporation_date": "2019-01-01",
                "registered_address": address,
                "primary_operating_place": "SG",
                "primary_operating_address": address,
                "is_regulated_financial_institution": False,
                "is_listed_company": False,
                "is_government_owned_enterprise": False,
                "legal_entity_identifier": "LEI",
                "office_phone_number": "+6560000000",
                "email": "ops@example.com",
            },
            "business_details": {
                "industry_nature_of_business": "trading",
                "locations_of_business": "SG",
                "industry_details": "wholesale",
                "years_in_business": "5",
                "sales_turnover_previous_year": "1000000",
            },
            "financial_profile": {
                "initial_source_of_funds": "capital",
                "place_of_source_of_funds": "SG",
                "recurring_source_of_funds": "revenue",
                "estimated_total_net_assets_usd": "5000000",
                "estimated_net_liquid_assets_usd": "1000000",
            },
            "governance": {"board_meeting_quorum": "2"},
            "key_people": [
                {
                    "roles": ["DIRECTOR", "UBO"],
                    "first_name_en": "Ada",
                    "last_name_en": "Lovelace",
                    "name_zh": "艾达",
                    "email": "ada@example.com",
                    "mobile_number": "+6511111111",
                    "residential_address": address,
                    "id_issuing_country_region": "GB",
                    "id_type": "PASSPORT",
                    "id_number": "P1",
                    "is_director": True,
                    "is_authorized_signatory": True,
                    "is_ubo": True,
                    "actual_owned_shares_percent": "60",
                    "certified_id_document_refs": ["doc-1"],
                }
            ],
            "super_administrator": {
                "first_name_en": "Ada",
                "last_name_en": "Lovelace",
                "name_zh": "艾达",
                "email": "ada@example.com",
            },
            "amlq": {
                "questionnaire_completed": True,
                "questionnaire_version": "v3",
                "completed_at": "2026-11-01T00:00:00Z",
                "answers": [{"q1": "no", "q2": "yes"}],
            },
            "digital_wallet_opening_questions": {
                "purpose_of_account_opening": "treasury",
                "expected_business_counterparties": "exchanges",
                "expected_monthly_transaction_volume": "100000",
            },
        },
        "bank_account": {
            "account_holder_name": "Acme",
            "bank_name": "DBS",
            "bank_code": "7171",
            "branch_code": "001",
            "account_number": "123456789",
            "currency": "SGD",
            "country": "SG",
            "account_type": "CURRENT",
            "proof_document_ref": "doc-2",
        },
        "documents": [
            {
                "document_type": "PASSPORT",
                "document_name": "passport",
                "document_side": "FRONT",
                "entity_role": "DIRECTOR",
                "holder_name": "Ada Lovelace",
                "file_name": "p.pdf",
                "content_type": "application/pdf",
                "content_base64": content,
                "sha256": "0" * 64,
                "issued_at": "2020-01-01",
                "expires_at": "2030-01-01",
                "certified_true_copy": True,
                "remark": "",
            }
        ],
        "callback_url": "https://merchant.example/onboard",
    }
    req = OnboardingShareRequest.model_validate(body)
    assert req.kyb_info is not None and req.kyb_info.key_people[0].is_ubo is True
    assert req.kyc_info is not None and req.kyc_info.date_of_birth == dt.date(1990, 2, 28)
    assert req.to_json_dict() == body


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("kyc_info", "nationality"), "XX"),
        (("bank_account", "country"), "sg"),
        (("documents", 0, "content_base64"), "not base64!"),
        (("kyc_info", "date_of_birth"), "1990-02-30"),
    ],
)
def test_onboarding_request_bad_values(path: tuple[Any, ...], value: str) -> None:
    """Country codes, base64 content and dates are checked."""
    body: dict[str, Any] = {"kyc_info": {}, "bank_account": {}, "documents": [{}]}
    node: Any = body
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(ValidationError):
        OnboardingShareRequest.model_validate(body)


def test_onboarding_response() -> None:
    """The onboarding answer data parses."""
    resp = OnboardingResponse.model_validate(
        {
            "platform_user_id": "p-1",
            "customer_type": "INDIVIDUAL",
            "onboarding_status": "NOT_ONBOARDED",
        }
    )
    assert resp.onboarding_status == "NOT_ONBOARDED"


def test_quote_request_and_response() -> None:
    """Quote amounts are decimal strings both ways; expires_at keeps milliseconds."""
    req = QuoteRequest(
        request_id="r",
        business_type="ON_RAMP",
        from_currency="USD",
        to_currency="USDT",
        from_amount=Decimal("100.10"),
        asset="USDT",
        network="TRON",
    )
    assert req.to_json_dict()["from_amount"] == "100.10"
    resp = QuoteResponse.model_validate(
        {
            "quote_id": "q-1",
            "business_type": "ON_RAMP",
            "quote_type": "STANDARD",
            "from_currency": "USD",
            "to_currency": "USDT",
            "from_amount": "100",
            "to_amount": "99.123456",
            "rate": "0.99123456",
            "fee_amount": "0.5",
            "fee_currency": "USD",
            "expires_at": "2026-11-22T10:00:30.123Z",
            "pricing_note": "",
        }
    )
    assert resp.rate == Decimal("0.99123456")
    assert resp.expires_at == dt.datetime(2026, 11, 22, 10, 0, 30, 123000, tzinfo=dt.UTC)
    assert resp.to_json_dict()["expires_at"] == "2026-11-22T10:00:30.123Z"
