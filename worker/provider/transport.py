"""`Transport`: one call to the provider's HTTP interface over aiohttp, signed, retried and read.

Every request is signed (`worker.provider.signing`, docs/signatures.md) over the exact body bytes
or, without a body, the query string this module builds itself, parameters sorted by name.
Answers are read with exact decimals and turned into typed errors from `worker.errors`:

- `ProviderBusinessError` (`ProviderRetryLater` for 10000104): the provider refused the call;
  never retried here, the caller decides (docs/concepts.md).
- `ProviderAuthError`: HTTP 401 or a message about signature, unauthorized or timestamp; not
  retried at once, the caller backs off (a clock or key problem does not fix itself in 50 ms).
- `ProviderUnavailable`: timeout, connection or transport error (an answer aiohttp cannot
  parse), 5xx (or 408/429) without a business body; retried here with exponential back-off,
  jitter, a fresh signature and the SAME Idempotency-Key.
- `ProviderProtocolError`: an answer that is no known envelope, or data of the wrong shape. For
  a write the outcome is unknown: the caller retries later with the same key.

The calls themselves, one method per endpoint, are in the modules of the interface's areas
(`deposit_calls`, `wallet_calls`, `stable_calls`, `partner_calls`), each a `Transport`;
`worker.provider.client.ProviderClient` is all of them.

Which calls are a poll's, and so wait for the request budget, is said by the client they are made
through: `for_polls()` gives the polls' view of a client (docs/polling.md).
"""

from __future__ import annotations

import asyncio
import copy
import random
from collections.abc import Callable, Mapping
from decimal import Decimal
from enum import Enum
from typing import Any, Self, TypeVar
from urllib.parse import quote, urlencode, urlsplit

import aiohttp
from pydantic import BaseModel, ValidationError
from yarl import URL

from worker.errors import (
    ProviderAuthError,
    ProviderBusinessError,
    ProviderError,
    ProviderProtocolError,
    ProviderRateLimited,
    ProviderRequestRefused,
    ProviderUnavailable,
)
from worker.logs import get_logger
from worker.provider import jsonio
from worker.provider.answers import Envelope, first_problem, rate_limited, read_answer
from worker.provider.budget import RequestBudget, parse_retry_after
from worker.provider.signing import DEFAULT, Scheme, signed_headers
from worker.urls import host_port

__all__ = ["OUTCOMES", "Envelope", "OnCall", "Transport", "build_target", "segment"]

log = get_logger(__name__)

OnCall = Callable[[str, str], None]
"""`on_call(endpoint_name, outcome)`, called after every attempt (for metrics)."""

DEFAULT_MAX_ANSWER_BYTES = 16 * 1024 * 1024
"""The largest answer body read (`provider.max_answer_bytes`); a bigger one is a protocol error."""

OUTCOMES = ("ok", "business_error", "auth_error", "unavailable", "rate_limited", "protocol_error")

IDEMPOTENCY_HEADER = "Idempotency-Key"
JSON = "application/json"

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


def _as_is(data: Any) -> Any:
    """An answer's data as given (operations whose payload the interface does not show)."""
    return data


def _outcome(exc: ProviderError) -> str:
    if isinstance(exc, ProviderAuthError):
        return "auth_error"
    if isinstance(exc, ProviderRateLimited):
        return "rate_limited"
    if isinstance(exc, ProviderUnavailable):
        return "unavailable"
    if isinstance(exc, ProviderBusinessError):
        return "business_error"
    return "protocol_error"


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, BaseModel):
        raise TypeError("a model is not a query value")
    return jsonio.decimal_str(value) if isinstance(value, Decimal) else str(value)


def build_target(path: str, query: Mapping[str, Any] | None = None) -> str:
    """The request target `path?query` as sent and signed; None values are left out.

    The parameters go sorted by name, so the parameter string the provider signs reads the same
    "as sent" and "sorted" (docs/signatures.md); a value that needs no escaping goes as it is.
    """
    params = sorted(
        ((k, _query_value(v)) for k, v in (query or {}).items() if v is not None),
        key=lambda kv: kv[0],
    )
    return f"{path}?{urlencode(params)}" if params else path


def segment(value: str | int) -> str:
    """One path segment, percent-encoded so an id can never change the path.

    `.`, `..` and an empty id are refused (`ValueError`, nothing sent): percent-encoding leaves
    dots as they are, and a server that normalises paths would read them as another endpoint.
    """
    text = str(value)
    if text in ("", ".", ".."):
        raise ProviderRequestRefused(
            f"refused to send: id {text!r} in a request path (empty, '.' or '..'); nothing sent"
        )
    return quote(text, safe="")


