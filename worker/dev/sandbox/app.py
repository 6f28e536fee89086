"""The sandbox's provider API (signed, wallet envelope) and the composition root `create_app`.

Every request under /v1 is verified with the configured key and secret; a failure is HTTP 401
with the wallet envelope. Business failures are the wallet envelope with status 500 and a code
at HTTP 200, as the interface says. Writes need an Idempotency-Key: the same key with the same
request answers the first answer again, with a different request 10000105.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from decimal import Decimal
from typing import Any

from aiohttp import web

from worker.dev.sandbox import control, hosted, idempotency, money_api, orders, partner
from worker.dev.sandbox.config import SandboxConfig
from worker.dev.sandbox.envelopes import (
    MissingInput,
    bad_request,
    fail_envelope,
    ok_envelope,
    respond,
)
from worker.dev.sandbox.envelopes import trace_id as _trace_id
from worker.dev.sandbox.handle import SANDBOX_KEY, Sandbox
from worker.dev.sandbox.state import BAD_VALUE
from worker.errors import WalletCodeError
from worker.provider.models import AddressStatus, WhiteListStatus
from worker.provider.signing import SignatureError, verify

__all__ = ["ENDPOINTS_KEY", "ROUTES", "SANDBOX_KEY", "Sandbox", "SandboxConfig", "create_app"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

ENDPOINTS_KEY: web.AppKey[dict[Handler, str]] = web.AppKey("sandbox_endpoints", dict)

WL = "/v1/wallet/deposit-whitelist"
MAX_PAGE_SIZE = 500


def _auth_message(reason: str) -> str:
    # Callers classify auth failures by these words (interface: signature, unauthorized, timestamp).
    if reason.startswith("missing header") or "API-KEY" in reason:
        return f"unauthorized: {reason}"
    if "API-TIMESTAMP" in reason:
        return f"timestamp invalid: {reason}"
    return f"signature invalid: {reason}"


# --- request parsing ---------------------------------------------------------------------------


def _query_int(
    request: web.Request,
    name: str,
    default: int | None = None,
    *,
    lo: int = 0,
    hi: int | None = None,
) -> int | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise WalletCodeError(BAD_VALUE, f"{name} must be a whole number") from None
    if value < lo or (hi is not None and value > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
        raise WalletCodeError(BAD_VALUE, f"{name} must be {bound}")
    return value


def _required_int(request: web.Request, name: str) -> int:
    value = _query_int(request, name)
    if value is None:
        raise MissingInput(f"query parameter {name} is required")
    return value


def _page(request: web.Request, rows: list[dict[str, Any]]) -> dict[str, Any]:
    page_num = _query_int(request, "pageNum", 1, lo=1) or 1
    size = _query_int(request, "pageSize", 50, lo=1, hi=MAX_PAGE_SIZE) or 50
    start = (page_num - 1) * size
    return {
        "pageNumber": page_num,
        "pageSize": size,
        "totalPage": math.ceil(len(rows) / size),
        "totalRow": len(rows),
        "records": rows[start : start + size],
    }


async def _idempotent(request: web.Request, op: Callable[[dict[str, Any]], Any]) -> web.Response:
    """Run a write once per Idempotency-Key; replay the first answer for the same request."""
    key = request.headers.get("Idempotency-Key")
    if not key:
        raise MissingInput("Idempotency-Key header is required for this write")
    raw = await request.read()
    print_ = idempotency.fingerprint(request.method, request.path, raw)
    answer, _ran = idempotency.run_once(
        request.app[SANDBOX_KEY], key, print_, lambda: op(idempotency.body_object(raw))
    )
    return respond(answer)


# --- handlers ----------------------------------------------------------------------------------


async def options(request: web.Request) -> web.Response:
    """Provider (VASP) names."""
    return respond(ok_envelope({"providers": list(request.app[SANDBOX_KEY].cfg.providers)}))


async def register_address(request: web.Request) -> web.Response:
    """Register a source address with payer details."""
    return await _idempotent(request, request.app[SANDBOX_KEY].register_address)


async def list_addresses(request: web.Request) -> web.Response:
    """Source address records, filtered by status and walletId, paged."""
    state = request.app[SANDBOX_KEY].state
    status = request.query.get("status") or None
    if status is not None and status not in {s.value for s in AddressStatus}:
        raise WalletCodeError(BAD_VALUE, f"status {status!r} is not an address status")
    wallet_id = _query_int(request, "walletId")
    rows = [
        a.wire()
        for a in sorted(state.addresses.values(), key=lambda a: (a.create_time, a.id))
        if (status is None or a.status.value == status)
        and (wallet_id is None or a.wallet_id == wallet_id)
    ]
    return respond(ok_envelope(_page(request, rows)))


async def address_detail(request: web.Request) -> web.Response:
    """One source address record."""
    state = request.app[SANDBOX_KEY].state
    return respond(ok_envelope(state.address(request.match_info["id"]).wire()))


async def disable_address(request: web.Request) -> web.Response:
    """Disable a source address record."""
    sandbox = request.app[SANDBOX_KEY]
    address_id = request.match_info["id"]
    return await _idempotent(request, lambda _body: sandbox.disable_address(address_id))


async def submit(request: web.Request) -> web.Response:
    """Submit payer details for a received deposit."""
    sandbox = request.app[SANDBOX_KEY]
    tx_id = request.match_info["transactionId"]
    return await _idempotent(request, lambda body: sandbox.submit(tx_id, body))


async def transaction_detail(request: web.Request) -> web.Response:
    """One deposit order with creditStatus (either spelling of the path)."""
    tx_id = request.match_info.get("transactionId") or request.query.get("transactionId")
    if not tx_id:
        raise MissingInput("query parameter transactionId is required")
    return respond(ok_envelope(request.app[SANDBOX_KEY].state.order(tx_id).wire()))


async def history(request: web.Request) -> web.Response:
    """Deposit history / work queue (either spelling of the path)."""
    wls_raw = request.query.get("whiteListStatus") or None
    wls: WhiteListStatus | None = None
    if wls_raw is not None:
        if wls_raw not in (WhiteListStatus.INIT.value, WhiteListStatus.REJECTED.value):
            raise WalletCodeError(BAD_VALUE, "whiteListStatus filter accepts init or rejected")
        wls = WhiteListStatus(wls_raw)
    orders = request.app[SANDBOX_KEY].state.history(
        white_list_status=wls,
        wallet_id=_query_int(request, "walletId"),
        currency=request.query.get("currency") or None,
        start_time=_query_int(request, "startTime"),
        end_time=_query_int(request, "endTime"),
    )
    return respond(ok_envelope(_page(request, [o.wire(detail=False) for o in orders])))


async def deposit_address(request: web.Request) -> web.Response:
    """The deposit address of a wallet on a network."""
    wallet = request.app[SANDBOX_KEY].state.wallet(_required_int(request, "walletId"))
    network = request.query.get("network")
    if not network:
        raise MissingInput("query parameter network is required")
    data = {
        "walletId": wallet.wallet_id,
        "currency": request.query.get("currency"),
        "network": network,
        "address": wallet.deposit_address(network),
        "memo": None,
    }
    return respond(ok_envelope(data))


async def asset_balance(request: web.Request) -> web.Response:
    """Available and unavailable balance of a wallet (one currency, or all)."""
    state = request.app[SANDBOX_KEY].state
    wallet = state.wallet(_required_int(request, "walletId"))
    currency = request.query.get("currency") or None
    rows = [
        {"walletId": wid, "currency": cur, "available": b.available, "unavailable": b.unavailable}
        for (wid, cur), b in sorted(state.balances.items(), key=lambda kv: kv[0])
        if wid == wallet.wallet_id and (currency is None or cur == currency)
    ]
    if currency is not None and not rows:  # asked for, never held: zero, and nothing recorded
        rows = [
            {
                "walletId": wallet.wallet_id,
                "currency": currency,
                "available": Decimal(0),
                "unavailable": Decimal(0),
            }
        ]
    return respond(ok_envelope(rows))


async def create_sub(request: web.Request) -> web.Response:
    """Create a sub-wallet."""
    return await _idempotent(request, request.app[SANDBOX_KEY].create_sub_wallet)


async def add_withdraw_whitelist(request: web.Request) -> web.Response:
    """Add a withdrawal whitelist entry."""
    return await _idempotent(request, request.app[SANDBOX_KEY].add_withdraw_whitelist)


async def wallet_list(request: web.Request) -> web.Response:
    """Wallet groups (optionally one walletId)."""
    state = request.app[SANDBOX_KEY].state
    wallet_id = _query_int(request, "walletId")
    groups = [
        state.wallet_group(w)
        for w in sorted(state.wallets.values(), key=lambda w: w.wallet_id)
        if wallet_id is None or w.wallet_id == wallet_id
    ]
    return respond(ok_envelope(groups), numbers=True)


# (method, path, endpoint name for faults, handler)
ROUTES: list[tuple[str, str, str, Handler]] = [
    ("GET", f"{WL}/options", "options", options),
    ("POST", f"{WL}/addresses", "register_address", register_address),
    ("GET", f"{WL}/addresses", "list_addresses", list_addresses),
    ("GET", f"{WL}/addresses/{{id}}", "address_detail", address_detail),
    ("POST", f"{WL}/addresses/{{id}}/disable", "disable_address", disable_address),
    ("POST", f"{WL}/transactions/{{transactionId}}/submit", "submit", submit),
    ("GET", "/v1/wallet/transactions/{transactionId}", "detail", transaction_detail),
    ("GET", "/v1/wallet/transaction/detail", "detail", transaction_detail),
    ("GET", "/v1/wallet/history", "history", history),
    ("GET", "/v1/wallet/transaction/list", "history", history),
    ("GET", "/v1/wallet/deposit-address", "deposit_address", deposit_address),
    ("GET", "/v1/wallet/asset-balance", "asset_balance", asset_balance),
    ("POST", "/v1/wallet/create/sub", "create_sub", create_sub),
    ("POST", "/v1/wallet/add-withdraw-whitelist", "withdraw_whitelist", add_withdraw_whitelist),
    ("GET", "/v1/wallet/list", "wallet_list", wallet_list),
    *money_api.PROVIDER_ROUTES,
    *orders.PROVIDER_ROUTES,
    *partner.PROVIDER_ROUTES,
]


@web.middleware
async def provider_edge(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Authenticate, apply injected faults, and turn wallet codes into the failure envelope."""
    if request.path.startswith((control.PREFIX, hosted.PREFIX)):
        # The control API is unsigned; the hosted page authenticates with its URL token.
        return await handler(request)
    sandbox = request.app[SANDBOX_KEY]
    cfg = sandbox.cfg
    raw = await request.read()
    try:
        verify(
            request.headers,
            request.method,
            request.raw_path,
            raw,
            api_key=cfg.api_key,
            secrets=[cfg.api_secret],
            tolerance_s=cfg.tolerance_s,
            scheme=cfg.signature,
        )
    except SignatureError as exc:
        body = {"status": 401, "code": None, "msg": _auth_message(str(exc)), "traceId": _trace_id()}
        return respond({**body, "data": None}, status=401)
    name = request.app[ENDPOINTS_KEY].get(request.match_info.handler, "")
    fault = sandbox.faults.take(name, request.path)
    if fault is not None:
        if fault.kind == "5xx":
            return _unavailable("service unavailable (injected fault)")
        if fault.kind == "timeout":
            release = sandbox.faults.release
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(release.wait(), cfg.fault_timeout_s)
            return _unavailable("gateway timeout (injected fault)")
        if fault.kind == "code":
            return respond(fail_envelope(fault.code, f"injected failure {fault.code}"))
        if fault.kind == "rate_limit":
            return _rate_limited(fault.http_status, fault.retry_after_s)
        await asyncio.sleep(fault.latency_s)
    try:
        return await handler(request)
    except WalletCodeError as exc:
        return respond(fail_envelope(exc.code, exc.msg))
    except MissingInput as exc:
        return respond(bad_request(str(exc)), status=400)


