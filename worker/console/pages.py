"""The console's pages (GET) and its login: server-rendered, nothing changes on a GET."""

from __future__ import annotations

import datetime as dt
import functools
import secrets
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlencode, urlsplit

import aiohttp_jinja2
from aiohttp import web

from worker.console import queries
from worker.console.auth import (
    LOGIN_COOKIE,
    SESSION_COOKIE,
    SESSION_KEY,
    clear_cookie,
    csrf_ok,
    origin_of,
    set_session_cookie,
    token_matches,
)
from worker.console.state import CONSOLE, Console
from worker.errors import ProviderError
from worker.logs import get_logger
from worker.track.tracker import State

log = get_logger(__name__)

Handler = Callable[[web.Request], Awaitable[web.Response]]
# States in which the hosted Travel Rule page can take the payer's details.
HOSTED_STATES = ("needs_details", "rejected")


def add_routes(app: web.Application) -> None:
    """The GET pages and the login."""
    app.router.add_get("/login", login_form)
    app.router.add_post("/login", login)
    app.router.add_get("/", overview)
    app.router.add_get("/deposits", deposit_list)
    app.router.add_get("/deposits/{tx}", deposit_timeline)
    app.router.add_get("/deposits/{tx}/travel-rule", travel_rule)
    app.router.add_get("/events", event_list)
    app.router.add_get("/ledger", ledger_list)
    app.router.add_get("/findings", finding_list)
    app.router.add_get("/addresses", address_list)
    app.router.add_get("/search", search)
    app.router.add_get("/unbooked", unbooked_list)


def render(
    template: str, request: web.Request, context: dict[str, Any], *, status: int = 200
) -> web.Response:
    """A page, with what every page shows: the session (when logged in), its CSRF token and the
    colour scheme."""
    session = request.get(SESSION_KEY)
    console = request.app[CONSOLE]
    common = {
        "session": session,
        "csrf": session.csrf if session else "",
        "dark": console.settings.dark_mode,
    }
    return aiohttp_jinja2.render_template(template, request, {**common, **context}, status=status)


def page(
    template: str,
) -> Callable[[Callable[[web.Request], Awaitable[dict[str, Any]]]], Handler]:
    """A GET handler that returns its template's context, rendered with `render`."""

    def wrap(fn: Callable[[web.Request], Awaitable[dict[str, Any]]]) -> Handler:
        @functools.wraps(fn)
        async def handler(request: web.Request) -> web.Response:
            return render(template, request, await fn(request))

        return handler

    return wrap


def _remote(request: web.Request) -> str:
    return request.remote or "-"


async def login_form(request: web.Request, *, error: str = "", status: int = 200) -> web.Response:
    """The login form; its CSRF value is a cookie of its own (there is no session yet)."""
    # The browser's value is kept: a second tab (or a favicon request sent to the login) must
    # not invalidate the form already shown.
    nonce = request.cookies.get(LOGIN_COOKIE) or ""
    if len(nonce) < 32:
        nonce = secrets.token_urlsafe(24)
    response = render("login.html", request, {"error": error, "login_csrf": nonce}, status=status)
    response.set_cookie(
        LOGIN_COOKIE, nonce, path="/login", httponly=True, samesite="Strict", secure=request.secure
    )
    return response


async def login(request: web.Request) -> web.StreamResponse:
    """Check the token (constant time, throttled per address); a session on success."""
    console = request.app[CONSOLE]
    form = await request.post()
    nonce = request.cookies.get(LOGIN_COOKIE, "")
    if not nonce or not csrf_ok(str(form.get("csrf", "")), nonce):
        raise web.HTTPForbidden(text="missing or wrong CSRF token")
    address = _remote(request)
    wait = console.throttle.wait_s(address)
    if wait > 0:
        response = await login_form(
            request, error=f"Too many wrong tokens: try again in {wait:.0f} s.", status=429
        )
        response.headers["Retry-After"] = str(max(1, round(wait)))
        return response
    try:
        right = token_matches(str(form.get("token", "")), console.tokens)
    except (OSError, UnicodeDecodeError) as exc:
        log.error("console token file unreadable", error=type(exc).__name__)
        return await login_form(request, error="The console token cannot be read.", status=503)
    if not right:
        console.throttle.failed(address)
        log.warning("console login refused", remote=address)
        return await login_form(request, error="Wrong token.", status=401)
    console.throttle.succeeded(address)
    operator = operator_name(str(form.get("operator", "")))
    # A session the browser held before is ended: a login always gets a fresh id.
    console.sessions.end(request.cookies.get(SESSION_COOKIE))
    sid, _ = console.sessions.create(operator, right)
    log.info("console login", remote=address, operator=operator)
    response = web.Response(status=303, headers={"Location": "/"})
    set_session_cookie(response, request, sid, console.settings.session_ttl_s)
    clear_cookie(response, request, LOGIN_COOKIE, "/login")
    return response


