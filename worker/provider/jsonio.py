"""JSON in and out with exact decimals.

Numbers are parsed straight into `Decimal` (never through float) and every `Decimal` is written
back as a plain decimal string with its scale kept ("0.0000001", not "1E-7"; "125.50" stays), or,
with `dumpb(decimals_as_numbers=True)`, as a JSON number with those same digits.
"""

from __future__ import annotations

import json
import re
import secrets
from decimal import Decimal
from typing import Any

# Integers beyond this many characters are kept as `Decimal` (cheap at any length), so that the
# model refusing them names the field rather than the whole document failing to parse (Python's
# int() refuses more than 4300 digits).
_LONG_INT = 40


def _parse_int(text: str) -> int | Decimal:
    return int(text) if len(text) <= _LONG_INT else Decimal(text)


_DECODER = json.JSONDecoder(parse_float=Decimal, parse_int=_parse_int)


def loads(raw: bytes | str) -> Any:
    """Parse JSON; non-integer numbers become `Decimal`, integers stay `int` (longer than 40
    characters: `Decimal`). A number with an exponent stays as digits and exponent
    (`1e999999999` is small); amounts are bounded when read (`worker.provider.amounts`).

    Bytes are read as UTF-8 (as JSON on the wire is; RFC 8259), a UTF-8 BOM tolerated.
    """
    if not isinstance(raw, str):
        raw = raw.decode("utf-8-sig") if raw[:3] == b"\xef\xbb\xbf" else raw.decode()
    return _DECODER.decode(raw)


def decimal_str(value: Decimal) -> str:
    """A decimal as a plain string without exponent, keeping its scale ("125.50" stays)."""
    return format(value, "f")


def _default(obj: Any) -> Any:
    if isinstance(obj, Decimal):
        return decimal_str(obj)
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json", by_alias=True)
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def dumps(obj: Any, *, compact: bool = True) -> str:
    """Serialise to JSON; decimals become strings."""
    if compact:
        return json.dumps(obj, default=_default, separators=(",", ":"), ensure_ascii=False)
    return json.dumps(obj, default=_default, ensure_ascii=False, indent=2)


def dumpb(obj: Any, *, decimals_as_numbers: bool = False) -> bytes:
    """Serialise to UTF-8 JSON bytes (for request and webhook bodies).

    With `decimals_as_numbers`, every `Decimal` is written as a JSON number with its exact
    digits ("125.50" -> 125.50), as the provider's webhooks carry amounts.
    """
    if not decimals_as_numbers:
        return dumps(obj).encode()
    text = json.dumps(obj, default=_number_marker, separators=(",", ":"), ensure_ascii=False)
    return _MARKED.sub(r"\1", text).encode()


# A Decimal goes through the encoder as a marked string, then loses its quotes and marker. The
# marker holds a NUL (always escaped in JSON text) and a random part of this process: a real
# string cannot look like it by chance.
_NONCE = secrets.token_hex(8)
_MARKER = f"\x00{_NONCE}:"
_MARKED = re.compile(rf'"\\u0000{_NONCE}:(-?[0-9]+(?:\.[0-9]+)?)"')


def _number_marker(obj: Any) -> Any:
    if isinstance(obj, Decimal) and obj.is_finite():
        return _MARKER + decimal_str(obj)
    return _default(obj)
