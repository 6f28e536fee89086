"""Request and webhook signatures: known answers for every scheme and setting
(docs/signatures.md), verification, and naming the scheme a refused signature verifies with."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
from collections.abc import Callable

import pytest

from worker.provider.signing import (
    DEFAULT,
    HEADER_KEY,
    HEADER_SIGNATURE,
    HEADER_TIMESTAMP,
    METHOD_PATH_V1,
    SETTINGS,
    Scheme,
    SignatureError,
    sign,
    signed_headers,
    variants,
    verify,
    verifying_scheme,
)

SECRET = "s3cret"
TS = 1_700_000_000_000
PATH = "/webhooks/provider"
BODY = b'{"fiatAmt":20,"fiatCurrency":"USD"}'  # the provider's documented example body
GET = "/v1/wallet/list?walletId=1002&pageNum=1"  # parameters not in name order
# HMAC-SHA256("s3cret", '{"fiatAmt":20,"fiatCurrency":"USD"}&1700000000000'), lowercase hex.
VECTOR = "0ba23885ab89849c68f34b5c06488dde969beafc7fb7aea3571bb9592e49ba80"


def by_hand(message: bytes, digest: str = "sha256") -> bytes:
    """The HMAC of `message` under SECRET, straight from the standard library."""
    return hmac.new(SECRET.encode(), message, getattr(hashlib, digest)).digest()


def headers(
    *,
    key: str = "key-1",
    secret: str = SECRET,
    ts: int = TS,
    body: bytes = BODY,
    target: str = PATH,
    scheme: Scheme = DEFAULT,
) -> dict[str, str]:
    """Signed headers for a POST of `body` to `target`."""
    return signed_headers(key, secret, "POST", target, body, scheme=scheme, timestamp_ms=ts)


def check(
    hdrs: dict[str, str],
    *,
    body: bytes = BODY,
    secrets: tuple[str, ...] = (SECRET,),
    now: int = TS,
    path: str = PATH,
    scheme: Scheme = DEFAULT,
) -> None:
    """Verify a POST to `path` with 300 s tolerance at time `now`."""
    verify(
        hdrs,
        "POST",
        path,
        body,
        api_key="key-1",
        secrets=secrets,
        tolerance_s=300,
        now=now,
        scheme=scheme,
    )


# --- known answers ---------------------------------------------------------------------------


def test_default_is_the_published_formula() -> None:
    """The default signs the body, "&" and the timestamp: lowercase hex HMAC-SHA256; the
    method and path are not part of it."""
    assert by_hand(BODY + b"&1700000000000").hex() == VECTOR
    assert Scheme("published", "sha256", "hex", "sorted") == DEFAULT
    assert sign(SECRET, "1700000000000", "POST", PATH, BODY) == VECTOR
    assert sign(SECRET.encode(), TS, "put", "/any/other/path?x=1", BODY) == VECTOR


@pytest.mark.parametrize(
    ("scheme", "target", "body", "message", "digest", "encode"),
    [
        # a body: the body as sent
        (DEFAULT, PATH, BODY, BODY + b"&1700000000000", "sha256", bytes.hex),
        (
            Scheme(encoding="base64"),
            PATH,
            BODY,
            BODY + b"&1700000000000",
            "sha256",
            base64.b64encode,
        ),
        (Scheme(hash="sha384"), PATH, BODY, BODY + b"&1700000000000", "sha384", bytes.hex),
        (Scheme(hash="sha512"), PATH, BODY, BODY + b"&1700000000000", "sha512", bytes.hex),
        # no body: the parameters, sorted by name or as sent
        (DEFAULT, GET, b"", b"pageNum=1&walletId=1002&1700000000000", "sha256", bytes.hex),
        (
            Scheme(params="as-sent"),
            GET,
            b"",
            b"walletId=1002&pageNum=1&1700000000000",
            "sha256",
            bytes.hex,
        ),
        # neither: "&" and the timestamp
        (DEFAULT, "/v1/wallet/options", b"", b"&1700000000000", "sha256", bytes.hex),
        # the scheme depositd used before: timestamp, METHOD, path and query, body
        (
            METHOD_PATH_V1,
            GET,
            BODY,
            b"1700000000000POST" + GET.encode() + BODY,
            "sha256",
            bytes.hex,
        ),
    ],
    ids=["hex", "base64", "sha384", "sha512", "sorted", "as-sent", "empty", "method-path-v1"],
)
def test_known_answers(
    scheme: Scheme,
    target: str,
    body: bytes,
    message: bytes,
    digest: str,
    encode: Callable[[bytes], bytes | str],
) -> None:
    """Each scheme and setting signs the message the docs give it, and its signature is the
    standard library's HMAC of that message, written as the setting says."""
    method = "POST" if body else "GET"
    assert scheme.message(TS, method, target, body) == message
    written = encode(by_hand(message, digest))
    expected = written.decode() if isinstance(written, bytes) else written
    assert sign(SECRET, TS, method, target, body, scheme) == expected


