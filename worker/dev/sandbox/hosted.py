"""The provider's hosted deposit Travel Rule page, served by the sandbox under /hosted.

`GET {hosted}/{lng}/deposit-travel-rule?token=...` is what a merchant embeds in an iframe (the
link operation issues the URL). The token, from the link operation, names a wallet (and maybe
one deposit) and expires; it travels in the URL and in the form, never in a cookie, so the page
works in a sandboxed iframe without allow-same-origin. Screen 1 is the wallet's history queue
(whiteListStatus init and rejected); screen 2 one deposit and the payer form, which posts back
to the same path and goes through the submit operation itself (`Sandbox.submit` under the same
Idempotency-Key rules as the signed API). Payer data goes to the state only: never to a log.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from importlib import resources
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from worker.dev.sandbox import hosted_html as ui
from worker.dev.sandbox import idempotency
from worker.dev.sandbox.handle import SANDBOX_KEY, Sandbox
from worker.dev.sandbox.records import Order
from worker.errors import WalletCodeError
from worker.provider.models import WhiteListStatus
from worker.provider.payer import ENTITY_FIELDS, INDIVIDUAL_FIELDS, fields_named

PREFIX = "/hosted/"
PAGE = PREFIX + "{lng}/deposit-travel-rule"
STATIC = PREFIX + "static/{name}"
SUBMIT_PATH = "/v1/wallet/deposit-whitelist/transactions/{}/submit"
STATIC_FILES = {
    "deposit-travel-rule.js": "text/javascript",
    "deposit-travel-rule.css": "text/css",
    "deposit-travel-rule-dark.css": "text/css",
}
# Refusals the payer fixes on the form; every other code ends the form (a notice instead).
FORM_CODES = frozenset({"10000102", "10000103", "10000106"})
COMMON_FIELDS = ("correspondentType", "countryCode", "walletType", "walletLabel", "addressType")
FORM_FIELDS = (
    *COMMON_FIELDS,
    *ENTITY_FIELDS,
    *INDIVIDUAL_FIELDS,
    "provider",
    "othersPleaseSpecify",
)
_TRUE, _FALSE = frozenset({"true", "1", "yes"}), frozenset({"false", "0", "no"})
_HOST = re.compile(r"[A-Za-z0-9.\-:\[\]]+")


class PageRefused(Exception):
    """The page cannot be shown: an HTTP status and a message page (no deposit data)."""

    def __init__(self, status: int, element_id: str, title: str, text: str) -> None:
        super().__init__(text)
        self.status, self.element_id, self.title, self.text = status, element_id, title, text


def dark_mode(raw: str | None) -> bool:
    """darkMode from the query: true, 1, yes or false, 0, no (anything else: light)."""
    return (raw or "").strip().lower() in _TRUE


def _grant(sb: Sandbox, token: str | None) -> Mapping[str, Any]:
    """The token's grant {walletId, transactionId, expiresTime}, or a refusal."""
    if not token:
        raise PageRefused(401, "token-error", "Link incomplete", "This link has no access token.")
    grant = sb.state.travel_rule_tokens.get(token)
    if grant is None:
        raise PageRefused(403, "token-error", "Link not valid", "This link is not valid.")
    if sb.clock() >= int(grant["expiresTime"]):
        raise PageRefused(
            403, "token-error", "Link expired", "This link has expired; ask for a new one."
        )
    return grant


def _scope(grant: Mapping[str, Any], wanted: str | None) -> str | None:
    """The deposit to show: the query's, else the one the link was issued for (a link issued
    for one deposit shows that deposit only)."""
    bound = grant.get("transactionId")
    if bound and wanted and wanted != bound:
        raise PageRefused(
            403, "notice", "Other deposit", "This link was issued for another deposit."
        )
    return wanted or bound or None


def _queue(sb: Sandbox, wallet_id: int) -> list[Order]:
    """The wallet's deposits awaiting details: the history queues init and rejected."""
    rows = [
        *sb.state.history(white_list_status=WhiteListStatus.INIT, wallet_id=wallet_id),
        *sb.state.history(white_list_status=WhiteListStatus.REJECTED, wallet_id=wallet_id),
    ]
    return sorted(rows, key=lambda o: (o.create_time, o.transaction_id))


def _owned(sb: Sandbox, wallet_id: int, tx_id: str) -> Order:
    order = sb.state.orders.get(tx_id)
    if order is None or order.wallet_id != wallet_id:
        raise PageRefused(
            404, "notice", "Deposit not found", "No deposit with this id in this wallet."
        )
    return order


def _awaiting(sb: Sandbox, wallet_id: int, tx_id: str) -> Order:
    """The deposit, if it is in the wallet's queue; a clear message otherwise."""
    order = _owned(sb, wallet_id, tx_id)
    if order in _queue(sb, wallet_id):
        return order
    wls = order.white_list_status
    if wls is WhiteListStatus.PENDING:
        text = "Details for this deposit were submitted and are pending review."
    elif wls is None:
        text = "This deposit does not need Travel Rule details."
    else:
        text = "This deposit is not waiting for Travel Rule details any more."
    raise PageRefused(409, "notice", "Nothing to do", text)


def _lng(request: web.Request) -> str:
    lng = request.match_info["lng"]
    # The link operation's rule for lng; the page itself is in English whatever it says.
    if not (lng.replace("-", "").isalpha() and len(lng) <= 10):
        raise web.HTTPNotFound()
    return lng


