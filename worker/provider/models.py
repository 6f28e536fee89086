"""The provider's deposit-side data model (pydantic v2).

Where the interface names an operation without showing its payload, the shapes are those of
docs/design.md, and they live here so that one edit adapts to the real provider:

- Deposit order (history records, transaction detail ``data``): `DepositOrder`.
- History ``GET /v1/wallet/history?whiteListStatus=init&pageNum=1&pageSize=50`` (also walletId,
  currency, startTime, endTime; same answer at ``/v1/wallet/transaction/list``): ``data`` is a
  `Page` of `DepositOrder`.
- Transaction detail ``GET /v1/wallet/transactions/{id}`` (also
  ``/v1/wallet/transaction/detail?transactionId=``): ``data`` is one `DepositOrder`.
- Submit ``POST /v1/wallet/deposit-whitelist/transactions/{id}/submit``: ``data`` is `SubmitResult`.
- Options ``GET /v1/wallet/deposit-whitelist/options``: ``data`` is `Options` (a list of
  ``{"name": ...}`` objects is accepted too).
- Asset balance ``GET /v1/wallet/asset-balance?walletId=&currency=``: ``data`` is a list of
  `AssetBalance`.
- Source address (register answer, list records, detail): `SourceAddress`; register body: payer
  details plus walletId, walletAddress, network and memo/txHash where given; list:
  ``GET .../addresses?pageNum=&pageSize=&status=``.
- WALLET_ADDRESS_UPDATED ``data``: `AddressUpdatedData`.
- Deposit Travel Rule link ``POST /v1/wallet/deposit-whitelist/travel-rule-link`` (body walletId,
  transactionId, lng): ``data`` is `TravelRuleLink`.
- Collection order status ``GET /v2/stable/collect/order-status``: `CollectionOrderStatus`.
- DEPOSIT_WHITELIST_* ``data``: `DepositEventData` (the DEPOSIT_ORDER_NOTIFICATION shape plus
  failMessage or creditTime); the envelope's referenceId is the transactionId.
- Auth failure: HTTP 401 with the wallet envelope (status 401, msg naming signature, unauthorized
  or timestamp).

Every value is made canonical here, as it enters (`worker.provider.canonical`): unknown in any
form (absent, null, "", blanks) is None, a txHash trimmed and hex lower-cased, an address
trimmed, a currency or network trimmed and upper-cased. Amounts are exact `Decimal`s, accepted
from JSON strings or numbers (parse bodies with `worker.provider.jsonio.loads` so numbers never
pass through float) within the bounds of `worker.provider.amounts`, and written back as
strings; a deposit's amount is above zero.
"""

from __future__ import annotations

from decimal import Decimal
from enum import Enum
from typing import Annotated, Any, Generic, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, model_validator

from worker.provider import canonical
from worker.provider.amounts import parse_amount
from worker.provider.jsonio import decimal_str


def _amount(value: Any) -> Decimal:
    return parse_amount(value)


# Every amount the provider sends is read by `worker.provider.amounts.parse_amount`: plain,
# bounded digits; a deposit's amount is also above zero.
Amount = Annotated[
    Decimal,
    BeforeValidator(_amount),
    PlainSerializer(decimal_str, return_type=str, when_used="json"),
]


def _maybe_decimal_str(value: Decimal | None) -> str | None:
    return None if value is None else decimal_str(value)


# The canonical forms of `worker.provider.canonical`, one per kind of value. "Maybe" types read
# every unknown form as None; the others refuse it (a required identifier).
MaybeAmount = Annotated[
    Decimal | None,
    BeforeValidator(canonical.amount),
    PlainSerializer(_maybe_decimal_str, return_type=str | None, when_used="json"),
]
MaybeDepositAmount = Annotated[
    Decimal | None,
    BeforeValidator(canonical.deposit_amount),
    PlainSerializer(_maybe_decimal_str, return_type=str | None, when_used="json"),
]
Id = Annotated[str, BeforeValidator(canonical.text), Field(min_length=1)]
MaybeText = Annotated[str | None, BeforeValidator(canonical.text)]
MaybeTxHash = Annotated[str | None, BeforeValidator(canonical.tx_hash)]
MaybeAddress = Annotated[str | None, BeforeValidator(canonical.address)]
Address = Annotated[str, BeforeValidator(canonical.address), Field(min_length=1)]
Code = Annotated[str, BeforeValidator(canonical.code), Field(min_length=1)]
MaybeCode = Annotated[str | None, BeforeValidator(canonical.code)]