def test_known_answer_literals() -> None:
    """Fixed values, so that a change of the standard library's reading would show too."""
    assert sign(SECRET, TS, "POST", PATH, BODY, Scheme(encoding="base64")) == (
        "C6I4hauJhJxo80tcBkiN3pab6vx/t66jVxu5WS5JuoA="
    )
    assert sign(SECRET, TS, "GET", GET) == (
        "2785b86557a11481ef8fcbfc8ea26b73f65ccf2b3b881f41163fe45dae93de33"
    )
    assert sign(SECRET, TS, "GET", "/v1/wallet/options") == (
        "54eb782c37bcb6f6ae4b31bfade20fb04f181104c82b32eaef7bdc56bf19243e"
    )


def test_method_path_v1_keeps_the_old_vector() -> None:
    """method-path-v1 is the scheme called hmac-sha256-v1 before, byte for byte."""
    old = "511ab2564790cd9bbe3f131f584dea68094cfc00c86a4b044cb2267561f355f6"
    assert sign(SECRET, TS, "post", PATH, b'{"a":1}', METHOD_PATH_V1) == old
    assert Scheme("hmac-sha256-v1") == METHOD_PATH_V1


def test_published_ignores_method_and_path_method_path_v1_does_not() -> None:
    """A published signature is the same for any path; method-path-v1's changes with it."""
    assert sign(SECRET, TS, "POST", "/a", BODY) == sign(SECRET, TS, "PUT", "/b", BODY)
    one = sign(SECRET, TS, "POST", "/a", BODY, METHOD_PATH_V1)
    assert one != sign(SECRET, TS, "POST", "/b", BODY, METHOD_PATH_V1)


def test_parameter_string_keeps_values_as_they_travel() -> None:
    """Sorted: by name, a repeated name keeping its order, escaped values signed escaped; as
    sent: the query string untouched."""
    target = "/p?b=2&a=x%3Ay&b=1"
    assert DEFAULT.message(TS, "GET", target, b"") == b"a=x%3Ay&b=2&b=1&1700000000000"
    as_sent = Scheme(params="as-sent").message(TS, "GET", target, b"")
    assert as_sent == b"b=2&a=x%3Ay&b=1&1700000000000"


def test_settings_table_matches_the_scheme() -> None:
    """One setting per Scheme field, in order; the first choice of each is the default."""
    assert [s.attr for s in SETTINGS] == [f.name for f in dataclasses.fields(Scheme)]
    assert [s.default for s in SETTINGS] == ["published", "sha256", "hex", "sorted"]
    assert [s.key for s in SETTINGS] == [
        "signature",
        "signature_hash",
        "signature_encoding",
        "signature_params",
    ]


def test_unknown_choice_names_the_known_ones() -> None:
    """An unknown scheme or setting is a ValueError listing the choices."""
    with pytest.raises(ValueError, match="must be one of: published, method-path-v1"):
        Scheme("md5")
    with pytest.raises(ValueError, match="must be one of: hex, base64"):
        Scheme(encoding="base32")


# --- headers and verification ----------------------------------------------------------------


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