def operator_name(raw: str) -> str:
    """The name typed at login as recorded with every action: printable characters only (no
    line break or terminal escape reaches a log line or a record), at most 40."""
    return "".join(c for c in raw if c.isprintable()).strip()[:40] or "console"


async def logout(request: web.Request) -> web.StreamResponse:
    """End the session (a POST with the CSRF token, like every change)."""
    request.app[CONSOLE].sessions.end(request.cookies.get(SESSION_COOKIE))
    response = web.Response(status=303, headers={"Location": "/login"})
    clear_cookie(response, request, SESSION_COOKIE, "/")
    return response


MAX_PAGE = 100_000  # beyond: 400 (an offset SQLite cannot hold would be a 500)


def _page(request: web.Request) -> int:
    raw = request.query.get("page", "1")
    try:
        page = max(1, int(raw)) if len(raw) <= 12 else MAX_PAGE + 1
    except ValueError:
        return 1
    if page > MAX_PAGE:
        raise web.HTTPBadRequest(text=f"page must be 1 to {MAX_PAGE}")
    return page


def _paged(rows: list[dict[str, Any]], request: web.Request, page: int) -> dict[str, Any]:
    """A page of rows (one more was read: is there a next page?) with links both ways."""
    more = len(rows) > queries.PAGE_SIZE
    args = {k: v for k, v in request.query.items() if k != "page" and v}

    def link(n: int) -> str:
        return f"{request.path}?{urlencode({**args, 'page': n})}"

    return {
        "rows": rows[: queries.PAGE_SIZE],
        "page": page,
        "prev": link(page - 1) if page > 1 else None,
        "next": link(page + 1) if more else None,
    }


@page("overview.html")
async def overview(request: web.Request) -> dict[str, Any]:
    """What waits on a person (by time left), what failed, polls and the last reconciliation."""
    console = request.app[CONSOLE]
    rules = console.ops.rules
    return await console.store.read(lambda db: queries.overview(db, rules))


@page("deposit.html")
async def deposit_timeline(request: web.Request) -> dict[str, Any]:
    """One deposit's timeline."""
    tx = request.match_info["tx"]
    data = await request.app[CONSOLE].store.read(lambda db: queries.timeline(db, tx))
    if data is None:
        raise web.HTTPNotFound(text=f"no deposit {tx}")
    console = request.app[CONSOLE]
    waiting = data["deposit"]["state"] in HOSTED_STATES
    data["hosted"] = bool(console.hosted_origin) and waiting
    # The approve path: stored profiles by name only (never their contents).
    data["profiles"] = sorted(console.ops.profiles.names()) if waiting else []
    data["rejected_profile"] = _rejected_profile(data)
    suggested = _suggested(console, data["deposit"])
    # The profile the provider just rejected is not offered first again (docs/console.md).
    data["suggested"] = None if suggested == data["rejected_profile"] else suggested
    return data


def _rejected_profile(data: dict[str, Any]) -> str | None:
    """For a rejected deposit, the profile of its last submission (the one rejected)."""
    if data["deposit"]["state"] != "rejected":
        return None
    submitted = [a for a in data["actions"] if a["action"] == "submit_profile" and a["profile"]]
    return str(submitted[-1]["profile"]) if submitted else None


def _suggested(console: Console, deposit: dict[str, Any]) -> str | None:
    """The profile that applies to the deposit (by source address, then wallet), if any: the
    one the form selects first."""
    wallet = deposit.get("walletId")
    match = console.ops.profiles.for_deposit(
        int(wallet) if wallet is not None else None, deposit.get("fromAddress")
    )
    return match.name if match is not None else None


@page("deposits.html")
async def deposit_list(request: web.Request) -> dict[str, Any]:
    """Deposits, of one state when asked, latest change first."""
    state = request.query.get("state") or None
    if state is not None and state not in {s.value for s in State}:
        raise web.HTTPBadRequest(text=f"unknown state {state!r}")
    page = _page(request)
    rows = await request.app[CONSOLE].store.read(lambda db: queries.deposit_page(db, state, page))
    return {**_paged(rows, request, page), "state": state, "states": [s.value for s in State]}


