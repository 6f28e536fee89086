"""The sandbox's money operations over HTTP: the abnormal-fund list (wallet envelope), the daily
settlement report (partner envelope), the deposit Travel Rule link, and their control calls."""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import Awaitable, Callable

from aiohttp import web

from worker.dev.sandbox import money
from worker.dev.sandbox.control import PREFIX, _answer, _body, _guard, _text
from worker.dev.sandbox.envelopes import (
    PartnerFailure,
    ok_envelope,
    partner_fail,
    partner_ok,
    respond,
)
from worker.dev.sandbox.handle import SANDBOX_KEY, Sandbox
from worker.dev.sandbox.state import BAD_VALUE, INCOMPLETE
from worker.errors import SandboxError, WalletCodeError
from worker.provider import jsonio

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

MAX_PAGE_SIZE = 500
LINK_PATH = "/v1/wallet/deposit-whitelist/travel-rule-link"


def partner_route(fn: Handler) -> Handler:
    """Answer a `PartnerFailure` with the partner envelope (HTTP 200)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        try:
            return await fn(request)
        except PartnerFailure as exc:
            return respond(partner_fail(exc.code, exc.message))

    handler.__doc__ = fn.__doc__
    return handler


async def abnormal_fund_list(request: web.Request) -> web.Response:
    """POST abnormal-fund list: filters in the body, the page wrapper, amounts as numbers."""
    sb = request.app[SANDBOX_KEY]
    body = await request.read()
    try:
        query = jsonio.loads(body) if body.strip() else {}
    except ValueError:
        raise WalletCodeError(BAD_VALUE, "body is not valid JSON") from None
    if not isinstance(query, dict):
        raise WalletCodeError(BAD_VALUE, "body must be a JSON object")
    try:
        rows = money.filter_abnormal(sb.state.abnormal_funds.values(), query)
        page = money.page_of(rows, query.get("pageNum"), query.get("pageSize"), MAX_PAGE_SIZE)
    except money.BadQuery as exc:
        raise WalletCodeError(BAD_VALUE, str(exc)) from None
    return respond(ok_envelope(page), numbers=True)


def _query_int(request: web.Request, name: str, default: int, hi: int | None = None) -> int:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise PartnerFailure(f"{name} must be a whole number") from None
    if value < 1 or (hi is not None and value > hi):
        raise PartnerFailure(f"{name} must be between 1 and {hi}" if hi else f"{name} < 1")
    return value


async def settlement_daily_records(request: web.Request) -> web.Response:
    """GET daily settlement records of one day (partner envelope)."""
    sb = request.app[SANDBOX_KEY]
    q = request.query
    raw_day = q.get("settlement_date")
    if not raw_day:
        raise PartnerFailure("settlement_date is required (yyyy-MM-dd)")
    try:
        day = dt.date.fromisoformat(raw_day)
    except ValueError:
        raise PartnerFailure("settlement_date must be yyyy-MM-dd") from None
    tz_name = sb.cfg.report_timezone or q.get("timezone") or sb.cfg.report_default_timezone
    status = q.get("reconciliation_status") or None
    if status is not None and status not in money.RECONCILIATION_STATUSES:
        raise PartnerFailure(f"reconciliation_status {status!r} is not known")
    query = money.ReportQuery(
        day=day,
        tz_name=tz_name,
        asset=q.get("asset") or None,
        network=q.get("network") or None,
        business_type=q.get("business_type") or None,
        record_type=q.get("record_type") or None,
        reconciliation_status=status,
    )
    try:
        data = money.report(
            sb.state.orders.values(),
            sb.state.settlement_changes,
            query,
            page=_query_int(request, "page", 1),
            page_size=_query_int(request, "page_size", 50, MAX_PAGE_SIZE),
            now=sb.clock(),
        )
    except money.BadQuery as exc:
        raise PartnerFailure(str(exc)) from None
    return respond(partner_ok(data))


async def travel_rule_link(request: web.Request) -> web.Response:
    """POST deposit Travel Rule link: a short-lived hosted-page URL with a fresh token."""
    sb = request.app[SANDBOX_KEY]
    raw = await request.read()
    try:
        body = jsonio.loads(raw) if raw.strip() else {}
    except ValueError:
        raise WalletCodeError(BAD_VALUE, "body is not valid JSON") from None
    if not isinstance(body, dict):
        raise WalletCodeError(BAD_VALUE, "body must be a JSON object")
    wallet_id = body.get("walletId")
    if wallet_id is None:
        raise WalletCodeError(INCOMPLETE, "walletId is mandatory")
    if not isinstance(wallet_id, int) or isinstance(wallet_id, bool):
        raise WalletCodeError(BAD_VALUE, "walletId must be a number")
    sb.state.wallet(wallet_id)
    tx_id = body.get("transactionId")
    if tx_id is not None:
        order = sb.state.order(str(tx_id))
        if order.wallet_id != wallet_id:
            raise WalletCodeError("10000100", f"transaction {tx_id} is not in wallet {wallet_id}")
    lng = body.get("lng") or "en"
    if not isinstance(lng, str) or not lng.replace("-", "").isalpha() or len(lng) > 10:
        raise WalletCodeError(BAD_VALUE, "lng must be a language code such as en")
    token = secrets.token_urlsafe(24)
    expires = sb.clock() + int(sb.cfg.travel_rule_link_ttl_s * 1000)
    sb.state.travel_rule_tokens[token] = {
        "walletId": wallet_id,
        "transactionId": tx_id,
        "expiresTime": expires,
    }
    sb.commit()
    hosted = sb.cfg.hosted_url or f"{request.scheme}://{request.host}/hosted"
    url = f"{hosted.rstrip('/')}/{lng}/deposit-travel-rule?token={token}"
    return respond(ok_envelope({"url": url, "expiresTime": expires}))


# (method, path, endpoint name for faults, handler)
PROVIDER_ROUTES: list[tuple[str, str, str, Handler]] = [
    ("POST", "/v1/stable/collect/abnormal-fund/list", "abnormal_funds", abnormal_fund_list),
    (
        "GET",
        "/api/v1/settlement/daily-records",
        "settlement",
        partner_route(settlement_daily_records),
    ),
    ("POST", LINK_PATH, "travel_rule_link", travel_rule_link),
]


# --- control -----------------------------------------------------------------------------------


async def inject_abnormal(request: web.Request, sb: Sandbox) -> web.Response:
    """POST abnormal-funds {amount, currency, network, fromAddress, toAddress, ..., notify}."""
    body = await _body(request)
    notify = body.pop("notify", False)
    if not isinstance(notify, bool):
        raise SandboxError("notify must be true or false")
    return _answer(sb.inject_abnormal_fund(body, notify=notify), 201)


async def abnormal_status(request: web.Request, sb: Sandbox) -> web.Response:
    """POST abnormal-funds/{id}/status {status}."""
    try:
        fund_id = int(request.match_info["id"])
    except ValueError:
        raise SandboxError("abnormal fund id must be a number") from None
    status = _text(await _body(request), "status") or ""
    return _answer(sb.set_abnormal_status(fund_id, status))


async def add_discrepancy(request: web.Request, sb: Sandbox) -> web.Response:
    """POST settlement/discrepancies {kind, date, transactionId, amount, ...}."""
    return _answer(sb.add_discrepancy(await _body(request)), 201)


async def clear_discrepancies(request: web.Request, sb: Sandbox) -> web.Response:
    """DELETE settlement/discrepancies."""
    sb.clear_discrepancies()
    return _answer({"discrepancies": []})


async def release(request: web.Request, sb: Sandbox) -> web.Response:
    """POST deposits/{id}/release: a BLOCKED deposit is credited."""
    return _answer(sb.release(request.match_info["id"]))


def add_control_routes(app: web.Application) -> None:
    """Register the money control calls under /_sandbox/."""
    p = PREFIX
    app.router.add_post(p + "abnormal-funds", _guard(inject_abnormal))
    app.router.add_post(p + "abnormal-funds/{id}/status", _guard(abnormal_status))
    app.router.add_post(p + "settlement/discrepancies", _guard(add_discrepancy))
    app.router.add_delete(p + "settlement/discrepancies", _guard(clear_discrepancies))
    app.router.add_post(p + "deposits/{id}/release", _guard(release))