def test_base64_compares_as_written() -> None:
    """Base64 is compared as written: a letter in the other case fails."""
    scheme = Scheme(encoding="base64")
    hdrs = headers(scheme=scheme)
    check(hdrs, scheme=scheme)
    hdrs[HEADER_SIGNATURE] = hdrs[HEADER_SIGNATURE].swapcase()
    with pytest.raises(SignatureError, match="bad API-SIGNATURE"):
        check(hdrs, scheme=scheme)


def test_tampered_body_refused() -> None:
    """One changed byte of the body fails verification."""
    with pytest.raises(SignatureError, match="bad API-SIGNATURE"):
        check(headers(), body=BODY.replace(b"20", b"21"))


def test_other_timestamp_refused() -> None:
    """The timestamp is signed: the same signature with another API-TIMESTAMP fails."""
    hdrs = headers()
    hdrs[HEADER_TIMESTAMP] = str(TS + 1)
    with pytest.raises(SignatureError, match="bad API-SIGNATURE"):
        check(hdrs)


def test_other_path_refused_under_method_path_v1() -> None:
    """Under method-path-v1 a signature made for another path does not verify; under the
    published scheme the path is not signed."""
    with pytest.raises(SignatureError, match="bad API-SIGNATURE"):
        check(headers(scheme=METHOD_PATH_V1), path="/webhooks/other", scheme=METHOD_PATH_V1)
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


# --- which other scheme verifies -------------------------------------------------------------


def test_variants_fewest_changes_first() -> None:
    """Every other known scheme once, one changed setting before two; the parameter order is
    not a variant of method-path-v1 (it does not sign it)."""
    found = variants(DEFAULT)
    assert DEFAULT not in found
    assert len(found) == len(set(found))
    changes = [len(s.changes_from(DEFAULT)) for s in found]
    assert changes == sorted(changes)
    assert changes[0] == 1
    assert METHOD_PATH_V1 in found
    assert {s.params for s in found if s.name == "method-path-v1"} == {"sorted"}
    # 3 hashes x 2 encodings x (2 parameter orders + method-path-v1), less the default
    assert len(found) == 3 * 2 * 3 - 1


@pytest.mark.parametrize(
    ("signed_with", "target", "body", "named"),
    [
        (METHOD_PATH_V1, PATH, BODY, ["signature: method-path-v1"]),
        (Scheme(encoding="base64"), PATH, BODY, ["signature_encoding: base64"]),
        (Scheme(hash="sha512"), PATH, BODY, ["signature_hash: sha512"]),
        (Scheme(params="as-sent"), "/p?b=1&a=2", b"", ["signature_params: as-sent"]),
        (
            Scheme("method-path-v1", encoding="base64"),
            PATH,
            BODY,
            ["signature: method-path-v1", "signature_encoding: base64"],
        ),
    ],
    ids=["method-path-v1", "base64", "sha512", "as-sent", "two-settings"],
)
def test_verifying_scheme_names_the_one_that_verifies(
    signed_with: Scheme, target: str, body: bytes, named: list[str]
) -> None:
    """A signature refused under the default is matched to the scheme and settings it was made
    with, and those are the config lines that would accept it."""
    hdrs = headers(target=target, body=body, scheme=signed_with)
    with pytest.raises(SignatureError):
        check(hdrs, path=target, body=body)
    found = verifying_scheme(
        hdrs, "POST", target, body, secrets=["other", SECRET], configured=DEFAULT
    )
    assert found is not None
    assert found.changes_from(DEFAULT) == named


def test_verifying_scheme_needs_a_secret() -> None:
    """A signature made with an unknown secret verifies under no scheme: nothing is named."""
    hdrs = headers(secret="other", scheme=METHOD_PATH_V1)
    assert verifying_scheme(hdrs, "POST", PATH, BODY, secrets=[SECRET], configured=DEFAULT) is None


def test_describe() -> None:
    """The one-line description `check` prints."""
    assert DEFAULT.describe() == "published (HMAC-SHA256, hex, parameters sorted)"
    assert METHOD_PATH_V1.describe() == "method-path-v1 (HMAC-SHA256, hex)"
