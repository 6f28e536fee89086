"""The sandbox's records and their wire shapes (docs/design.md): orders, addresses, wallets.

Each record knows how the provider shows it (history, detail, webhook data), so the shapes live
in one place.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from worker.errors import SandboxError
from worker.provider.jsonio import decimal_str
from worker.provider.models import (
    AddressStatus,
    CreditStatus,
    EventType,
    OrderStatus,
    WhiteListStatus,
)


def new_id(prefix: str) -> str:
    """A fresh identifier, unique across sandbox instances."""
    return f"{prefix}{uuid.uuid4().hex[:20]}"


def new_tx_hash(network: str, digits: int = 64) -> str:
    """A fresh transaction hash written as that chain writes it: TRON's are bare hex, an EVM
    chain's (ETH, BSC, ...) start with 0x."""
    body = (uuid.uuid4().hex + uuid.uuid4().hex)[:digits]
    return body if network.upper() == "TRON" else "0x" + body


@dataclass(frozen=True)
class Event:
    """A webhook the state change causes (the envelope is completed by delivery)."""

    event_type: str
    reference_id: str
    status: str
    data: dict[str, Any]


@dataclass
class Wallet:
    """A wallet group."""

    wallet_id: int
    name: str
    auto_collection: bool
    wallet_type: str = "collection_prime"

    def deposit_address(self, network: str) -> str:
        """A stable fake deposit address of this wallet on a network."""
        digest = hashlib.sha256(f"{self.wallet_id}:{network}".encode()).hexdigest()
        return f"SBX{network.upper()}{self.wallet_id}{digest[:24]}"


@dataclass
class Balance:
    """Available and unavailable amount of one currency in one wallet."""

    available: Decimal = Decimal(0)
    unavailable: Decimal = Decimal(0)


@dataclass
class Order:
    """A deposit order."""

    transaction_id: str
    transaction_hash: str
    wallet_id: int
    wallet_name: str
    currency: str
    network: str
    amount: Decimal
    from_address: str
    to_address: str
    status: OrderStatus
    white_list_status: WhiteListStatus | None
    credit_status: CreditStatus
    create_time: int
    update_time: int
    fail_message: str | None = None
    credit_time: int | None = None

    def wire(self, *, detail: bool = True) -> dict[str, Any]:
        """The deposit order as history (detail=False: no creditStatus) or detail shows it."""
        out: dict[str, Any] = {
            "transactionId": self.transaction_id,
            "transactionHash": self.transaction_hash,
            "transactionType": "DEPOSIT",
            "walletId": self.wallet_id,
            "walletName": self.wallet_name,
            "currency": self.currency,
            "network": self.network,
            "amount": decimal_str(self.amount),
            "fromAddress": self.from_address,
            "toAddress": self.to_address,
            "status": self.status.value,
            "whiteListStatus": status_value(self.white_list_status),
        }
        # The interface shows creditStatus in transaction detail only; history leaves it out.
        if detail:
            out["creditStatus"] = self.credit_status.value
        out.update(
            failMessage=self.fail_message, createTime=self.create_time, updateTime=self.update_time
        )
        return out

    def event(self, event_type: EventType, now: int, **extra: Any) -> Event:
        """A deposit webhook: the DEPOSIT_ORDER_NOTIFICATION data shape plus `extra`."""
        data: dict[str, Any] = {
            "transactionId": self.transaction_id,
            "transactionHash": self.transaction_hash,
            "transactionType": "DEPOSIT",
            # A JSON number on the wire (the interface's event table), with its exact digits.
            "amount": self.amount,
            "currency": self.currency,
            "network": self.network,
            "fromAddress": self.from_address,
            "walletId": self.wallet_id,
            "walletName": self.wallet_name,
            "status": self.status.value,
            "timestamp": now,
            "whiteListStatus": status_value(self.white_list_status),
            **extra,
        }
        return Event(event_type.value, self.transaction_id, self.status.value, data)


@dataclass
class Address:
    """A deposit whitelist source address record."""

    id: str
    wallet_id: int
    wallet_address: str
    network: str
    memo: str | None
    status: AddressStatus
    create_time: int
    update_time: int
    fail_message: str | None = None

    def wire(self) -> dict[str, Any]:
        """The record as register, list and detail answer it."""
        return {
            "id": self.id,
            "walletId": self.wallet_id,
            "walletAddress": self.wallet_address,
            "network": self.network,
            "memo": self.memo,
            "status": self.status.value,
            "failMessage": self.fail_message,
            "createTime": self.create_time,
            "updateTime": self.update_time,
        }

    def event(self) -> Event:
        """WALLET_ADDRESS_UPDATED for the record's current status."""
        data = {
            "id": self.id,
            "walletAddress": self.wallet_address,
            "network": self.network,
            "status": self.status.value,
            "failMessage": self.fail_message,
        }
        return Event(EventType.WALLET_ADDRESS_UPDATED.value, self.id, self.status.value, data)


def status_value(status: WhiteListStatus | None) -> str | None:
    return None if status is None else status.value


def parse_amount(value: Decimal | str | int) -> Decimal:
    """A positive exact amount; SandboxError otherwise (floats are refused)."""
    if isinstance(value, float | bool):
        raise SandboxError("amount must be a decimal string, not a float")
    try:
        amount = Decimal(str(value).strip()) if not isinstance(value, Decimal) else value
    except InvalidOperation:
        raise SandboxError(f"amount {value!r} is not a decimal number") from None
    if not amount.is_finite() or amount <= 0:
        raise SandboxError("amount must be a positive decimal")
    return amount
