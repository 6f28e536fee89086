"""Request and webhook signatures (docs/configuration.md).

The default scheme, ``hmac-sha256-v1``::

    API-SIGNATURE = hex(HMAC-SHA256(secret, API-TIMESTAMP + METHOD + PATH_AND_QUERY + BODY))

(lowercase hex.)

Another provider algorithm is one more function in `ALGORITHMS`, chosen by name in config.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Iterable, Mapping

from worker.clock import now_ms

DEFAULT_ALGORITHM = "hmac-sha256-v1"

HEADER_KEY = "API-KEY"
HEADER_TIMESTAMP = "API-TIMESTAMP"
HEADER_SIGNATURE = "API-SIGNATURE"

Signer = Callable[[bytes, bytes], str]


def _hmac_sha256_v1(secret: bytes, message: bytes) -> str:
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


ALGORITHMS: dict[str, Signer] = {DEFAULT_ALGORITHM: _hmac_sha256_v1}


class SignatureError(Exception):
    """A request or webhook failed authentication; the message says why (never a secret)."""


def _as_bytes(value: str | bytes) -> bytes:
    # surrogateescape: header bytes that are not UTF-8 (as aiohttp hands them over) compare as
    # the bytes they were, and fail the check instead of raising.
    return value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value


def signer(algorithm: str) -> Signer:
    """The signing function for an algorithm name; ValueError names the known ones."""
    try:
        return ALGORITHMS[algorithm]
    except KeyError:
        known = ", ".join(sorted(ALGORITHMS))
        raise ValueError(f"unknown signature algorithm {algorithm!r} (known: {known})") from None


def sign(
    secret: str | bytes,
    timestamp: str | int,
    method: str,
    path_and_query: str,
    body: bytes = b"",
    algorithm: str = DEFAULT_ALGORITHM,
) -> str:
    """The API-SIGNATURE value for one request."""
    message = _as_bytes(f"{timestamp}{method.upper()}{path_and_query}") + body
    return signer(algorithm)(_as_bytes(secret), message)


def signed_headers(
    api_key: str,
    secret: str | bytes,
    method: str,
    path_and_query: str,
    body: bytes = b"",
    *,
    algorithm: str = DEFAULT_ALGORITHM,
    timestamp_ms: int | None = None,
) -> dict[str, str]:
    """The three authentication headers for one request."""
    ts = str(now_ms() if timestamp_ms is None else timestamp_ms)
    return {
        HEADER_KEY: api_key,
        HEADER_TIMESTAMP: ts,
        HEADER_SIGNATURE: sign(secret, ts, method, path_and_query, body, algorithm),
    }


def verify_headers(
    headers: Mapping[str, str], *, api_key: str, tolerance_s: float, now: int | None = None
) -> None:
    """The checks that need no body: the three headers present, the API-KEY, and the
    timestamp within `tolerance_s` of now in either direction; `SignatureError` says which."""
    key = headers.get(HEADER_KEY)
    ts = headers.get(HEADER_TIMESTAMP)
    given = headers.get(HEADER_SIGNATURE)
    missing = [
        name
        for name, value in ((HEADER_KEY, key), (HEADER_TIMESTAMP, ts), (HEADER_SIGNATURE, given))
        if not value
    ]
    if missing:
        raise SignatureError(f"missing header {', '.join(missing)}")
    assert key is not None and ts is not None
    if not hmac.compare_digest(_as_bytes(key), _as_bytes(api_key)):
        raise SignatureError("unknown API-KEY")
    try:
        ts_ms = int(ts)
    except ValueError:
        raise SignatureError("API-TIMESTAMP is not milliseconds since the epoch") from None
    current = now_ms() if now is None else now
    skew_s = (current - ts_ms) / 1000
    if skew_s > tolerance_s:
        raise SignatureError(f"API-TIMESTAMP too old ({skew_s:.0f}s, tolerance {tolerance_s:g}s)")
    if -skew_s > tolerance_s:
        raise SignatureError(
            f"API-TIMESTAMP in the future ({-skew_s:.0f}s, tolerance {tolerance_s:g}s)"
        )


def verify_signature(
    headers: Mapping[str, str],
    method: str,
    path_and_query: str,
    body: bytes,
    *,
    secrets: Iterable[str | bytes],
    algorithm: str = DEFAULT_ALGORITHM,
) -> None:
    """Check API-SIGNATURE (after `verify_headers`); `SignatureError` when no secret verifies."""
    ts = headers.get(HEADER_TIMESTAMP) or ""
    given_b = _as_bytes((headers.get(HEADER_SIGNATURE) or "").lower())
    ok = False
    for secret in secrets:
        expected = sign(secret, ts, method, path_and_query, body, algorithm).encode()
        # Compare against every secret so timing does not reveal which one matched.
        ok = hmac.compare_digest(expected, given_b) or ok
    if not ok:
        raise SignatureError("bad API-SIGNATURE")


def verify(
    headers: Mapping[str, str],
    method: str,
    path_and_query: str,
    body: bytes,
    *,
    api_key: str,
    secrets: Iterable[str | bytes],
    tolerance_s: float,
    algorithm: str = DEFAULT_ALGORITHM,
    now: int | None = None,
) -> None:
    """Check the three headers; raise `SignatureError` saying what was wrong.

    Any one of `secrets` verifying is enough (secret rotation). The timestamp must be within
    `tolerance_s` of now in either direction.
    """
    verify_headers(headers, api_key=api_key, tolerance_s=tolerance_s, now=now)
    verify_signature(headers, method, path_and_query, body, secrets=secrets, algorithm=algorithm)
