"""Request and webhook signatures (docs/configuration.md)."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from worker.provider.signing import (
    ALGORITHMS,
    DEFAULT_ALGORITHM,
    HEADER_KEY,
    HEADER_SIGNATURE,
    HEADER_TIMESTAMP,
    SignatureError,
    sign,
    signed_headers,
    verify,
)

SECRET = "s3cret"
TS = 1_700_000_000_000
PATH = "/webhooks/provider"
BODY = b'{"a":1}'
# HMAC-SHA256("s3cret", '1700000000000POST/webhooks/provider{"a":1}'), computed once by hand.
VECTOR = "511ab2564790cd9bbe3f131f584dea68094cfc00c86a4b044cb2267561f355f6"


def headers(
    *, key: str = "key-1", secret: str = SECRET, ts: int = TS, body: bytes = BODY
) -> dict[str, str]:
    """Signed headers for a POST of `body` to PATH."""
    return signed_headers(key, secret, "POST", PATH, body, timestamp_ms=ts)


def check(
    hdrs: dict[str, str],
    *,
    body: bytes = BODY,
    secrets: tuple[str, ...] = (SECRET,),
    now: int = TS,
    path: str = PATH,
) -> None:
    """Verify a POST to `path` with 300 s tolerance at time `now`."""
    verify(hdrs, "POST", path, body, api_key="key-1", secrets=secrets, tolerance_s=300, now=now)


def test_known_vector() -> None:
    """The default scheme is lowercase hex HMAC-SHA256 of timestamp+METHOD+path+body."""
    by_hand = hmac.new(
        b"s3cret", b'1700000000000POST/webhooks/provider{"a":1}', hashlib.sha256
    ).hexdigest()
    assert by_hand == VECTOR
    assert sign(SECRET, "1700000000000", "POST", PATH, BODY) == VECTOR
    assert sign(SECRET.encode(), TS, "post", PATH, BODY) == VECTOR


def test_get_with_query_signs_empty_body() -> None:
    """A GET signs the path with its query and an empty body."""
    target = "/v1/wallet/history?whiteListStatus=init&pageNum=1"
    expected = "b80774acba6e9c07e33ddb4d1845228570912c2d291af4ca99116c6f40f3b867"
    assert sign(SECRET, TS, "GET", target) == expected
    assert sign(SECRET, TS, "GET", "/v1/wallet/history") != expected


def test_signed_headers() -> None:
    """signed_headers gives API-KEY, API-TIMESTAMP (ms) and API-SIGNATURE."""
    assert headers() == {HEADER_KEY: "key-1", HEADER_TIMESTAMP: str(TS), HEADER_SIGNATURE: VECTOR}


def test_signed_headers_default_timestamp_is_now_ms() -> None:
    """Without a timestamp, signed_headers uses the current time in milliseconds."""
    hdrs = signed_headers("key-1", SECRET, "POST", PATH, BODY)
    verify(hdrs, "POST", PATH, BODY, api_key="key-1", secrets=[SECRET], tolerance_s=5)
    assert len(hdrs[HEADER_TIMESTAMP]) == 13


def test_verify_accepts_valid() -> None:
    """A correctly signed request verifies; upper-case hex is accepted too."""
    check(headers())
    hdrs = headers()
    hdrs[HEADER_SIGNATURE] = hdrs[HEADER_SIGNATURE].upper()
    check(hdrs)


def test_tampered_body_refused() -> None:
    """One changed byte of the body fails verification."""
    with pytest.raises(SignatureError, match="bad API-SIGNATURE"):
        check(headers(), body=b'{"a":2}')


def test_other_path_refused() -> None:
    """A signature made for another path does not verify."""
    with pytest.raises(SignatureError, match="bad API-SIGNATURE"):
        check(headers(), path="/webhooks/other")


def test_wrong_key_refused() -> None:
    """An API-KEY other than the expected one is refused."""
    with pytest.raises(SignatureError, match="unknown API-KEY"):
        check(headers(key="key-2"))


def test_wrong_secret_refused() -> None:
    """A signature made with another secret is refused."""
    with pytest.raises(SignatureError, match="bad API-SIGNATURE"):
        check(headers(secret="other"))


@pytest.mark.parametrize("missing", [HEADER_KEY, HEADER_TIMESTAMP, HEADER_SIGNATURE])
def test_missing_header_refused(missing: str) -> None:
    """Each of the three headers is required and named when missing."""
    hdrs = headers()
    del hdrs[missing]
    with pytest.raises(SignatureError, match=f"missing header {missing}"):
        check(hdrs)


def test_non_numeric_timestamp_refused() -> None:
    """API-TIMESTAMP must be milliseconds since the epoch."""
    hdrs = headers()
    hdrs[HEADER_TIMESTAMP] = "2026-01-01T00:00:00Z"
    with pytest.raises(SignatureError, match="milliseconds"):
        check(hdrs)


def test_stale_timestamp_refused() -> None:
    """A timestamp older than the tolerance is refused as too old."""
    with pytest.raises(SignatureError, match="too old"):
        check(headers(), now=TS + 301_000)


def test_future_timestamp_refused() -> None:
    """A timestamp further ahead than the tolerance is refused as in the future."""
    with pytest.raises(SignatureError, match="in the future"):
        check(headers(), now=TS - 301_000)


@pytest.mark.parametrize("skew_ms", [-300_000, 0, 300_000])
def test_timestamp_within_tolerance(skew_ms: int) -> None:
    """Timestamps up to the tolerance either way are accepted."""
    check(headers(), now=TS + skew_ms)


def test_rotation_any_secret_verifies() -> None:
    """During rotation, a signature by the second secret verifies."""
    check(headers(secret="new-secret"), secrets=("old-secret", "new-secret"))
    with pytest.raises(SignatureError):
        check(headers(secret="third"), secrets=("old-secret", "new-secret"))


def test_secret_never_in_message() -> None:
    """The refusal names the problem, never the secret or the expected signature."""
    with pytest.raises(SignatureError) as info:
        check(headers(secret="other"))
    assert SECRET not in str(info.value)
    assert VECTOR not in str(info.value)


def test_unknown_algorithm() -> None:
    """An unknown algorithm name is a ValueError naming the known ones."""
    assert DEFAULT_ALGORITHM in ALGORITHMS
    with pytest.raises(ValueError, match=r"unknown signature algorithm 'md5'.*hmac-sha256-v1"):
        sign(SECRET, TS, "POST", PATH, BODY, algorithm="md5")
    with pytest.raises(ValueError, match="unknown signature algorithm"):
        verify(
            headers(),
            "POST",
            PATH,
            BODY,
            api_key="key-1",
            secrets=[SECRET],
            tolerance_s=300,
            now=TS,
            algorithm="md5",
        )
