"""Amounts as the provider may send them, read once, here, for every path.

An amount is a JSON number or a numeric string in any of the spellings a provider writes
(`"100"`, `"0100.00"`, `"1e2"`, `"1.5E-3"`, `".5"`, eighteen decimals, blanks around), whose
value has at most `MAX_INTEGER_DIGITS` digits before the point and `MAX_FRACTION_DIGITS` after
it (a deposit amount is also above zero). An exponent is read from its digits alone, so no
huge string is ever built. Refused, with an error that does not echo the text: `5_000`,
`1,000`, digits of other scripts, a `+`, signs on deposit amounts, NaN and Infinity, booleans
and floats.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

MAX_INTEGER_DIGITS = 30
MAX_FRACTION_DIGITS = 30
# The longest text that can be a bounded amount: sign, digits, point.
_MAX_TEXT = MAX_INTEGER_DIGITS + MAX_FRACTION_DIGITS + 2
# Digits with an optional point and exponent; the value's bounds are checked on the Decimal.
_NUMERIC = re.compile(r"-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]{1,6})?", re.ASCII)
# The longest text read: leading zeros and trailing zeros of a bounded value, an exponent.
_MAX_SPELLING = 4 * _MAX_TEXT
_BOUNDS = f"at most {MAX_INTEGER_DIGITS} digits before the point and {MAX_FRACTION_DIGITS} after"


class AmountError(ValueError):
    """A value that is not an amount depositd accepts."""


def _within_bounds(value: Decimal) -> bool:
    """Digits before and after the point, from the digit tuple and exponent only."""
    _sign, digits, exponent = value.as_tuple()
    if not isinstance(exponent, int):
        return False  # NaN, sNaN, Infinity
    if value.is_zero():
        return exponent >= -MAX_FRACTION_DIGITS and exponent <= MAX_INTEGER_DIGITS
    return exponent >= -MAX_FRACTION_DIGITS and len(digits) + exponent <= MAX_INTEGER_DIGITS


def parse_amount(value: Any, *, positive: bool = False) -> Decimal:
    """The exact `Decimal` of an amount; raises `AmountError` saying what is wrong."""
    if isinstance(value, float):
        raise AmountError("amounts must arrive as decimal strings or exact JSON numbers, not float")
    if isinstance(value, bool):
        raise AmountError("an amount is a decimal string or number, not true or false")
    if isinstance(value, str):
        # The input is not echoed: an error may be logged or stored, and the text is anyone's.
        text = value.strip()
        if len(text) > _MAX_SPELLING or not _NUMERIC.fullmatch(text):
            raise AmountError(
                "amount is not a decimal number (ASCII digits, one optional '.', an optional"
                " exponent; no '+', separator or other script)"
            )
        return parse_amount(Decimal(text), positive=positive)
    elif isinstance(value, int):
        if not -(10**MAX_INTEGER_DIGITS) < value < 10**MAX_INTEGER_DIGITS:
            raise AmountError(f"amount has more than {MAX_INTEGER_DIGITS} digits")
        number = Decimal(value)
    elif isinstance(value, Decimal):
        if not _within_bounds(value):
            raise AmountError(f"amount is not a finite decimal with {_BOUNDS}")
        # An exponent within the bounds (1e3): the same value with plain digits.
        exponent = value.as_tuple().exponent
        number = Decimal(int(value)) if isinstance(exponent, int) and exponent > 0 else value
    else:
        raise AmountError(f"an amount is a decimal string, not {type(value).__name__}")
    if positive and number <= 0:
        raise AmountError("a deposit amount must be above zero")
    return number
