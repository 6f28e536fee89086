"""The sandbox's stable orders and collection orders: created by control calls, moved through
their statuses with a signed webhook each time (STABLE_ORDER_UPDATED, Collect Order Updated),
and read by the provider's query operations in the wallet/stable envelope with `success`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from worker.dev.sandbox.control import PREFIX, _answer, _body, _guard
from worker.dev.sandbox.envelopes import StableFailure, fail_envelope, ok_envelope, respond
from worker.dev.sandbox.handle import SANDBOX_KEY, Sandbox
from worker.dev.sandbox.records import Event, new_id, parse_amount
from worker.errors import SandboxError, SandboxNotFound
from worker.provider.models import EventType

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

STABLE_STATUSES = ("processing", "success", "fail", "cancelled")
STABLE_FINAL = frozenset({"success", "fail", "cancelled"})
BUSINESS_TYPES = ("STABLE_BUY", "STABLE_SWAP")
COLLECT_STATUSES = ("PROCESSING", "SUCCESS", "FAIL")
WHITE_LIST_STATUSES = ("init", "pending", "approved", "rejected")
NOT_FOUND = "ORDER_NOT_FOUND"


def _text(spec: Mapping[str, Any], key: str, default: str | None = None) -> str:
    value = spec.get(key, default)
    if not isinstance(value, str) or not value:
        raise SandboxError(f"{key} is required (a non-empty string)")
    return value


def _find(orders: Mapping[str, dict[str, Any]], query: Mapping[str, str]) -> dict[str, Any]:
    """The order named by orderId or merchantOrderId, or a stable-form failure."""
    order_id = query.get("orderId") or None
    merchant_id = query.get("merchantOrderId") or None
    if order_id is None and merchant_id is None:
        raise StableFailure("orderId or merchantOrderId is required", "VALIDATION_FAILED")
    for order in orders.values():
        if (order_id is None or order["orderId"] == order_id) and (
            merchant_id is None or order["merchantOrderId"] == merchant_id
        ):
            return order
    raise StableFailure(f"order {order_id or merchant_id} not found", NOT_FOUND)


# --- stable orders -------------------------------------------------------------------------------


def stable_event(order: dict[str, Any]) -> Event:
    """STABLE_ORDER_UPDATED for the order's current status."""
    data = {k: order[k] for k in ("orderId", "merchantOrderId", "orderStatus", "businessType")}
    return Event(EventType.STABLE_ORDER_UPDATED.value, order["orderId"], order["orderStatus"], data)


def create_stable_order(sb: Sandbox, spec: Mapping[str, Any]) -> dict[str, Any]:
    """A new stable order (orderStatus processing) and its first webhook."""
    business = _text(spec, "businessType", "STABLE_BUY")
    if business not in BUSINESS_TYPES:
        raise SandboxError(f"businessType must be one of {', '.join(BUSINESS_TYPES)}")
    merchant_id = _text(spec, "merchantOrderId")
    if any(o["merchantOrderId"] == merchant_id for o in sb.state.stable_orders.values()):
        raise SandboxError(f"merchantOrderId {merchant_id} already used")
    source = parse_amount(spec.get("sourceAmount", ""))
    price = parse_amount(spec.get("price", "1"))
    target = spec.get("targetAmount")
    now = sb.clock()
    order: dict[str, Any] = {
        "merchantOrderId": merchant_id,
        "orderId": new_id("SO"),
        "orderStatus": "processing",
        "businessType": business,
        "paymentMethod": _text(spec, "paymentMethod", "VIRTUAL_ACCOUNT"),
        "sourceCurrency": _text(spec, "sourceCurrency", "USD"),
        "targetCurrency": _text(spec, "targetCurrency", "USDT"),
        "sourceAmount": source,
        "targetAmount": parse_amount(target) if target is not None else source * price,
        "price": price,
        "createTime": now,
        "updateTime": now,
    }
    sb.state.stable_orders[order["orderId"]] = order
    sb.commit([stable_event(order)])
    return order


def move_stable_order(sb: Sandbox, order_id: str, status: str) -> dict[str, Any]:
    """The order takes `status` (lowercase); a final status never changes again."""
    order = sb.state.stable_orders.get(order_id)
    if order is None:
        raise SandboxNotFound(f"no stable order {order_id}")
    if status not in STABLE_STATUSES:
        raise SandboxError(f"orderStatus must be one of {', '.join(STABLE_STATUSES)}")
    if order["orderStatus"] in STABLE_FINAL or order["orderStatus"] == status:
        raise SandboxError(f"stable order {order_id} is {order['orderStatus']}")
    order["orderStatus"] = status
    order["updateTime"] = sb.clock()
    sb.commit([stable_event(order)])
    return order


# --- collection orders ---------------------------------------------------------------------------