def _unavailable(msg: str) -> web.Response:
    body = {"status": 503, "code": None, "msg": msg, "traceId": _trace_id(), "data": None}
    return respond(body, status=503)


def _rate_limited(status: int, retry_after_s: int | None) -> web.Response:
    msg = "too many requests: rate limit exceeded (injected fault)"
    body = {"status": status, "code": None, "msg": msg, "traceId": _trace_id(), "data": None}
    answer = respond(body, status=status)
    if retry_after_s is not None:
        answer.headers["Retry-After"] = str(retry_after_s)
    return answer


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    sandbox = app[SANDBOX_KEY]
    await sandbox.start()
    yield
    await sandbox.stop()


async def _release_held(app: web.Application) -> None:
    # Before aiohttp waits for in-flight handlers, let "timeout" faults answer.
    app[SANDBOX_KEY].faults.release.set()


def create_app(
    cfg: SandboxConfig,
    *,
    clock: Callable[[], int] | None = None,
    signing_clock: Callable[[], int] | None = None,
) -> web.Application:
    """The sandbox application: provider API, control API, delivery in the background
    (`Sandbox` says what the two clocks are)."""
    app = web.Application(middlewares=[provider_edge])
    app[SANDBOX_KEY] = Sandbox(cfg, clock=clock, signing_clock=signing_clock)
    endpoints: dict[Handler, str] = {}
    for method, path, name, handler in ROUTES:
        app.router.add_route(method, path, handler)
        endpoints[handler] = name
    app[ENDPOINTS_KEY] = endpoints
    control.add_routes(app)
    hosted.add_routes(app)
    money_api.add_control_routes(app)
    orders.add_control_routes(app)
    app.cleanup_ctx.append(_lifecycle)
    app.on_shutdown.append(_release_held)
    return app
