"""The provider's other resources: wallets, abnormal funds, stable orders, settlement, partner.

Fields and types follow the interface's "Resources and their fields" and "Endpoints" sections.
The interface does not say which fields are required, so only a resource's identity and its
amounts are required on answers, and every request field is optional. Enumerated values the
interface only partly shows (walletType, abnormal-fund status, orderStatus, ...) stay strings;
the values it names are kept as constants. Amounts are `Amount` (exact decimals, strings on the
wire); dates are `datetime.date` (yyyy-MM-dd) and timestamps `UtcTimestamp`.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
from typing import Annotated

import pycountry
from pydantic import AfterValidator, BeforeValidator, Field, PlainSerializer

from worker.provider import canonical
from worker.provider.models import (
    Amount,
    Code,
    DepositAddress,
    Id,
    MaybeAddress,
    MaybeAmount,
    MaybeCode,
    MaybeText,
    MaybeTxHash,
    Model,
    Page,
)

__all__ = [
    "AbnormalFund",
    "AbnormalFundListRequest",
    "AbnormalFundPage",
    "Address",
    "Amlq",
    "BankAccount",
    "BusinessDetails",
    "DepositAddress",
    "DigitalWalletOpeningQuestions",
    "Document",
    "EntityDetails",
    "FinancialProfile",
    "Governance",
    "KeyPerson",
    "KybInfo",
    "KycInfo",
    "OnboardingResponse",
    "OnboardingShareRequest",
    "QuoteRequest",
    "QuoteResponse",
    "SettlementDaily",
    "SettlementQuery",
    "SettlementRecord",
    "SettlementSummary",
    "StableOrderDetail",
    "SuperAdministrator",
    "UtcTimestamp",
    "WalletBalance",
    "WalletGroup",
]

# Values the interface names; other values may occur.
WALLET_TYPES = ("operation_prime", "collection_prime")
ABNORMAL_FUND_UNMATCHED = "UNMATCHED"
STABLE_BUSINESS_TYPES = ("STABLE_BUY", "STABLE_SWAP")
STABLE_ORDER_SUCCESS = "success"
SETTLEMENT_ALL_BUSINESS = "ALL"
PARTNER_SUCCESS = "SUCCESS"


def _utc_iso(value: dt.datetime) -> str:
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC)
    timespec = "seconds"
    if value.microsecond:
        timespec = "milliseconds" if value.microsecond % 1000 == 0 else "microseconds"
    return value.replace(tzinfo=None).isoformat(timespec=timespec) + "Z"


def _require_tz(value: dt.datetime) -> dt.datetime:
    if value.tzinfo is None:
        raise ValueError("timestamp must carry a time zone (ISO 8601 UTC, e.g. ...Z)")
    return value.astimezone(dt.UTC)


UtcTimestamp = Annotated[
    dt.datetime,
    AfterValidator(_require_tz),
    PlainSerializer(_utc_iso, return_type=str, when_used="json"),
]
"""An ISO 8601 timestamp with a zone, held in UTC and written back as ``...Z``."""


def _country_code(value: str) -> str:
    if len(value) != 2 or not value.isupper() or pycountry.countries.get(alpha_2=value) is None:
        raise ValueError("must be an ISO 3166-1 alpha-2 country code")
    return value


CountryCode = Annotated[str, AfterValidator(_country_code)]


def _base64(value: str) -> str:
    try:
        base64.b64decode(value, validate=True)
    except binascii.Error:
        raise ValueError("content_base64 is not valid base64") from None
    return value


Base64Text = Annotated[str, AfterValidator(_base64)]


# --- wallets ---------------------------------------------------------------------------------


class WalletBalance(Model):
    """One item of a wallet group's wallets: a currency and its balances."""

    currency: Code
    available: Amount
    unavailable: Amount


class WalletGroup(Model):
    """One item of the list-wallets data array (GET /v1/wallet/list)."""

    walletId: int
    name: str | None = None
    walletType: str | None = None
    autoCollection: bool = False
    wallets: list[WalletBalance] = Field(default_factory=list)


# --- abnormal funds --------------------------------------------------------------------------


class AbnormalFund(Model):
    """An abnormal fund record (records[] of the abnormal-fund list)."""

    id: int
    accountId: str | None = None
    userId: str | None = None
    amount: Amount
    currency: Code
    network: MaybeCode = None
    fromAddress: MaybeAddress = None
    toAddress: MaybeAddress = None
    txHash: MaybeTxHash = None
    txTime: int | None = None
    expiresTime: int | None = None
    status: Code
    orderId: str | None = None
    addressRiskStatus: str | None = None
    addressRiskRemark: str | None = None


AbnormalFundPage = Page[AbnormalFund]


