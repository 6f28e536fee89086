"""The sandbox control API under /_sandbox/: unsigned JSON for a loopback tool or a test.

It injects on-chain deposits and decides reviews, sweeps, BLOCKED and FAIL; it drops webhooks
and injects faults. Answers: 200/201 with JSON, 400 for a bad request, 404 for an unknown
deposit, address or wallet, 409 when the state does not allow the step; errors are
``{"error": "..."}``. docs/sandbox.md documents every endpoint.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from decimal import Decimal
from typing import Any

from aiohttp import web

from worker.dev.sandbox.handle import SANDBOX_KEY, Sandbox
from worker.errors import SandboxError, SandboxNotFound
from worker.provider import jsonio

PREFIX = "/_sandbox/"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class BadRequest(Exception):
    """The control request is malformed (HTTP 400)."""


def _answer(payload: Any, status: int = 200) -> web.Response:
    return web.Response(body=jsonio.dumpb(payload), status=status, content_type="application/json")


def _guard(fn: Callable[[web.Request, Sandbox], Awaitable[web.Response]]) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        try:
            return await fn(request, request.app[SANDBOX_KEY])
        except BadRequest as exc:
            return _answer({"error": str(exc)}, 400)
        except SandboxNotFound as exc:
            return _answer({"error": str(exc)}, 404)
        except SandboxError as exc:
            return _answer({"error": str(exc)}, 409)

    handler.__doc__ = fn.__doc__
    return handler


async def _body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    try:
        body = jsonio.loads(raw) if raw.strip() else {}
    except ValueError:
        raise BadRequest("body is not valid JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("body must be a JSON object")
    return body


def _text(body: dict[str, Any], key: str, *, required: bool = True) -> str | None:
    value = body.get(key)
    if value is None:
        if required:
            raise BadRequest(f"{key} is required")
        return None
    if not isinstance(value, str) or (required and not value):
        raise BadRequest(f"{key} must be a non-empty string")
    return value


def _int(body: dict[str, Any], key: str, *, required: bool = True) -> int | None:
    value = body.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadRequest(f"{key} must be a whole number")
    return value


async def inject_deposit(request: web.Request, sb: Sandbox) -> web.Response:
    """POST deposits: an on-chain deposit confirmation."""
    body = await _body(request)
    amount = body.get("amount")
    if not isinstance(amount, str | int | Decimal) or isinstance(amount, bool):
        raise BadRequest("amount is required (a decimal string)")
    order = sb.inject_deposit(
        wallet_id=_int(body, "walletId") or 0,
        currency=_text(body, "currency") or "",
        network=_text(body, "network") or "",
        amount=amount if isinstance(amount, Decimal | str) else str(amount),
        from_address=_text(body, "fromAddress") or "",
        tx_hash=_text(body, "txHash", required=False),
        to_address=_text(body, "toAddress", required=False),
    )
    return _answer(order, 201)


def _deposit_step(step: Callable[[Sandbox, str], dict[str, Any]]) -> Handler:
    async def run(request: web.Request, sb: Sandbox) -> web.Response:
        return _answer(step(sb, request.match_info["id"]))

    return _guard(run)


async def reject_deposit(request: web.Request, sb: Sandbox) -> web.Response:
    """POST deposits/{id}/reject {failMessage}."""
    message = _text(await _body(request), "failMessage") or ""
    return _answer(sb.reject_review(request.match_info["id"], message))


async def approve_address(request: web.Request, sb: Sandbox) -> web.Response:
    """POST addresses/{id}/approve."""
    return _answer(sb.approve_address(request.match_info["id"]))


async def reject_address(request: web.Request, sb: Sandbox) -> web.Response:
    """POST addresses/{id}/reject {failMessage}."""
    message = _text(await _body(request), "failMessage") or ""
    return _answer(sb.reject_address(request.match_info["id"], message))


async def drop_webhooks(request: web.Request, sb: Sandbox) -> web.Response:
    """POST webhooks/drop {count}: the next count webhooks are never delivered."""
    count = _int(await _body(request), "count") or 0
    sb.drop_webhooks(count)
    return _answer({"dropsOwed": sb.deliverer.drops_owed})


async def webhooks_idle(request: web.Request, sb: Sandbox) -> web.Response:
    """GET webhooks/idle?timeout=S: wait until nothing is pending (408 after S seconds)."""
    try:
        timeout = float(request.query.get("timeout", "10"))
    except ValueError:
        raise BadRequest("timeout must be a number of seconds") from None
    try:
        await asyncio.wait_for(sb.delivered_idle(), timeout)
    except TimeoutError:
        return _answer(
            {"error": "webhooks still pending", "pending": len(sb.deliverer.pending())}, 408
        )
    return _answer({"pending": 0})


async def set_fault(request: web.Request, sb: Sandbox) -> web.Response:
    """POST faults {endpoint, kind, count, latencySeconds, code, httpStatus, retryAfterSeconds}."""
    body = await _body(request)
    count = body.get("count", 1)
    if count is not None and (not isinstance(count, int) or isinstance(count, bool)):
        raise BadRequest("count must be a whole number or null (until cleared)")
    latency = body.get("latencySeconds", 0)
    if not isinstance(latency, int | Decimal) or isinstance(latency, bool):
        raise BadRequest("latencySeconds must be a number")
    status = body.get("httpStatus", 429)
    retry_after = body.get("retryAfterSeconds")
    for name, value in (("httpStatus", status), ("retryAfterSeconds", retry_after)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise BadRequest(f"{name} must be a whole number")
    fault = sb.set_fault(
        _text(body, "endpoint") or "",
        kind=_text(body, "kind", required=False) or "5xx",
        count=count,
        latency_s=float(latency),
        code=_text(body, "code", required=False) or "10000104",
        http_status=429 if status is None else status,
        retry_after_s=retry_after,
    )
    return _answer(fault, 201)


async def clear_faults(request: web.Request, sb: Sandbox) -> web.Response:
    """DELETE faults."""
    sb.clear_faults()
    return _answer({"faults": []})


async def state(request: web.Request, sb: Sandbox) -> web.Response:
    """GET state: orders, balances, addresses, wallets, webhooks, faults."""
    return _answer(sb.snapshot())


async def put_wallet(request: web.Request, sb: Sandbox) -> web.Response:
    """POST wallets {walletId, name, autoCollection, walletType}."""
    body = await _body(request)
    auto = body.get("autoCollection", False)
    if not isinstance(auto, bool):
        raise BadRequest("autoCollection must be true or false")
    group = sb.put_wallet(
        _int(body, "walletId", required=False),
        _text(body, "name") or "",
        auto,
        _text(body, "walletType", required=False),
    )
    return _answer(group, 201)


def add_routes(app: web.Application) -> None:
    """Register every control endpoint under /_sandbox/."""
    p = PREFIX
    app.router.add_post(p + "deposits", _guard(inject_deposit))
    app.router.add_post(p + "deposits/{id}/approve", _deposit_step(Sandbox.approve_review))
    app.router.add_post(p + "deposits/{id}/reject", _guard(reject_deposit))
    app.router.add_post(p + "deposits/{id}/sweep", _deposit_step(Sandbox.finish_sweep))
    app.router.add_post(p + "deposits/{id}/block", _deposit_step(Sandbox.block))
    app.router.add_post(p + "deposits/{id}/fail", _deposit_step(Sandbox.fail_order))
    app.router.add_post(p + "addresses/{id}/approve", _guard(approve_address))
    app.router.add_post(p + "addresses/{id}/reject", _guard(reject_address))
    app.router.add_post(p + "webhooks/drop", _guard(drop_webhooks))
    app.router.add_get(p + "webhooks/idle", _guard(webhooks_idle))
    app.router.add_post(p + "faults", _guard(set_fault))
    app.router.add_delete(p + "faults", _guard(clear_faults))
    app.router.add_get(p + "state", _guard(state))
    app.router.add_post(p + "wallets", _guard(put_wallet))
