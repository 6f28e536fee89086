"""The sandbox's virtual-account e-mail verification (its own envelope, rate limited per
address) and the partner operations: onboarding share (groups validated, answers
onboarding_status) and quotes (sourceAmount range, price, expiry)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Awaitable, Callable
from decimal import ROUND_DOWN, Decimal
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from worker.dev.sandbox.envelopes import (
    PartnerFailure,
    partner_ok,
    respond,
    trace_id,
)
from worker.dev.sandbox.handle import SANDBOX_KEY
from worker.dev.sandbox.money import iso_ms
from worker.dev.sandbox.money_api import partner_route
from worker.dev.sandbox.records import new_id
from worker.provider import jsonio
from worker.provider.answers import first_problem
from worker.provider.resources import OnboardingShareRequest, QuoteRequest

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

EMAIL_RE = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
AMOUNT_MIN, AMOUNT_MAX = Decimal(100), Decimal(500000)
AMOUNT_OUT_OF_RANGE = "AMOUNT_OUT_OF_RANGE"
PAIR_NOT_SUPPORTED = "PAIR_NOT_SUPPORTED"
NOT_ONBOARDED = "NOT_ONBOARDED"
FEE_RATE = Decimal("0.001")


async def _json_object(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    try:
        body = jsonio.loads(raw) if raw.strip() else {}
    except ValueError:
        raise PartnerFailure("body is not valid JSON") from None
    if not isinstance(body, dict):
        raise PartnerFailure("body must be a JSON object")
    return body


# --- e-mail verification -------------------------------------------------------------------------


def _email_answer(status: int, message: str) -> web.Response:
    return respond({"status": status, "message": message, "traceId": trace_id()})


async def send_verify_code(request: web.Request) -> web.Response:
    """POST send-verify-code {email}: e-mail verification form; one code per address per
    `email_code_interval_s`."""
    sb = request.app[SANDBOX_KEY]
    try:
        body = await _json_object(request)
    except PartnerFailure as exc:
        return _email_answer(400, exc.message)
    email = body.get("email")
    if not isinstance(email, str) or not EMAIL_RE.match(email):
        return _email_answer(400, "email is required and must be an e-mail address")
    key = email.lower()
    now = sb.clock()
    last = sb.email_codes.get(key)
    wait_ms = int(sb.cfg.email_code_interval_s * 1000)
    if last is not None and now - last["sentAt"] < wait_ms:
        left = (wait_ms - (now - last["sentAt"]) + 999) // 1000
        return _email_answer(429, f"too many requests for this address: retry in {left} s")
    code = f"{int(hashlib.sha256(f'{key}{now}'.encode()).hexdigest(), 16) % 1_000_000:06d}"
    sb.email_codes[key] = {"code": code, "sentAt": now}
    return _email_answer(200, "verification code sent")


# --- onboarding ----------------------------------------------------------------------------------


def _check_groups(req: OnboardingShareRequest) -> None:
    for name in ("request_id", "partner_user_id", "customer_type"):
        if not getattr(req, name):
            raise PartnerFailure(f"{name} is required")
    if req.customer_type == "INDIVIDUAL":
        kyc = req.kyc_info
        if kyc is None:
            raise PartnerFailure("kyc_info is required for customer_type INDIVIDUAL")
        missing = [f for f in ("first_name", "last_name", "nationality") if not getattr(kyc, f)]
        if missing:
            raise PartnerFailure(f"kyc_info.{missing[0]} is required")
    elif req.kyb_info is None or req.kyb_info.entity_details is None:
        raise PartnerFailure("kyb_info.entity_details is required for a business customer")


async def kyc_share(request: web.Request) -> web.Response:
    """POST kyc-share: validates the request's groups; the same request_id answers the same."""
    sb = request.app[SANDBOX_KEY]
    body = await _json_object(request)
    try:
        req = OnboardingShareRequest.model_validate(body)
    except ValidationError as exc:
        raise PartnerFailure(f"invalid request: {first_problem(exc)}") from None
    _check_groups(req)
    assert req.partner_user_id is not None
    known = sb.state.onboardings.get(req.partner_user_id)
    if known is None:
        digest = hashlib.sha256(req.partner_user_id.encode()).hexdigest()[:16]
        known = {
            "platform_user_id": f"PU{digest}",
            "customer_type": req.customer_type,
            "onboarding_status": NOT_ONBOARDED,
        }
        sb.state.onboardings[req.partner_user_id] = known
        sb.commit()
    return respond(partner_ok(known))


# --- quotes --------------------------------------------------------------------------------------


def _rate(rates: dict[str, str], source: str, target: str) -> Decimal:
    rate = rates.get(f"{source}/{target}")
    if rate is None:
        raise PartnerFailure(f"pair {source}/{target} is not supported", PAIR_NOT_SUPPORTED)
    return Decimal(rate)


async def quote(request: web.Request) -> web.Response:
    """POST quotes: from_amount 100..500000, the pair's rate less a 0.1 % fee, an expiry."""
    sb = request.app[SANDBOX_KEY]
    try:
        req = QuoteRequest.model_validate(await _json_object(request))
    except ValidationError as exc:
        raise PartnerFailure(f"invalid request: {first_problem(exc)}") from None
    if not req.from_currency or not req.to_currency:
        raise PartnerFailure("from_currency and to_currency are required")
    if req.from_amount is None:
        raise PartnerFailure("from_amount is required")
    amount = req.from_amount
    if not AMOUNT_MIN <= amount <= AMOUNT_MAX:
        raise PartnerFailure(
            f"sourceAmount must be between {AMOUNT_MIN} and {AMOUNT_MAX}, current value "
            f"{jsonio.decimal_str(amount)}: out of range",
            AMOUNT_OUT_OF_RANGE,
        )
    rate = _rate(sb.cfg.quote_rates, req.from_currency, req.to_currency)
    fee = (amount * FEE_RATE).quantize(Decimal("0.01"))
    to_amount = ((amount - fee) * rate).quantize(Decimal("0.000001"), rounding=ROUND_DOWN)
    expires = sb.clock() + int(sb.cfg.quote_ttl_s * 1000)
    data = {
        "quote_id": new_id("Q"),
        "business_type": req.business_type or "ON_RAMP",
        "quote_type": "STANDARD",
        "from_currency": req.from_currency,
        "to_currency": req.to_currency,
        "from_amount": jsonio.decimal_str(amount),
        "to_amount": jsonio.decimal_str(to_amount),
        "rate": jsonio.decimal_str(rate),
        "fee_amount": jsonio.decimal_str(fee),
        "fee_currency": req.from_currency,
        "expires_at": iso_ms(expires),
        "pricing_note": "sandbox rate less 0.1 % fee",
    }
    sb.state.quotes[data["quote_id"]] = {**data, "expiresTime": expires}
    sb.commit()
    return respond(partner_ok(data))


PROVIDER_ROUTES: list[tuple[str, str, str, Handler]] = [
    ("POST", "/v1/virtual-account/email/send-verify-code", "email_code", send_verify_code),
    ("POST", "/api/v1/onboarding/kyc-share", "kyc_share", partner_route(kyc_share)),
    ("POST", "/api/v1/quotes", "quote", partner_route(quote)),
]