class Model(BaseModel):
    """Base for provider payloads: keeps unknown fields, serialises by field name."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    def to_json_dict(self) -> dict[str, Any]:
        """A JSON-ready dict without unset optional fields."""
        return self.model_dump(mode="json", exclude_none=False, exclude_unset=True)


class OrderStatus(str, Enum):
    """Deposit order status."""

    PROCESSING = "PROCESSING"
    SUCCESS = "SUCCESS"
    FAIL = "FAIL"


class WhiteListStatus(str, Enum):
    """Whitelist progress; lowercase on the wire."""

    INIT = "init"
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"


class CreditStatus(str, Enum):
    """Crediting status, only in transaction detail."""

    PENDING = "PENDING"
    CREDITED = "CREDITED"
    BLOCKED = "BLOCKED"


class AddressStatus(str, Enum):
    """Source address status; DISABLED after the disable call (assumed, docs/design.md)."""

    PROCESSING = "PROCESSING"
    ACTIVE = "ACTIVE"
    FAILED = "FAILED"
    DISABLED = "DISABLED"


class EventType(str, Enum):
    """Event types of the interface's Events table."""

    WALLET_ADDRESS_UPDATED = "WALLET_ADDRESS_UPDATED"
    DEPOSIT_WHITELIST_REQUIRED = "DEPOSIT_WHITELIST_REQUIRED"
    DEPOSIT_WHITELIST_FAILED = "DEPOSIT_WHITELIST_FAILED"
    DEPOSIT_WHITELIST_CREDITED = "DEPOSIT_WHITELIST_CREDITED"
    DEPOSIT_ORDER_NOTIFICATION = "DEPOSIT_ORDER_NOTIFICATION"
    COLLECT_ORDER_UPDATED = "Collect Order Updated"
    STABLE_ORDER_UPDATED = "STABLE_ORDER_UPDATED"
    WALLET_TRANSFER_ORDER_UPDATED = "WALLET_TRANSFER_ORDER_UPDATED"
    # A hint only: depositd reads the abnormal-fund list (docs/design.md).
    ABNORMAL_FUND_NOTIFICATION = "ABNORMAL_FUND_NOTIFICATION"


DEPOSIT_EVENT_TYPES = frozenset(
    {
        EventType.DEPOSIT_WHITELIST_REQUIRED.value,
        EventType.DEPOSIT_WHITELIST_FAILED.value,
        EventType.DEPOSIT_WHITELIST_CREDITED.value,
        EventType.DEPOSIT_ORDER_NOTIFICATION.value,
    }
)
KNOWN_EVENT_TYPES = frozenset(e.value for e in EventType)


def _lower(value: Any) -> Any:
    trimmed = canonical.text(value)
    return trimmed.lower() if isinstance(trimmed, str) else trimmed


# Statuses trimmed and in the case the interface writes them in.
Status = Annotated[OrderStatus, BeforeValidator(canonical.code)]
MaybeWhiteList = Annotated[WhiteListStatus | None, BeforeValidator(_lower)]
MaybeCredit = Annotated[CreditStatus | None, BeforeValidator(canonical.code)]


class _SaysNothingWhenBlank(Model):
    """A deposit record: a status key whose value is blank text says nothing, as an absent key
    does (`null` stays a real null: not behind the whitelist)."""

    @model_validator(mode="before")
    @classmethod
    def _blank_statuses(cls, data: Any) -> Any:
        if isinstance(data, dict):
            blank = [
                key
                for key in ("whiteListStatus", "creditStatus")
                if isinstance(data.get(key), str) and canonical.text(data[key]) is None
            ]
            if blank:
                data = {k: v for k, v in data.items() if k not in blank}
        return data


# --- envelopes -------------------------------------------------------------------------------


class WalletEnvelope(Model):
    """Wallet/stable response form."""

    status: int
    code: str | None = None
    msg: str | None = None
    success: bool | None = None
    traceId: str | None = None
    data: Any = None


class EmailEnvelope(Model):
    """E-mail verification response form (no data)."""

    status: int
    message: str | None = None
    traceId: str | None = None