class AbnormalFundListRequest(Model):
    """Body of POST /v1/stable/collect/abnormal-fund/list."""

    pageNum: int | None = None
    pageSize: int | None = None
    searchKeyword: str | None = None
    network: str | None = None
    currency: str | None = None
    statuses: list[str] | None = None
    startTime: int | None = None
    endTime: int | None = None


# --- stable orders ---------------------------------------------------------------------------


class StableOrderDetail(Model):
    """Data of GET /v1/stable/order/query-detail."""

    merchantOrderId: MaybeText = None
    orderId: Id
    orderStatus: str
    businessType: str | None = None
    paymentMethod: str | None = None
    sourceCurrency: MaybeCode = None
    targetCurrency: MaybeCode = None
    sourceAmount: MaybeAmount = None
    targetAmount: MaybeAmount = None
    price: MaybeAmount = None


# --- settlement ------------------------------------------------------------------------------


class SettlementSummary(Model):
    """The summary of a daily settlement report."""

    opening_balance: Amount
    closing_balance: Amount
    total_in_amount: Amount
    total_out_amount: Amount
    total_fee_amount: Amount
    net_amount: Amount
    adjustment_amount: Amount
    record_count: int
    matched_count: int
    mismatched_count: int
    manual_review_count: int


class SettlementRecord(Model):
    """One records[] item of a daily settlement report."""

    settlement_record_id: Id
    settlement_date: dt.date
    record_type: MaybeCode = None
    business_type: MaybeCode = None
    platform_order_id: MaybeText = None
    exchange_order_id: MaybeText = None
    rd_order_id: MaybeText = None
    asset: MaybeCode = None
    network: MaybeCode = None
    amount: Amount
    fee_amount: MaybeAmount = None
    fee_asset: MaybeCode = None
    from_address: MaybeAddress = None
    to_address: MaybeAddress = None
    tx_hash: MaybeTxHash = None
    confirmations: int | None = None
    order_status: MaybeCode = None
    reconciliation_status: MaybeCode = None
    occurred_at: UtcTimestamp | None = None
    settled_at: UtcTimestamp | None = None
    remark: str | None = None


class SettlementDaily(Model):
    """Data of GET /api/v1/settlement/daily-records."""

    settlement_date: dt.date
    timezone: Annotated[str, BeforeValidator(canonical.text)] = "UTC"
    asset: MaybeCode = None
    network: MaybeCode = None
    business_type: str | None = None
    summary: SettlementSummary
    records: list[SettlementRecord] = Field(default_factory=list)
    page: int
    page_size: int
    total: int
    generated_at: UtcTimestamp


class SettlementQuery(Model):
    """Query of GET /api/v1/settlement/daily-records."""

    settlement_date: dt.date | None = None
    timezone: str | None = None
    asset: str | None = None
    network: str | None = None
    business_type: str | None = None
    record_type: str | None = None
    reconciliation_status: str | None = None
    page: int | None = None
    page_size: int | None = None

    def to_query(self) -> dict[str, str]:
        """The query parameters that are set, as strings."""
        return {k: str(v) for k, v in self.model_dump(mode="json", exclude_none=True).items()}


# --- onboarding (partner) --------------------------------------------------------------------


class Address(Model):
    """The address object of onboarding requests."""

    line1: str | None = None
    line2: str | None = None
    city: str | None = None
    region: str | None = None
    postal_code: str | None = None
    country: str | None = None
    full_address: str | None = None


class KycInfo(Model):
    """kyc_info of an onboarding share request."""

    mobile_number: str | None = None
    email: str | None = None
    first_name: str | None = None
    last_name: str | None = None
    date_of_birth: dt.date | None = None
    nationality: CountryCode | None = None
    id_type: str | None = None
    id_number: str | None = None
    residential_address: Address | None = None
    account_purpose: str | None = None
    occupation: str | None = None


class EntityDetails(Model):
    """kyb_info.entity_details."""

    business_name_en: str | None = None
    business_name_zh: str | None = None
    registered_business_number: str | None = None
    certificate_of_incorporation_number: str | None = None
    place_of_incorporation: str | None = None
    registered_country_region: str | None = None
    business_type: str | None = None
    company_incorporation_date: str | None = None
    registered_address: Address | None = None
    primary_operating_place: str | None = None
    primary_operating_address: Address | None = None
    is_regulated_financial_institution: bool | None = None
    is_listed_company: bool | None = None
    is_government_owned_enterprise: bool | None = None
    legal_entity_identifier: str | None = None
    office_phone_number: str | None = None
    email: str | None = None


class BusinessDetails(Model):
    """kyb_info.business_details."""

    industry_nature_of_business: str | None = None
    locations_of_business: str | None = None
    industry_details: str | None = None
    years_in_business: str | None = None
    sales_turnover_previous_year: str | None = None


