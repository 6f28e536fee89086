"""Wallet error codes and retry categories, as the interface's tables say."""

from __future__ import annotations

import pytest

from worker.provider.codes import (
    CATEGORIES,
    WALLET_CODES,
    RetryCategory,
    WalletCode,
    categorize,
    code_rule,
    may_retry_same_key,
)

# code -> (retry later at all, same key), from the interface's "Wallet error codes" table.
TABLE = {
    "10000100": (False, False),
    "10000101": (False, False),
    "10000102": (False, False),
    "10000103": (False, False),
    "10000104": (True, True),
    "10000105": (False, False),
    "10000106": (False, False),
    "10000107": (False, False),
}


def test_every_code_listed() -> None:
    """Exactly the eight codes of the interface are known."""
    assert set(WALLET_CODES) == set(TABLE) == {c.value for c in WalletCode}


@pytest.mark.parametrize(("code", "expected"), sorted(TABLE.items()))
def test_code_row(code: str, expected: tuple[bool, bool]) -> None:
    """Each code's retry-later and same-key flags match the interface's table."""
    rule = code_rule(code)
    assert rule is not None
    assert (rule.retry_later, rule.same_key) == expected
    assert may_retry_same_key(code) is expected[1]


def test_only_10000104_retries_with_same_key() -> None:
    """10000104 is the one wallet code that may be retried with the same key."""
    assert [c for c in TABLE if may_retry_same_key(c)] == ["10000104"]


def test_code_guidance() -> None:
    """The guidance rows name what to do (e.g. 10000106: drop the source fields)."""
    rule = code_rule("10000106")
    assert rule is not None
    assert "walletAddress, network, memo, symbol, txHash" in rule.guidance
    assert "countryCode" in WALLET_CODES["10000103"].meaning


@pytest.mark.parametrize("code", [None, "", "99999999", "AMOUNT_OUT_OF_RANGE"])
def test_unlisted_codes(code: str | None) -> None:
    """Codes the table does not list have no row."""
    assert code_rule(code) is None


@pytest.mark.parametrize(
    ("msg", "category"),
    [
        ("invalid signature", RetryCategory.AUTH),
        ("Unauthorized", RetryCategory.AUTH),
        ("API-TIMESTAMP out of window: timestamp", RetryCategory.AUTH),
        ("countryCode is mandatory", RetryCategory.VALIDATION),
        ("sourceAmount is required for STABLE_SWAP", RetryCategory.VALIDATION),
        ("invalid countryCode", RetryCategory.VALIDATION),
        ("sourceAmount out of range", RetryCategory.AMOUNT_OUT_OF_RANGE),
        ("sourceAmount must be between 100 and 500000", RetryCategory.AMOUNT_OUT_OF_RANGE),
        ("currency pair not supported", RetryCategory.PAIR_NOT_ENABLED),
        ("pair not matched", RetryCategory.PAIR_NOT_ENABLED),
        ("quote expired", RetryCategory.QUOTE_EXPIRED),
        ("order is processing", RetryCategory.IN_FLIGHT),
        ("deposit review rejected", RetryCategory.TERMINAL),
        ("payment fail", RetryCategory.TERMINAL),
        ("internal server error", RetryCategory.SYSTEM),
        ("Internal server error, request failed", RetryCategory.SYSTEM),
    ],
)
def test_categories_from_message(msg: str, category: RetryCategory) -> None:
    """A failure's category is read from the signals in its message."""
    assert categorize(msg) is category


def test_categories_from_http_status() -> None:
    """401 is an auth failure; a bare 5xx is a system error; nothing known is terminal."""
    assert categorize("whatever", 401) is RetryCategory.AUTH
    assert categorize(None, 503) is RetryCategory.SYSTEM
    assert categorize("gateway trouble", 502) is RetryCategory.SYSTEM
    assert categorize("something odd") is RetryCategory.TERMINAL


@pytest.mark.parametrize(
    ("category", "same_key"),
    [
        (RetryCategory.AUTH, True),
        (RetryCategory.VALIDATION, False),
        (RetryCategory.AMOUNT_OUT_OF_RANGE, False),
        (RetryCategory.PAIR_NOT_ENABLED, False),
        (RetryCategory.QUOTE_EXPIRED, False),
        (RetryCategory.IN_FLIGHT, True),
        (RetryCategory.TIMEOUT, True),
        (RetryCategory.TERMINAL, False),
        (RetryCategory.SYSTEM, True),
    ],
)
def test_category_same_key(category: RetryCategory, same_key: bool) -> None:
    """Each retry category's same-key rule matches the interface's table."""
    assert CATEGORIES[category].same_key is same_key


def test_same_key_without_code_uses_message() -> None:
    """Without a wallet code, the message decides: auth yes, validation no."""
    assert may_retry_same_key(None, "bad signature") is True
    assert may_retry_same_key(None, "fullName is mandatory") is False
    assert may_retry_same_key(None, None, 504) is True
