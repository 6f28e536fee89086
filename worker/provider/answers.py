"""Reading the provider's answers: the three envelope forms into data or typed errors.

A business failure under HTTP 200 is an error; HTTP 401 or an auth message is
`ProviderAuthError`; 5xx (and 408/429) without a business body is `ProviderUnavailable`;
10000104 is `ProviderRetryLater`; anything unreadable is `ProviderProtocolError`.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import ValidationError

from worker.errors import (
    ProviderAuthError,
    ProviderBusinessError,
    ProviderError,
    ProviderProtocolError,
    ProviderRateLimited,
    ProviderRetryLater,
    ProviderUnavailable,
)
from worker.provider import jsonio
from worker.provider.codes import RetryCategory, WalletCode, categorize
from worker.provider.models import EmailEnvelope, PartnerEnvelope, WalletEnvelope

# Statuses that say "not now" rather than "no": retried like a timeout.
_RETRY_HTTP = frozenset({408, 429})


class Envelope(str, Enum):
    """The interface's three response forms."""

    WALLET = "wallet"
    EMAIL = "email"
    PARTNER = "partner"


def first_problem(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(root)"
    return f"{where}: {err['msg']}"


def read_answer(endpoint: str, http_status: int, payload: bytes, envelope: Envelope) -> Any:
    """The `data` of a successful answer, or the typed error the answer means."""
    try:
        body = jsonio.loads(payload) if payload else None
    except ValueError:
        body = None
    env_model = _ENVELOPES[envelope]
    env: WalletEnvelope | EmailEnvelope | PartnerEnvelope | None = None
    if isinstance(body, dict):
        if isinstance(body.get("code"), int):
            # Numeric codes happen; the wallet codes are compared as strings.
            body["code"] = str(body["code"])
        try:
            env = env_model.model_validate(body)
        except ValidationError:
            env = None
    code, msg, trace_id = _failure_fields(env, body)
    common: dict[str, Any] = {"code": code, "trace_id": trace_id, "http_status": http_status}
    common["endpoint"] = endpoint

    if http_status == 401:
        raise ProviderAuthError(msg or "unauthorized (HTTP 401)", **common)
    if env is None:
        if http_status >= 500 or http_status in _RETRY_HTTP:
            raise ProviderUnavailable(f"HTTP {http_status}", **common)
        what = "no JSON" if body is None else "not a known envelope"
        raise ProviderProtocolError(f"unreadable answer (HTTP {http_status}, {what})", **common)
    if 200 <= http_status < 300 and _succeeded(env):
        return None if isinstance(env, EmailEnvelope) else env.data
    if http_status >= 300 and not code and (http_status >= 500 or http_status in _RETRY_HTTP):
        # A gateway or crash page that happens to be JSON: no business answer in it.
        raise ProviderUnavailable(msg or f"HTTP {http_status}", **common)
    env_status = getattr(env, "status", None)
    if env_status == 401 or (code not in _WALLET_CODES and categorize(msg) is RetryCategory.AUTH):
        raise ProviderAuthError(msg or "unauthorized", **common)
    if code == WalletCode.CANNOT_SUBMIT_NOW.value:
        raise ProviderRetryLater(msg or "cannot submit right now", **common)
    raise ProviderBusinessError(msg or f"failed (HTTP {http_status})", **common)


# Words by which a 5xx answer names a rate limit (lower case).
_RATE_LIMIT_WORDS = ("rate limit", "ratelimit", "rate-limit", "too many requests", "throttl")


def rate_limited(
    exc: ProviderError, http_status: int, retry_after: float | None
) -> ProviderRateLimited | None:
    """The rate-limit error an answer means (429, or a 5xx whose message names a rate limit),
    or None when it is no rate limit."""
    text = f"{exc.msg} {exc.code or ''}".lower()
    named = any(word in text for word in _RATE_LIMIT_WORDS)
    if http_status != 429 and not (http_status >= 500 and named):
        return None
    return ProviderRateLimited(
        exc.msg if named or http_status != 429 else f"rate limited (HTTP 429): {exc.msg}",
        retry_after=retry_after,
        code=exc.code,
        trace_id=exc.trace_id,
        http_status=http_status,
        endpoint=exc.endpoint,
    )


_WALLET_CODES = frozenset(c.value for c in WalletCode)
_ENVELOPES: dict[Envelope, type[WalletEnvelope | EmailEnvelope | PartnerEnvelope]] = {
    Envelope.WALLET: WalletEnvelope,
    Envelope.EMAIL: EmailEnvelope,
    Envelope.PARTNER: PartnerEnvelope,
}


def _succeeded(env: WalletEnvelope | EmailEnvelope | PartnerEnvelope) -> bool:
    if isinstance(env, WalletEnvelope):
        return env.status == 200 and env.success is not False
    if isinstance(env, EmailEnvelope):
        return env.status == 200
    return env.code == "SUCCESS"


def _failure_fields(
    env: WalletEnvelope | EmailEnvelope | PartnerEnvelope | None, body: Any
) -> tuple[str | None, str | None, str | None]:
    """code, message and trace id of an answer, from whichever envelope keys it used."""
    if env is not None:
        if isinstance(env, WalletEnvelope):
            msg = env.msg if env.msg is not None else (env.model_extra or {}).get("message")
            return env.code, None if msg is None else str(msg), env.traceId
        if isinstance(env, EmailEnvelope):
            extra = env.model_extra or {}
            code = extra.get("code")
            return (None if code is None else str(code)), env.message, env.traceId
        return env.code, env.message, env.trace_id
    if not isinstance(body, dict):
        return None, None, None
    code = body.get("code")
    msg = body.get("msg", body.get("message"))
    trace = body.get("traceId", body.get("trace_id"))
    return (
        None if code is None else str(code),
        None if msg is None else str(msg),
        None if trace is None else str(trace),
    )