class FinancialProfile(Model):
    """kyb_info.financial_profile."""

    initial_source_of_funds: str | None = None
    place_of_source_of_funds: str | None = None
    recurring_source_of_funds: str | None = None
    estimated_total_net_assets_usd: str | None = None
    estimated_net_liquid_assets_usd: str | None = None


class Governance(Model):
    """kyb_info.governance."""

    board_meeting_quorum: str | None = None


class KeyPerson(Model):
    """One kyb_info.key_people[] item."""

    roles: list[str] = Field(default_factory=list)
    first_name_en: str | None = None
    last_name_en: str | None = None
    name_zh: str | None = None
    email: str | None = None
    mobile_number: str | None = None
    residential_address: Address | None = None
    id_issuing_country_region: str | None = None
    id_type: str | None = None
    id_number: str | None = None
    is_director: bool | None = None
    is_authorized_signatory: bool | None = None
    is_ubo: bool | None = None
    actual_owned_shares_percent: str | None = None
    certified_id_document_refs: list[str] = Field(default_factory=list)


class SuperAdministrator(Model):
    """kyb_info.super_administrator."""

    first_name_en: str | None = None
    last_name_en: str | None = None
    name_zh: str | None = None
    email: str | None = None


class Amlq(Model):
    """kyb_info.amlq: the AML questionnaire."""

    questionnaire_completed: bool | None = None
    questionnaire_version: str | None = None
    completed_at: str | None = None
    answers: list[dict[str, str]] = Field(default_factory=list)


class DigitalWalletOpeningQuestions(Model):
    """kyb_info.digital_wallet_opening_questions."""

    purpose_of_account_opening: str | None = None
    expected_business_counterparties: str | None = None
    expected_monthly_transaction_volume: str | None = None


class KybInfo(Model):
    """kyb_info of an onboarding share request."""

    entity_details: EntityDetails | None = None
    business_details: BusinessDetails | None = None
    financial_profile: FinancialProfile | None = None
    governance: Governance | None = None
    key_people: list[KeyPerson] = Field(default_factory=list)
    super_administrator: SuperAdministrator | None = None
    amlq: Amlq | None = None
    digital_wallet_opening_questions: DigitalWalletOpeningQuestions | None = None


class BankAccount(Model):
    """bank_account of an onboarding share request."""

    account_holder_name: str | None = None
    bank_name: str | None = None
    bank_code: str | None = None
    branch_code: str | None = None
    account_number: str | None = None
    currency: str | None = None
    country: CountryCode | None = None
    account_type: str | None = None
    proof_document_ref: str | None = None


class Document(Model):
    """One documents[] item of an onboarding share request."""

    document_type: str | None = None
    document_name: str | None = None
    document_side: str | None = None
    entity_role: str | None = None
    holder_name: str | None = None
    file_name: str | None = None
    content_type: str | None = None
    content_base64: Base64Text | None = None
    sha256: str | None = None
    issued_at: dt.date | None = None
    expires_at: dt.date | None = None
    certified_true_copy: bool | None = None
    remark: str | None = None


class OnboardingShareRequest(Model):
    """Body of POST /api/v1/onboarding/kyc-share."""

    request_id: str | None = None
    partner_user_id: str | None = None
    customer_type: str | None = None
    sharing_scenario: str | None = None
    kyc_info: KycInfo | None = None
    kyb_info: KybInfo | None = None
    bank_account: BankAccount | None = None
    documents: list[Document] | None = None
    callback_url: str | None = None


class OnboardingResponse(Model):
    """Data of the onboarding share answer."""

    platform_user_id: str
    customer_type: str | None = None
    onboarding_status: str


# --- quotes (partner) ------------------------------------------------------------------------


class QuoteRequest(Model):
    """Body of POST /api/v1/quotes (amounts are decimal strings on the wire)."""

    request_id: str | None = None
    partner_user_id: str | None = None
    platform_user_id: str | None = None
    business_type: str | None = None
    from_currency: str | None = None
    to_currency: str | None = None
    from_amount: Amount | None = None
    to_amount: Amount | None = None
    asset: str | None = None
    network: str | None = None
    bank_account_id: str | None = None


class QuoteResponse(Model):
    """Data of the quote answer."""

    quote_id: str
    business_type: str | None = None
    quote_type: str | None = None
    from_currency: str | None = None
    to_currency: str | None = None
    from_amount: Amount | None = None
    to_amount: Amount | None = None
    rate: Amount | None = None
    fee_amount: Amount | None = None
    fee_currency: str | None = None
    expires_at: UtcTimestamp
    pricing_note: str | None = None

    def expired(self, at: dt.datetime | None = None) -> bool:
        """Has the quote passed its expires_at (at `at`, default now)? An expired quote is
        never used: request a new one."""
        return (at or dt.datetime.now(dt.UTC)) >= self.expires_at
