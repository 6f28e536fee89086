"""Values as the provider writes them, made canonical once, where they enter (docs/design.md,
"Provider values at the boundary").

The provider writes "not known yet" as an absent key, `null`, `""` or blanks, and one value in
several spellings. Every provider model (`worker.provider.models`, `worker.provider.resources`)
reads its fields through these, so that the rest of depositd compares values as they are and
never as they were sent:

- unknown, in every form, is None;
- a txHash is trimmed, and a hexadecimal one (with or without `0x`) lower-cased: hex is
  case-blind, and one hash must read the same from every source;
- an address is trimmed and keeps its case (base58 and bech32 addresses are case-sensitive);
- a currency or network code is trimmed and upper-cased;
- an identifier (transactionId, walletName, ...) is trimmed;
- an amount is an exact `Decimal` (`worker.provider.amounts`).
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

from worker.provider.amounts import parse_amount

# Blanks a provider pads with, beyond what `str.strip` removes: zero-width space, BOM.
_INVISIBLE = "\u200b\ufeff"
_HEX = re.compile(r"(?:0[xX])?[0-9a-fA-F]+", re.ASCII)


def text(value: Any) -> Any:
    """A text trimmed, None when it holds nothing; any other value as it is (the model's type
    check refuses what is not text)."""
    if isinstance(value, str):
        trimmed = value.strip().strip(_INVISIBLE).strip()
        return trimmed or None
    return value


def tx_hash(value: Any) -> Any:
    """A transaction hash: trimmed; hexadecimal ones lower-cased (`0X` too)."""
    trimmed = text(value)
    if isinstance(trimmed, str) and _HEX.fullmatch(trimmed):
        return trimmed.lower()
    return trimmed


def address(value: Any) -> Any:
    """An address: trimmed, its case kept."""
    return text(value)


def code(value: Any) -> Any:
    """A currency or network code: trimmed and upper-cased."""
    trimmed = text(value)
    return trimmed.upper() if isinstance(trimmed, str) else trimmed


def hash_key(value: Any) -> str | None:
    """A txHash as hashes are compared, by the store's statements (`lower(tx_hash)`) as by
    reconciliation: its canonical form, case-blind whatever its alphabet."""
    form = tx_hash(value)
    return form.lower() if isinstance(form, str) else None


def amount(value: Any) -> Decimal | None:
    """An amount, None when not known (absent, null, blanks)."""
    return None if _unknown(value) else parse_amount(value)


def deposit_amount(value: Any) -> Decimal | None:
    """A deposit's amount (above zero), None when not known."""
    return None if _unknown(value) else parse_amount(value, positive=True)


def _unknown(value: Any) -> bool:
    return value is None or (isinstance(value, str) and text(value) is None)


# A deposit's fields read from the provider, by their names in `Fact`, `Deposit` and the
# deposits table, and the form of each: what a fact or a row stored before these forms were
# kept is read into (`worker.track.tracker.Fact.from_json`, the store's migration).
DEPOSIT_FORMS = {
    "tx_hash": tx_hash,
    "currency": code,
    "network": code,
    "from_address": address,
    "to_address": address,
    "wallet_name": text,
}