class PartnerEnvelope(Model):
    """Partner response form (onboarding, quotes, settlement)."""

    code: str
    message: str | None = None
    data: Any = None
    trace_id: str | None = None


class WebhookEnvelope(Model):
    """Every webhook delivery."""

    eventId: str = Field(min_length=1)
    eventType: str = Field(min_length=1)
    referenceId: MaybeText = None
    status: str | None = None
    timestamp: int | None = None
    data: dict[str, Any] = Field(default_factory=dict)


T = TypeVar("T")


class Page(Model, Generic[T]):
    """Page wrapper in data."""

    pageNumber: int
    pageSize: int
    totalPage: int
    totalRow: int
    records: list[T]
    # Records of the answer left out as unreadable (set by the client, not on the wire).
    refused: int = Field(0, exclude=True)


# --- deposits --------------------------------------------------------------------------------


class DepositOrder(_SaysNothingWhenBlank):
    """A deposit order as read from history and transaction detail (docs/design.md)."""

    transactionId: Id
    transactionHash: MaybeTxHash = None
    transactionType: str = "DEPOSIT"
    walletId: int
    walletName: MaybeText = None
    currency: MaybeCode = None
    network: MaybeCode = None
    amount: MaybeDepositAmount = None
    fromAddress: MaybeAddress = None
    toAddress: MaybeAddress = None
    status: Status
    whiteListStatus: MaybeWhiteList = None
    creditStatus: MaybeCredit = None
    failMessage: MaybeText = None
    createTime: int | None = None
    updateTime: int | None = None


class DepositNotificationData(_SaysNothingWhenBlank):
    """DEPOSIT_ORDER_NOTIFICATION data."""

    transactionId: Id
    transactionHash: MaybeTxHash = None
    transactionType: str = "DEPOSIT"
    amount: MaybeDepositAmount = None
    currency: MaybeCode = None
    network: MaybeCode = None
    fromAddress: MaybeAddress = None
    walletId: int
    walletName: MaybeText = None
    status: Status
    timestamp: int | None = None
    whiteListStatus: MaybeWhiteList = None


class DepositEventData(DepositNotificationData):
    """DEPOSIT_WHITELIST_* data: the notification shape plus failMessage or creditTime."""

    failMessage: MaybeText = None
    creditTime: int | None = None


class AddressUpdatedData(Model):
    """WALLET_ADDRESS_UPDATED data (docs/design.md)."""

    id: Id
    walletAddress: Address
    network: Code
    status: AddressStatus
    failMessage: MaybeText = None


class SourceAddress(Model):
    """Deposit whitelist source address record."""

    id: Id
    walletId: int
    walletAddress: Address
    network: Code
    memo: MaybeText = None
    status: AddressStatus
    failMessage: MaybeText = None
    createTime: int | None = None
    updateTime: int | None = None


class SubmitResult(Model):
    """Answer of the submit endpoint."""

    transactionId: Id
    whiteListStatus: WhiteListStatus


class ProviderName(Model):
    """One provider in the options list when given as an object."""

    name: str


class Options(Model):
    """Options endpoint data: the provider (VASP) names."""

    providers: list[str | ProviderName]

    def names(self) -> list[str]:
        """Provider names, whichever form they came in."""
        return [p if isinstance(p, str) else p.name for p in self.providers]


class AssetBalance(Model):
    """One row of the asset-balance answer."""

    walletId: int
    currency: Code
    available: Amount
    unavailable: Amount


class DepositAddress(Model):
    """Deposit address of a wallet (payload not shown by the interface; assumed)."""

    walletId: int
    currency: MaybeCode = None
    network: MaybeCode = None
    address: Address
    memo: MaybeText = None


class TravelRuleLink(Model):
    """Data of ``POST /v1/wallet/deposit-whitelist/travel-rule-link`` (assumed): the hosted
    deposit Travel Rule page URL with its short-lived token, and when it expires (epoch ms)."""

    url: str = Field(min_length=1)
    expiresTime: int


class CollectionOrderStatus(Model):
    """Data of ``GET /v2/stable/collect/order-status`` (assumed): the order's identifiers, its
    status and whiteListStatus; anything else is kept as given."""

    orderId: str | None = None
    merchantOrderId: str | None = None
    status: str | None = None
    whiteListStatus: str | None = None