def _body_bytes(body: Mapping[str, Any] | BaseModel | None) -> bytes:
    if body is None:
        return b""
    if isinstance(body, BaseModel):
        return jsonio.dumpb(body.model_dump(mode="json", by_alias=True, exclude_none=True))
    return jsonio.dumpb(dict(body))


def model_of(endpoint: str, model: type[M], data: Any) -> M:
    """An answer's data as `model`; a `ProviderProtocolError` naming the first problem when it
    does not fit."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ProviderProtocolError(
            f"unexpected data for {endpoint}: {exc.error_count()} problem(s), "
            f"first: {first_problem(exc)}",
            endpoint=endpoint,
        ) from None


class _Session:
    """The HTTP session a client and its polls' view share: opened at first use, closed by the
    client that opened it."""

    def __init__(self, session: aiohttp.ClientSession | None) -> None:
        self.session = session
        self.own = session is None


class Transport:
    """Signed, retrying calls to the provider: one session, one request budget."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        api_secret: str,
        *,
        scheme: Scheme = DEFAULT,
        timeout_s: float = 10,
        retries: int = 3,
        backoff_s: float = 0.5,
        backoff_max_s: float = 10,
        session: aiohttp.ClientSession | None = None,
        on_call: OnCall | None = None,
        max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
        budget: RequestBudget | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"provider base_url must be an http(s) URL, got {base_url!r}")
        self._origin = f"{parts.scheme}://{parts.netloc}"
        # A base URL with a path (a gateway prefix) is part of every signed target.
        self._prefix = parts.path.rstrip("/")
        self._api_key = api_key
        self._secret = api_secret
        self._scheme = scheme
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._retries = max(0, retries)
        self._backoff_s = backoff_s
        self._backoff_max_s = backoff_max_s
        self._shared = _Session(session)
        self._on_call = on_call
        self._max_answer_bytes = max_answer_bytes
        # Polls' calls wait for it; the others spend from it (worker.provider.budget).
        self.budget = budget
        # True on the view `for_polls()` returns: every call waits for its token.
        self.polls = False
        # Named in connection errors: host and port only, never a path or a query.
        self._where = host_port(base_url)

    def for_polls(self) -> Self:
        """This client as a poll uses it: the same session, budget and hooks, but each call
        waits for a token of the request budget instead of spending one at once. Closing the
        view leaves the session open: the client it was made from closes it."""
        view = copy.copy(self)
        view.polls = True
        return view

    async def close(self) -> None:
        """Close the HTTP session if this client opened it (a polls' view never does)."""
        shared = self._shared
        if self.polls or not shared.own or shared.session is None:
            return
        # Taken out before the await: a call meanwhile opens a session of its own, not lost.
        session, shared.session = shared.session, None
        await session.close()

    async def _call(
        self,
        endpoint: str,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Mapping[str, Any] | BaseModel | None = None,
        idempotency_key: str | None = None,
        envelope: Envelope = Envelope.WALLET,
        retry: bool = True,
        parse: Callable[[Any], T] = _as_is,
    ) -> T:
        """One logical call: attempts with back-off until success, a final error or retries end.

        `parse` reads the answer's data (a `ProviderProtocolError` when it does not fit): a call
        counts as `ok` only once it did, else as `protocol_error`, and is not repeated.
        """
        target = self._prefix + build_target(path, query)
        raw = _body_bytes(body) if method != "GET" else b""
        attempts = 1 + (self._retries if retry else 0)
        held = self.polls
        for attempt in range(1, attempts + 1):
            if self.budget is not None:
                if held:
                    await self.budget.acquire(endpoint)
                else:
                    self.budget.spend()
            try:
                data = await self._attempt(endpoint, method, target, raw, idempotency_key, envelope)
                result = parse(data)
            except ProviderError as exc:
                exc.endpoint = endpoint
                self._report(endpoint, _outcome(exc))
                delay = self._delay(attempt)
                if isinstance(exc, ProviderRateLimited):
                    delay = self._rate_limited(exc, held, delay)
                elif self.budget is not None:
                    self.budget.answered()
                if not isinstance(exc, ProviderUnavailable) or attempt >= attempts or delay < 0:
                    raise
                log.warning(
                    "provider unavailable, retrying",
                    endpoint=endpoint,
                    attempt=attempt,
                    delay_s=round(delay, 3),
                    error=exc.msg,
                    traceId=exc.trace_id,
                )
                await asyncio.sleep(delay)
                continue
            if self.budget is not None:
                self.budget.answered()
            self._report(endpoint, "ok")
            return result
        raise AssertionError("unreachable")  # pragma: no cover

    def _rate_limited(self, exc: ProviderRateLimited, held: bool, delay: float) -> float:
        """Back every poll off; how long this call waits before its next attempt (-1: it
        gives up now, the wait being longer than a call's own back-off)."""
        wait = self.budget.back_off(exc.retry_after) if self.budget is not None else delay
        log.warning(
            "provider rate limit; polls back off",
            endpoint=exc.endpoint,
            retryAfter=exc.retry_after,
            backoffSeconds=round(wait, 3),
            traceId=exc.trace_id,
        )
        if held and self.budget is not None:
            return 0.0  # the next attempt waits in the budget for the back-off to end
        return max(delay, wait) if wait <= self._backoff_max_s else -1.0

    def _delay(self, attempt: int) -> float:
        base: float = min(self._backoff_max_s, self._backoff_s * 2.0 ** (attempt - 1))
        # Equal jitter: never less than half the step, so back-off still grows.
        return base / 2 + random.uniform(0, base / 2)

    def _report(self, endpoint: str, outcome: str) -> None:
        if self._on_call is None:
            return
        try:
            self._on_call(endpoint, outcome)
        except Exception:  # a metrics fault must never fail a provider call
            log.exception("on_call hook failed", endpoint=endpoint)

    def _session_for_use(self) -> aiohttp.ClientSession:
        shared = self._shared
        if shared.session is None or shared.session.closed:
            # Opened lazily so the client can be built outside a running event loop.
            shared.session = aiohttp.ClientSession(timeout=self._timeout)
            shared.own = True
        return shared.session

    async def _attempt(
        self,
        endpoint: str,
        method: str,
        target: str,
        raw: bytes,
        idempotency_key: str | None,
        envelope: Envelope,
    ) -> Any:
        # Signed afresh on every attempt: a retry must not carry a stale timestamp.
        headers = signed_headers(
            self._api_key, self._secret, method, target, raw, scheme=self._scheme
        )
        headers["Accept"] = JSON
        if method != "GET":
            headers["Content-Type"] = JSON
        if idempotency_key is not None:
            headers[IDEMPOTENCY_HEADER] = idempotency_key
        # encoded=True: send the target byte for byte as signed, no re-quoting.
        url = URL(self._origin + target, encoded=True)
        session = self._session_for_use()
        try:
            async with session.request(
                method,
                url,
                data=raw if method != "GET" else None,
                headers=headers,
                timeout=self._timeout,
                allow_redirects=False,
            ) as resp:
                status = resp.status
                retry_after = resp.headers.get("Retry-After")
                payload = await self._read_bounded(endpoint, resp)
        except TimeoutError:
            raise ProviderUnavailable(f"timeout ({self._where})", endpoint=endpoint) from None
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            raise ProviderUnavailable(
                f"connection error: {type(exc).__name__} to {self._where}", endpoint=endpoint
            ) from None
        except aiohttp.ClientError as exc:
            # Anything else the transport raises (e.g. ClientResponseError for a malformed
            # status line or header): no answer was read, so the outcome is unknown, which the
            # interface retries with back-off and the same key ("Timeout / unknown").
            raise ProviderUnavailable(
                f"transport error: {type(exc).__name__} from {self._where}", endpoint=endpoint
            ) from None
        try:
            return read_answer(endpoint, status, payload, envelope)
        except ProviderError as exc:
            limited = rate_limited(exc, status, parse_retry_after(retry_after))
            if limited is not None:
                raise limited from None
            raise

    async def _read_bounded(self, endpoint: str, resp: aiohttp.ClientResponse) -> bytes:
        """The answer body, never holding more than `max_answer_bytes` of it: a bigger one
        (by Content-Length or as it streams) is a protocol error, the rest left unread."""
        cap = self._max_answer_bytes
        too_big = ProviderProtocolError(
            f"answer larger than provider.max_answer_bytes ({cap} bytes); not read",
            endpoint=endpoint,
            http_status=resp.status,
        )
        if resp.content_length is not None and resp.content_length > cap:
            raise too_big
        chunks: list[bytes] = []
        size = 0
        async for chunk in resp.content.iter_chunked(64 * 1024):
            size += len(chunk)
            if size > cap:
                resp.close()  # drop the connection rather than drain the rest
                raise too_big
            chunks.append(chunk)
        return b"".join(chunks)

    # --- answer helpers ------------------------------------------------------------------

    _model = staticmethod(model_of)

    @staticmethod
    def _dict(endpoint: str, data: Any) -> dict[str, Any]:
        if data is None:
            return {}
        if not isinstance(data, dict):
            raise ProviderProtocolError(f"{endpoint}: data is not an object", endpoint=endpoint)
        return data

    @staticmethod
    def _list(endpoint: str, data: Any) -> list[Any]:
        if not isinstance(data, list):
            raise ProviderProtocolError(f"{endpoint}: data is not an array", endpoint=endpoint)
        return data