def _html(request: web.Request, text: str, status: int = 200) -> web.Response:
    resp = web.Response(text=text, status=status, content_type="text/html", charset="utf-8")
    host = request.host if _HOST.fullmatch(request.host or "") else ""
    own = f" {request.scheme}://{host}" if host else ""
    # 'self' plus the page's own origin spelled out: in a sandboxed frame without
    # allow-same-origin the document's origin is opaque.
    resp.headers["Content-Security-Policy"] = (
        f"default-src 'self'{own}; form-action 'self'{own}; frame-ancestors *; "
        "base-uri 'none'; object-src 'none'"
    )
    resp.headers["Cache-Control"] = "no-store"
    resp.headers["Referrer-Policy"] = "no-referrer"  # the token is in the URL
    resp.headers["X-Content-Type-Options"] = "nosniff"
    return resp


def _refused(request: web.Request, lng: str, dark: bool, exc: PageRefused) -> web.Response:
    body = ui.message(exc.element_id, exc.title, exc.text)
    return _html(request, ui.document(lng, dark, exc.element_id, body), exc.status)


def _form_page(
    request: web.Request, lng: str, order: Order, st: ui.FormState, status: int
) -> web.Response:
    body = ui.deposit_summary(order) + "\n" + ui.payer_form(st)
    return _html(request, ui.document(lng, st.dark, "form", body), status)


def _new_state(token: str, order: Order, dark: bool, sb: Sandbox, **kw: Any) -> ui.FormState:
    # A fresh Idempotency-Key per render: a refused form is sent again under a new key.
    key = "hosted-" + secrets.token_urlsafe(18)
    return ui.FormState(token, order.transaction_id, key, dark, providers=sb.state.providers, **kw)


async def page(request: web.Request) -> web.Response:
    """GET: the token's queue (screen 1) or one deposit's form (screen 2, deep link)."""
    lng = _lng(request)
    sb = request.app[SANDBOX_KEY]
    q = request.query
    dark = dark_mode(q.get("darkMode"))
    try:
        token = q.get("token") or ""
        grant = _grant(sb, token)
        wallet_id = int(grant["walletId"])
        tx_id = _scope(grant, q.get("transactionId") or None)
        if tx_id is None:
            keep = {"token": token, **({"darkMode": q["darkMode"]} if "darkMode" in q else {})}
            link = urlencode(keep)
            body = ui.deposit_list(_queue(sb, wallet_id), link)
            return _html(request, ui.document(lng, dark, "list", body))
        order = _awaiting(sb, wallet_id, tx_id)
    except PageRefused as exc:
        return _refused(request, lng, dark, exc)
    return _form_page(request, lng, order, _new_state(token, order, dark, sb, values={}), 200)


def payer_body(form: Mapping[str, str]) -> dict[str, str]:
    """The submit body from the form: filled fields that belong to the chosen types only."""
    value = {name: (form.get(name) or "").strip() for name in FORM_FIELDS}
    fields = list(COMMON_FIELDS)
    kind = value["correspondentType"]
    fields += (
        ENTITY_FIELDS if kind == "ENTITY" else INDIVIDUAL_FIELDS if kind == "INDIVIDUAL" else ()
    )
    wallet = value["walletType"]
    fields += (
        ["provider"] if wallet == "VASP" else ["othersPleaseSpecify"] if wallet == "OTHERS" else []
    )
    return {name: value[name] for name in fields if value[name]}


async def submit(request: web.Request) -> web.Response:
    """POST: the payer form goes through the submit operation under the form's key."""
    lng = _lng(request)
    sb = request.app[SANDBOX_KEY]
    form = {k: v for k, v in (await request.post()).items() if isinstance(v, str)}
    dark = dark_mode(form.get("darkMode"))
    try:
        token = form.get("token", "")
        grant = _grant(sb, token)
        tx_id = _scope(grant, form.get("transactionId") or None)
        if tx_id is None:
            raise PageRefused(400, "notice", "No deposit", "The form names no deposit.")
        order = _owned(sb, int(grant["walletId"]), tx_id)
        key = form.get("idempotencyKey", "")
        if not key:
            raise PageRefused(400, "notice", "Form incomplete", "Reload the page and try again.")
    except PageRefused as exc:
        return _refused(request, lng, dark, exc)
    body = payer_body(form)
    print_ = idempotency.dict_fingerprint("POST", SUBMIT_PATH.format(tx_id), body)
    try:
        answer, _ran = idempotency.run_once(sb, key, print_, lambda: sb.submit(tx_id, body))
    except WalletCodeError as exc:
        if exc.code not in FORM_CODES:
            refusal = PageRefused(409, "notice", f"Not submitted ({exc.code})", exc.msg)
            return _refused(request, lng, dark, refusal)
        kept = {name: form.get(name, "") for name in FORM_FIELDS}
        st = _new_state(
            token,
            order,
            dark,
            sb,
            values=kept,
            error_code=exc.code,
            error_message=exc.msg,
            error_fields=fields_named(exc.msg, body) or [],
        )
        return _form_page(request, lng, order, st, 422)
    data = answer["data"]
    done = ui.confirmation(str(data["transactionId"]), data.get("whiteListStatus"))
    return _html(request, ui.document(lng, dark, "submitted", done))


async def static(request: web.Request) -> web.Response:
    """The page's script and stylesheets (files shipped next to this module)."""
    name = request.match_info["name"]
    kind = STATIC_FILES.get(name)
    if kind is None:
        raise web.HTTPNotFound()
    text = resources.files("worker.dev.sandbox").joinpath("static", name).read_text("utf-8")
    resp = web.Response(text=text, content_type=kind, charset="utf-8")
    resp.headers["Cache-Control"] = "no-cache"
    resp.headers["X-Content-Type-Options"] = "nosniff"
    return resp


def add_routes(app: web.Application) -> None:
    """Register the hosted page under /hosted/ (unsigned: the token authenticates)."""
    app.router.add_get(STATIC, static)
    app.router.add_get(PAGE, page)
    app.router.add_post(PAGE, submit)