def collect_event(order: dict[str, Any]) -> Event:
    """Collect Order Updated for the order's current status (carries whiteListStatus)."""
    data = {k: order[k] for k in ("orderId", "merchantOrderId", "status", "whiteListStatus")}
    return Event(EventType.COLLECT_ORDER_UPDATED.value, order["orderId"], order["status"], data)


def _collect_fields(order: dict[str, Any], spec: Mapping[str, Any]) -> None:
    status = spec.get("status", order.get("status", "PROCESSING"))
    if status not in COLLECT_STATUSES:
        raise SandboxError(f"status must be one of {', '.join(COLLECT_STATUSES)}")
    wls = spec.get("whiteListStatus", order.get("whiteListStatus"))
    if wls is not None and wls not in WHITE_LIST_STATUSES:
        raise SandboxError(f"whiteListStatus must be null or one of {WHITE_LIST_STATUSES}")
    order["status"], order["whiteListStatus"] = status, wls


def create_collect_order(sb: Sandbox, spec: Mapping[str, Any]) -> dict[str, Any]:
    """A new collection order and its first Collect Order Updated."""
    now = sb.clock()
    order: dict[str, Any] = {
        "orderId": new_id("CO"),
        "merchantOrderId": _text(spec, "merchantOrderId"),
        "amount": parse_amount(spec.get("amount", "")),
        "currency": _text(spec, "currency", "USDT"),
        "network": _text(spec, "network", "TRON"),
        "whiteListStatus": "init",
        "createTime": now,
        "updateTime": now,
    }
    _collect_fields(order, spec)
    sb.state.collect_orders[order["orderId"]] = order
    sb.commit([collect_event(order)])
    return order


def move_collect_order(sb: Sandbox, order_id: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    """Change a collection order's status and/or whiteListStatus."""
    order = sb.state.collect_orders.get(order_id)
    if order is None:
        raise SandboxNotFound(f"no collection order {order_id}")
    if "status" not in spec and "whiteListStatus" not in spec:
        raise SandboxError("status or whiteListStatus is required")
    before = (order["status"], order["whiteListStatus"])
    _collect_fields(order, spec)
    if (order["status"], order["whiteListStatus"]) == before:
        raise SandboxError(f"collection order {order_id} is already {before}")
    order["updateTime"] = sb.clock()
    sb.commit([collect_event(order)])
    return order


# --- provider operations -------------------------------------------------------------------------


def _stable(fn: Callable[[web.Request], dict[str, Any]]) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        try:
            data = fn(request)
        except StableFailure as exc:
            return respond(fail_envelope(exc.code, exc.message))
        return respond(ok_envelope(data, success=True))

    handler.__doc__ = fn.__doc__
    return handler


def _stable_detail(request: web.Request) -> dict[str, Any]:
    """GET query-detail by orderId or merchantOrderId."""
    order = _find(request.app[SANDBOX_KEY].state.stable_orders, request.query)
    return {k: v for k, v in order.items() if k not in ("createTime", "updateTime")}


def _collect_status(request: web.Request) -> dict[str, Any]:
    """GET collection order status by orderId or merchantOrderId."""
    return dict(_find(request.app[SANDBOX_KEY].state.collect_orders, request.query))


PROVIDER_ROUTES: list[tuple[str, str, str, Handler]] = [
    ("GET", "/v1/stable/order/query-detail", "stable_order", _stable(_stable_detail)),
    ("GET", "/v2/stable/collect/order-status", "collect_order", _stable(_collect_status)),
]


# --- control -------------------------------------------------------------------------------------


async def _create_stable(request: web.Request, sb: Sandbox) -> web.Response:
    """POST stable-orders."""
    return _answer(create_stable_order(sb, await _body(request)), 201)


async def _move_stable(request: web.Request, sb: Sandbox) -> web.Response:
    """POST stable-orders/{id}/status {orderStatus}."""
    status = (await _body(request)).get("orderStatus")
    return _answer(move_stable_order(sb, request.match_info["id"], str(status)))


async def _create_collect(request: web.Request, sb: Sandbox) -> web.Response:
    """POST collect-orders."""
    return _answer(create_collect_order(sb, await _body(request)), 201)


async def _move_collect(request: web.Request, sb: Sandbox) -> web.Response:
    """POST collect-orders/{id}/status {status, whiteListStatus}."""
    return _answer(move_collect_order(sb, request.match_info["id"], await _body(request)))


def add_control_routes(app: web.Application) -> None:
    """Register the order control calls under /_sandbox/."""
    p = PREFIX
    app.router.add_post(p + "stable-orders", _guard(_create_stable))
    app.router.add_post(p + "stable-orders/{id}/status", _guard(_move_stable))
    app.router.add_post(p + "collect-orders", _guard(_create_collect))
    app.router.add_post(p + "collect-orders/{id}/status", _guard(_move_collect))
