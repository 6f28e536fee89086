"""Request and webhook signatures: every scheme and every setting of one, in one table.

What users read about it is docs/signatures.md. The default scheme, ``published``, is the string
to sign of the provider's public documentation::

    API-SIGNATURE = lowercase hex( HMAC-SHA256( secret, request_content + "&" + API-TIMESTAMP ) )

``request_content`` is the body exactly as sent; for a request without a body, its query
parameters ``name=value&name=value`` (sorted by name, or as sent); empty when there are none.
No method, no path. ``method-path-v1`` (named ``hmac-sha256-v1`` before) signs
``API-TIMESTAMP + METHOD + PATH_AND_QUERY + BODY`` instead.

What the provider leaves open (the hash, the encoding, the parameter order) are settings, not
code: `SETTINGS` holds one row per config key of `provider:` and `webhook:`, its choices (the
first is the default) and what each does.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from itertools import product
from typing import Any, NamedTuple

from worker.clock import now_ms

HEADER_KEY = "API-KEY"
HEADER_TIMESTAMP = "API-TIMESTAMP"
HEADER_SIGNATURE = "API-SIGNATURE"


class SignatureError(Exception):
    """A request or webhook failed authentication; the message says why (never a secret)."""


def _as_bytes(value: str | bytes) -> bytes:
    # surrogateescape: header bytes that are not UTF-8 (as aiohttp hands them over) compare as
    # the bytes they were, and fail the check instead of raising.
    return value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value


# --- the parts a scheme is made of ---------------------------------------------------------

ParamString = Callable[[str], str]
"""The parameter string signed for a query string (without the "?")."""


def _sorted_params(query: str) -> str:
    # Sorted by name; pairs with the same name keep their order. Names and values stay as they
    # travel (a value that needed escaping is signed escaped).
    pairs = [pair for pair in query.split("&") if pair]
    return "&".join(sorted(pairs, key=lambda pair: pair.partition("=")[0]))


def _as_sent_params(query: str) -> str:
    return query


Source = Callable[[str, str, str, bytes, ParamString], bytes]
"""The message a scheme signs: (timestamp, METHOD, path and query, body, parameter string)."""


def _published(ts: str, method: str, target: str, body: bytes, params: ParamString) -> bytes:
    content = body if body else _as_bytes(params(target.partition("?")[2]))
    return content + b"&" + _as_bytes(ts)


def _method_path(ts: str, method: str, target: str, body: bytes, params: ParamString) -> bytes:
    return _as_bytes(f"{ts}{method.upper()}{target}") + body


class Encoding(NamedTuple):
    """How a MAC is written in API-SIGNATURE, and whether comparing it ignores case."""

    encode: Callable[[bytes], str]
    case_blind: bool


SOURCES: dict[str, Source] = {"published": _published, "method-path-v1": _method_path}
HASHES: dict[str, Callable[[], Any]] = {
    "sha256": hashlib.sha256,
    "sha384": hashlib.sha384,
    "sha512": hashlib.sha512,
}
ENCODINGS: dict[str, Encoding] = {
    "hex": Encoding(bytes.hex, case_blind=True),
    "base64": Encoding(lambda mac: base64.b64encode(mac).decode("ascii"), case_blind=False),
}
PARAMS: dict[str, ParamString] = {"sorted": _sorted_params, "as-sent": _as_sent_params}


# --- the table -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """One config key of a scheme (under `provider:` and `webhook:`): its choices, the first
    being the default, and names still accepted for a choice (`aliases`)."""

    key: str
    attr: str  # the `Scheme` field it sets
    choices: tuple[str, ...]
    aliases: Mapping[str, str] = field(default_factory=dict)

    @property
    def default(self) -> str:
        """The choice when the key is absent."""
        return self.choices[0]

    def check(self, value: str) -> str:
        """The choice `value` names (an alias gives its new name); ValueError otherwise."""
        value = self.aliases.get(value, value)
        if value not in self.choices:
            raise ValueError(f"must be one of: {', '.join(self.choices)}")
        return value


# What each decides is in docs/signatures.md ("Settings"); tests/project checks that table.
SETTINGS: tuple[Setting, ...] = (
    # what is signed
    Setting("signature", "name", tuple(SOURCES), {"hmac-sha256-v1": "method-path-v1"}),
    # the hash of the HMAC
    Setting("signature_hash", "hash", tuple(HASHES)),
    # how API-SIGNATURE is written
    Setting("signature_encoding", "encoding", tuple(ENCODINGS)),
    # `published` without a body: the parameters sorted by name, or as sent
    Setting("signature_params", "params", tuple(PARAMS)),
)
SETTING = {s.key: s for s in SETTINGS}


@dataclass(frozen=True)
class Scheme:
    """One way of signing: what is signed and how the MAC is made and written."""

    name: str = SETTINGS[0].default
    hash: str = SETTINGS[1].default
    encoding: str = SETTINGS[2].default
    params: str = SETTINGS[3].default

    def __post_init__(self) -> None:
        for s in SETTINGS:
            object.__setattr__(self, s.attr, s.check(getattr(self, s.attr)))

    @classmethod
    def of(cls, section: object) -> Scheme:
        """The scheme of a config section holding the `SETTINGS` keys."""
        return cls(**{s.attr: getattr(section, s.key) for s in SETTINGS})

    @property
    def covers_path(self) -> bool:
        """True when the method and path are signed (so a rewritten path fails)."""
        return self.name == "method-path-v1"

    def applies(self, setting: Setting) -> bool:
        """Whether a setting changes what this scheme signs."""
        return setting.attr != "params" or self.name == "published"

    def values(self) -> dict[str, str]:
        """Config key -> value, for the settings that apply."""
        return {s.key: getattr(self, s.attr) for s in SETTINGS if self.applies(s)}

    def describe(self) -> str:
        """One line for people: `published (HMAC-SHA256, hex, parameters sorted)`."""
        parts = [f"HMAC-{self.hash.upper()}", self.encoding]
        if self.name == "published":
            parts.append(f"parameters {self.params.replace('-', ' ')}")
        return f"{self.name} ({', '.join(parts)})"

    def changes_from(self, other: Scheme) -> list[str]:
        """The `key: value` lines that turn `other` into this scheme."""
        mine = self.values()
        return [f"{k}: {v}" for k, v in mine.items() if getattr(other, SETTING[k].attr) != v]

    def message(self, timestamp: str | int, method: str, target: str, body: bytes) -> bytes:
        """The bytes signed for one request."""
        return SOURCES[self.name](str(timestamp), method, target, body, PARAMS[self.params])

    def sign(
        self, secret: str | bytes, timestamp: str | int, method: str, target: str, body: bytes
    ) -> str:
        """The API-SIGNATURE value for one request."""
        mac = hmac.new(
            _as_bytes(secret), self.message(timestamp, method, target, body), HASHES[self.hash]
        )
        return ENCODINGS[self.encoding].encode(mac.digest())

    def matches(self, expected: str, given: str) -> bool:
        """`given` equals `expected` (in constant time; hex ignoring case)."""
        if ENCODINGS[self.encoding].case_blind:
            given = given.lower()
        return hmac.compare_digest(expected.encode("ascii"), _as_bytes(given))


DEFAULT = Scheme()
METHOD_PATH_V1 = Scheme("method-path-v1")


def variants(configured: Scheme) -> list[Scheme]:
    """Every other known scheme, the fewest changed settings first (then in table order); a
    setting that does not apply to a scheme is left as configured."""
    found: list[Scheme] = []
    for values in product(*(s.choices for s in SETTINGS)):
        scheme = Scheme(*values)
        if scheme.name != "published":  # the parameter order is not part of it
            scheme = replace(scheme, params=configured.params)
        if scheme != configured and scheme not in found:
            found.append(scheme)
    found.sort(key=lambda s: len(s.changes_from(configured)))
    return found


# --- signing and checking ------------------------------------------------------------------


def sign(
    secret: str | bytes,
    timestamp: str | int,
    method: str,
    target: str,
    body: bytes = b"",
    scheme: Scheme = DEFAULT,
) -> str:
    """The API-SIGNATURE value for one request (`target`: the path and query as sent)."""
    return scheme.sign(secret, timestamp, method, target, body)


def signed_headers(
    api_key: str,
    secret: str | bytes,
    method: str,
    target: str,
    body: bytes = b"",
    *,
    scheme: Scheme = DEFAULT,
    timestamp_ms: int | None = None,
) -> dict[str, str]:
    """The three authentication headers for one request."""
    ts = str(now_ms() if timestamp_ms is None else timestamp_ms)
    return {
        HEADER_KEY: api_key,
        HEADER_TIMESTAMP: ts,
        HEADER_SIGNATURE: scheme.sign(secret, ts, method, target, body),
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
    target: str,
    body: bytes,
    *,
    secrets: Iterable[str | bytes],
    scheme: Scheme = DEFAULT,
) -> None:
    """Check API-SIGNATURE (after `verify_headers`); `SignatureError` when no secret verifies."""
    ts = headers.get(HEADER_TIMESTAMP) or ""
    given = headers.get(HEADER_SIGNATURE) or ""
    ok = False
    for secret in secrets:
        expected = scheme.sign(secret, ts, method, target, body)
        # Compare against every secret so timing does not reveal which one matched.
        ok = scheme.matches(expected, given) or ok
    if not ok:
        raise SignatureError("bad API-SIGNATURE")


def verifying_scheme(
    headers: Mapping[str, str],
    method: str,
    target: str,
    body: bytes,
    *,
    secrets: Iterable[str | bytes],
    configured: Scheme,
) -> Scheme | None:
    """The known scheme other than `configured` under which API-SIGNATURE verifies (the one
    fewest settings away), else None. Only a signature made with one of `secrets` verifies, so
    naming the scheme tells nothing to a sender without them."""
    keys = list(secrets)
    for scheme in variants(configured):
        try:
            verify_signature(headers, method, target, body, secrets=keys, scheme=scheme)
        except SignatureError:
            continue
        return scheme
    return None


def verify(
    headers: Mapping[str, str],
    method: str,
    target: str,
    body: bytes,
    *,
    api_key: str,
    secrets: Iterable[str | bytes],
    tolerance_s: float,
    scheme: Scheme = DEFAULT,
    now: int | None = None,
) -> None:
    """Check the three headers; raise `SignatureError` saying what was wrong.

    Any one of `secrets` verifying is enough (secret rotation). The timestamp must be within
    `tolerance_s` of now in either direction.
    """
    verify_headers(headers, api_key=api_key, tolerance_s=tolerance_s, now=now)
    verify_signature(headers, method, target, body, secrets=secrets, scheme=scheme)