@page("events.html")
async def event_list(request: web.Request) -> dict[str, Any]:
    """Stored events (never a body), newest first, by status and type."""
    status = request.query.get("status") or None
    event_type = request.query.get("type") or None
    page = _page(request)
    rows = await request.app[CONSOLE].store.read(
        lambda db: queries.event_page(db, status, event_type, page)
    )
    return {**_paged(rows, request, page), "status": status, "type": event_type}


@page("ledger.html")
async def ledger_list(request: web.Request) -> dict[str, Any]:
    """One UTC day of the ledger (today by default)."""
    day = request.query.get("day") or dt.datetime.now(dt.UTC).date().isoformat()
    try:
        day = dt.date.fromisoformat(day).isoformat()
    except ValueError:
        raise web.HTTPBadRequest(text="day must be YYYY-MM-DD") from None
    page = _page(request)
    rows = await request.app[CONSOLE].store.read(lambda db: queries.ledger_page(db, day, page))
    return {**_paged(rows, request, page), "day": day}


@page("findings.html")
async def finding_list(request: web.Request) -> dict[str, Any]:
    """Reconciliation findings, the open ones by default."""
    open_only = request.query.get("all") != "1"
    page = _page(request)
    rows = await request.app[CONSOLE].store.read(
        lambda db: queries.finding_page(db, open_only, page)
    )
    today = dt.datetime.now(dt.UTC).date().isoformat()
    return {**_paged(rows, request, page), "open_only": open_only, "today": today}


MAX_SEARCH = 200  # longer than any transactionId, txHash or address


@page("search.html")
async def search(request: web.Request) -> dict[str, Any]:
    """Deposits and source addresses by transactionId, txHash or address (exact, the hash and
    addresses whatever their case)."""
    text = request.query.get("q", "").strip()
    if len(text) > MAX_SEARCH:
        raise web.HTTPBadRequest(text=f"a search is at most {MAX_SEARCH} characters")
    found: dict[str, Any] = {
        "deposits": [],
        "addresses": [],
        "findings": [],
        "abnormal": [],
        "more": set(),
    }
    if text:
        found = await request.app[CONSOLE].store.read(lambda db: queries.search(db, text))
    return {"q": text, **found}


@page("unbooked.html")
async def unbooked_list(request: web.Request) -> dict[str, Any]:
    """Deposits credited or completed at the provider that the ledger does not hold."""
    page = _page(request)
    rows = await request.app[CONSOLE].store.read(lambda db: queries.unbooked_page(db, page))
    return _paged(rows, request, page)


@page("addresses.html")
async def address_list(request: web.Request) -> dict[str, Any]:
    """The registered source addresses and their status."""
    return {"rows": await request.app[CONSOLE].store.read(queries.address_list)}


async def travel_rule(request: web.Request) -> web.Response:
    """The provider's hosted Travel Rule page for one deposit, in an iframe."""
    console = request.app[CONSOLE]
    tx = request.match_info["tx"]
    data = await console.store.read(lambda db: queries.timeline(db, tx))
    if data is None:
        raise web.HTTPNotFound(text=f"no deposit {tx}")
    deposit = data["deposit"]
    context: dict[str, Any] = {"deposit": deposit, "url": None, "error": None}
    if console.hosted_origin is None:
        context["error"] = "console.hosted_url is not set: the hosted page cannot be shown."
    elif deposit["walletId"] is None:
        context["error"] = "The deposit's wallet is not known yet."
    else:
        try:
            url = await console.ops.travel_rule_link(int(deposit["walletId"]), tx, "en")
        except ProviderError as exc:
            context["error"] = f"The provider gave no link: {exc}"
        else:
            if origin_of(url) != console.hosted_origin:
                context["error"] = (
                    f"The provider's link is on {origin_of(url)}, not on console.hosted_url"
                    f" ({console.hosted_origin}): it is not shown."
                )
            else:
                context["url"] = deep_link(url, tx, console.settings.dark_mode)
    context["origin"] = console.hosted_origin or ""
    return render("travel_rule.html", request, context)


def deep_link(url: str, tx: str, dark: bool) -> str:
    """The link with the deposit's transactionId (skip the list) and darkMode."""
    parts = urlsplit(url)
    extra = urlencode({"transactionId": tx, "darkMode": "true" if dark else "false"})
    query = f"{parts.query}&{extra}" if parts.query else extra
    return parts._replace(query=query).geturl()
