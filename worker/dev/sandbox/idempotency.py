"""Writes run once per Idempotency-Key: the signed provider API and the hosted Travel Rule page
share this, so a key means the same thing whichever door a submission came through.

The first successful answer is stored with a fingerprint of the request (method, path and the
canonical body); the same key with the same request answers it again, with another request
10000105. A refused write stores nothing: the caller fixes the request and sends it again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any

from worker.dev.sandbox.envelopes import ok_envelope
from worker.dev.sandbox.handle import Sandbox
from worker.dev.sandbox.state import BAD_VALUE, DUPLICATE
from worker.errors import WalletCodeError
from worker.provider import jsonio
from worker.provider.payer import content_hash


def fingerprint(method: str, path: str, raw: bytes) -> str:
    """What makes two requests "the same request" for one key."""
    try:
        parsed = jsonio.loads(raw) if raw else {}
        body_hash = (
            content_hash(parsed) if isinstance(parsed, dict) else hashlib.sha256(raw).hexdigest()
        )
    except ValueError:
        body_hash = hashlib.sha256(raw).hexdigest()
    return body_fingerprint(method, path, body_hash)


def body_fingerprint(method: str, path: str, body_hash: str) -> str:
    """The fingerprint of a request whose body is already a canonical hash."""
    return hashlib.sha256(f"{method} {path}\n{body_hash}".encode()).hexdigest()


def dict_fingerprint(method: str, path: str, body: Mapping[str, Any]) -> str:
    """The fingerprint of a request whose JSON body is `body`."""
    return body_fingerprint(method, path, content_hash(body))


def body_object(raw: bytes) -> dict[str, Any]:
    """The JSON object of a request body, or 10000103."""
    try:
        body = jsonio.loads(raw) if raw else {}
    except ValueError:
        raise WalletCodeError(BAD_VALUE, "body is not valid JSON") from None
    if not isinstance(body, dict):
        raise WalletCodeError(BAD_VALUE, "body must be a JSON object")
    return body


def run_once(
    sandbox: Sandbox, key: str, print_: str, op: Callable[[], Any]
) -> tuple[dict[str, Any], bool]:
    """The wallet envelope of `op()` run at most once for `key`, and whether this call ran it
    (False: the stored answer of an earlier call with the same request)."""
    stored = sandbox.idempotency.get(key)
    if stored is not None:
        if stored["fingerprint"] != print_:
            raise WalletCodeError(
                DUPLICATE, "duplicate request: Idempotency-Key already used for a different request"
            )
        return stored["answer"], False
    answer = ok_envelope(op())
    sandbox.idempotency[key] = {"fingerprint": print_, "answer": answer}
    sandbox.persist()
    return answer, True
