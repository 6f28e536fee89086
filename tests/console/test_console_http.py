"""The console over plain HTTP (no browser): headers, the login throttle, sessions, logout, the
CSRF check and no inline script, against a real stack with its console."""

from __future__ import annotations

import re

import aiohttp

from tests.support.stacks import MakeStack
from worker.console.auth import FREE_FAILURES, Sessions
from worker.dev.harness import Stack

PAGES = (
    "/",
    "/deposits",
    "/events",
    "/ledger",
    "/findings",
    "/addresses",
    "/unbooked",
    "/search?q=T1",
)


def _client() -> aiohttp.ClientSession:
    # unsafe: the jar keeps cookies of an IP address (the console listens on 127.0.0.1).
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))


async def _login_form(session: aiohttp.ClientSession, stack: Stack) -> str:
    async with session.get(stack.console_url + "/login") as answer:
        html = await answer.text()
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found
    return found.group(1)


async def _try(session: aiohttp.ClientSession, stack: Stack, token: str) -> aiohttp.ClientResponse:
    csrf = await _login_form(session, stack)
    async with session.post(
        stack.console_url + "/login",
        data={"csrf": csrf, "token": token, "operator": "ana"},
        allow_redirects=False,
    ) as answer:
        await answer.read()
        return answer


async def test_every_answer_carries_the_security_headers(start_stack: MakeStack) -> None:
    """CSP framing only the hosted page's origin, no framing of the console, no referrer,
    no sniffing, no caching: on the login page, on every page and on a refusal."""
    stack = await start_stack(console=True, scheduler=False)
    async with _client() as session:
        answers = [await _try(session, stack, stack.console_token)]
        assert answers[0].status == 303
        for path in PAGES:
            async with session.get(stack.console_url + path, allow_redirects=False) as answer:
                assert answer.status == 200, path
                html = await answer.text()
                answers.append(answer)
            assert not re.search(r"<script(?![^>]*\bsrc=)", html), path  # no inline script
            assert " style=" not in html, path
        async with session.post(stack.console_url + "/reconcile", data={}) as answer:
            assert answer.status == 403
            answers.append(answer)
    for answer in answers:
        csp = answer.headers["Content-Security-Policy"]
        assert f"frame-src {stack.sandbox_url};" in csp
        assert "script-src 'self';" in csp and "frame-ancestors 'none'" in csp
        assert answer.headers["X-Frame-Options"] == "DENY"
        assert answer.headers["Referrer-Policy"] == "no-referrer"
        assert answer.headers["X-Content-Type-Options"] == "nosniff"
        assert answer.headers["Cache-Control"] == "no-store"


async def test_wrong_tokens_slow_further_tries_from_that_address(start_stack: MakeStack) -> None:
    """Five wrong tokens are refused (401); after them even the right one waits (429 with
    Retry-After) until the delay has passed."""
    stack = await start_stack(console=True, scheduler=False)
    async with _client() as session:
        for _ in range(FREE_FAILURES):
            assert (await _try(session, stack, "wrong")).status == 401
        refused = await _try(session, stack, stack.console_token)
        assert refused.status == 429 and int(refused.headers["Retry-After"]) >= 1
        assert "depositd_console" not in {c.key for c in session.cookie_jar}


async def test_logout_ends_the_session(start_stack: MakeStack) -> None:
    """After logout the old session cookie opens nothing; a POST without the CSRF token is 403."""
    stack = await start_stack(console=True, scheduler=False)
    async with _client() as session:
        assert (await _try(session, stack, stack.console_token)).status == 303
        async with session.get(stack.console_url + "/") as answer:
            html = await answer.text()
        csrf = re.search(r'name="csrf" value="([^"]+)"', html)
        assert csrf
        async with session.post(stack.console_url + "/logout", allow_redirects=False) as answer:
            assert answer.status == 403
        async with session.post(
            stack.console_url + "/logout", data={"csrf": csrf.group(1)}, allow_redirects=False
        ) as answer:
            assert answer.status == 303 and answer.headers["Location"] == "/login"
        async with session.get(stack.console_url + "/", allow_redirects=False) as answer:
            assert answer.status == 303 and answer.headers["Location"] == "/login"


def test_a_session_expires_after_its_ttl() -> None:
    """A session is valid until its time to live has passed, then gone."""
    now = [1000.0]
    sessions = Sessions(60, clock=lambda: now[0])
    sid, _ = sessions.create("ana")
    now[0] += 59
    assert sessions.get(sid) is not None
    now[0] += 2
    assert sessions.get(sid) is None
