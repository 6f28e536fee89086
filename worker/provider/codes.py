"""The provider's wallet error codes and retry categories, as data the code can ask.

Source: provider interface, "Wallet error codes" and "Retry categories".
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class RetryCategory(str, Enum):
    """The interface's retry categories."""

    AUTH = "auth"
    VALIDATION = "validation"
    AMOUNT_OUT_OF_RANGE = "amount_out_of_range"
    PAIR_NOT_ENABLED = "pair_not_enabled"
    QUOTE_EXPIRED = "quote_expired"
    IN_FLIGHT = "in_flight"
    TIMEOUT = "timeout"
    TERMINAL = "terminal"
    SYSTEM = "system"


@dataclass(frozen=True)
class CategoryRule:
    """What a caller may do after a failure of one category."""

    category: RetryCategory
    signals: tuple[str, ...]
    retry: bool  # may the call be tried again at all (possibly later)
    same_key: bool  # may the same Idempotency-Key be reused
    action: str


CATEGORIES: dict[RetryCategory, CategoryRule] = {
    rule.category: rule
    for rule in (
        CategoryRule(
            RetryCategory.AUTH,
            ("signature", "unauthorized", "timestamp"),
            True,
            True,
            "fix clock or signature",
        ),
        CategoryRule(
            RetryCategory.VALIDATION,
            ("mandatory", "required", "invalid"),
            False,
            False,
            "fix parameters",
        ),
        CategoryRule(
            RetryCategory.AMOUNT_OUT_OF_RANGE,
            ("out of range", "between"),
            False,
            False,
            "adjust amount; check pair limits",
        ),
        CategoryRule(
            RetryCategory.PAIR_NOT_ENABLED,
            ("supported", "not matched"),
            False,
            False,
            "ask customer support",
        ),
        CategoryRule(
            RetryCategory.QUOTE_EXPIRED, ("expire", "expired"), False, False, "request a new quote"
        ),
        CategoryRule(
            RetryCategory.IN_FLIGHT, ("processing",), True, True, "wait for webhook or query"
        ),
        CategoryRule(RetryCategory.TIMEOUT, (), True, True, "retry with back-off"),
        CategoryRule(
            RetryCategory.TERMINAL, ("fail", "rejected"), False, False, "handle the terminal state"
        ),
        CategoryRule(RetryCategory.SYSTEM, ("internal",), True, True, "ticket with traceId"),
    )
}


class WalletCode(str, Enum):
    """8-digit wallet error codes of the deposit whitelist."""

    NOT_FOUND = "10000100"
    REVIEW_COMPLETED = "10000101"
    INCOMPLETE = "10000102"
    BAD_VALUE = "10000103"
    CANNOT_SUBMIT_NOW = "10000104"
    DUPLICATE = "10000105"
    SOURCE_FIELDS_SENT = "10000106"
    WALLET_INVALID = "10000107"


@dataclass(frozen=True)
class CodeRule:
    """The interface's row for one wallet error code."""

    code: WalletCode
    meaning: str
    retry_later: bool  # only 10000104: try again later, same payload
    same_key: bool
    guidance: str


WALLET_CODES: dict[str, CodeRule] = {
    rule.code.value: rule
    for rule in (
        CodeRule(
            WalletCode.NOT_FOUND,
            "transaction not found, or not owned by the caller",
            False,
            False,
            "re-read the history queue with whiteListStatus=init",
        ),
        CodeRule(
            WalletCode.REVIEW_COMPLETED,
            "review already completed for this deposit",
            False,
            False,
            "nothing left to do",
        ),
        CodeRule(
            WalletCode.INCOMPLETE,
            "payer details incomplete",
            False,
            False,
            "add missing fields, use a new key",
        ),
        CodeRule(
            WalletCode.BAD_VALUE,
            "field value not accepted, including invalid countryCode or unknown provider",
            False,
            False,
            "send an ISO 3166-1 alpha-2 code and a provider from options",
        ),
        CodeRule(
            WalletCode.CANNOT_SUBMIT_NOW,
            "cannot submit right now",
            True,
            True,
            "later only; poll the status; do not edit and retry immediately",
        ),
        CodeRule(
            WalletCode.DUPLICATE, "duplicate request", False, False, "read the original result"
        ),
        CodeRule(
            WalletCode.SOURCE_FIELDS_SENT,
            "source address supplied or changed for a received deposit",
            False,
            False,
            "drop walletAddress, network, memo, symbol, txHash",
        ),
        CodeRule(
            WalletCode.WALLET_INVALID,
            "wallet invalid, or the sub-wallet has not been created",
            False,
            False,
            "create the sub-wallet first",
        ),
    )
}


def code_rule(code: str | None) -> CodeRule | None:
    """The interface's row for a wallet code, or None for codes it does not list."""
    return WALLET_CODES.get(code or "")


# The table's order, except that "fail" (terminal) is the weakest signal and is tried last:
# "internal server error, request failed" is a system error, not a terminal failure.
_MATCH_ORDER = [
    *(rule for rule in CATEGORIES.values() if rule.category is not RetryCategory.TERMINAL),
    CATEGORIES[RetryCategory.TERMINAL],
]


def categorize(msg: str | None, http_status: int | None = None) -> RetryCategory:
    """The retry category of a failure from its message (and HTTP status where it helps)."""
    if http_status == 401:
        return RetryCategory.AUTH
    if http_status is not None and http_status >= 500 and not msg:
        return RetryCategory.SYSTEM
    text = (msg or "").lower()
    for rule in _MATCH_ORDER:
        if any(signal in text for signal in rule.signals):
            return rule.category
    if http_status is not None and http_status >= 500:
        return RetryCategory.SYSTEM
    return RetryCategory.TERMINAL


def may_retry_same_key(
    code: str | None, msg: str | None = None, http_status: int | None = None
) -> bool:
    """May the same call be repeated with the same Idempotency-Key?"""
    rule = code_rule(code)
    if rule is not None:
        return rule.same_key
    return CATEGORIES[categorize(msg, http_status)].same_key
