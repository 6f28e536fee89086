"""The console against what an attacker would try: redirects off the console, cookies without
their flags, a session kept across a login, paging and dates that would break a query, notes
cut silently, future days, ids that point a form elsewhere, the throttle's memory, faults that
would answer without the security headers."""

from __future__ import annotations

import asyncio
import datetime as dt
import re
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp_jinja2
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from pydantic import ValidationError
from yarl import URL

from tests.support.stacks import MakeStack
from worker.config.settings import ConsoleSettings
from worker.console.app import build_console
from worker.console.auth import FREE_FAILURES, MAX_ADDRESSES, Sessions, Throttle, guard
from worker.dev.harness import Stack
from worker.errors import StorageError
from worker.store import findings as findings_store
from worker.store import operator as operator_store
from worker.store.findings import Finding


def _client() -> aiohttp.ClientSession:
    # unsafe: the jar keeps cookies of an IP address (the console listens on 127.0.0.1).
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))


async def _login(session: aiohttp.ClientSession, stack: Stack) -> tuple[str, list[str]]:
    """Log in; (the page's CSRF token, every Set-Cookie seen on the way)."""
    cookies: list[str] = []
    async with session.get(stack.console_url + "/login") as answer:
        cookies += answer.headers.getall("Set-Cookie", [])
        found = re.search(r'name="csrf" value="([^"]+)"', await answer.text())
    assert found
    async with session.post(
        stack.console_url + "/login",
        data={"csrf": found.group(1), "token": stack.console_token, "operator": "ana"},
        allow_redirects=False,
    ) as answer:
        assert answer.status == 303
        cookies += answer.headers.getall("Set-Cookie", [])
    async with session.get(stack.console_url + "/") as answer:
        csrf = re.search(r'name="csrf" value="([^"]+)"', await answer.text())
    assert csrf
    return csrf.group(1), cookies


async def _post(
    session: aiohttp.ClientSession, stack: Stack, path: str, data: dict[str, str]
) -> aiohttp.ClientResponse:
    async with session.post(stack.console_url + path, data=data, allow_redirects=False) as answer:
        await answer.read()
        return answer


async def _recorded(stack: Stack) -> list[dict[str, Any]]:
    return await stack.store.read(lambda db: operator_store.recent(db))


async def test_an_action_never_sends_the_browser_off_the_console(start_stack: MakeStack) -> None:
    """A posted `back` that a browser would read as another site (a tab or backslash after the
    slash, a scheme) or that would break the header sends the browser to the overview."""
    stack = await start_stack(console=True, scheduler=False)
    yesterday = (dt.datetime.now(dt.UTC).date() - dt.timedelta(days=1)).isoformat()
    async with _client() as session:
        csrf, _ = await _login(session, stack)
        for back in ("/\t/evil.example", "/\\evil.example", "https://evil.example", "/x\r\nA: b"):
            answer = await _post(
                session, stack, "/reconcile", {"csrf": csrf, "day": yesterday, "back": back}
            )
            assert answer.status == 303 and answer.headers["Location"] == "/", back
        answer = await _post(
            session, stack, "/reconcile", {"csrf": csrf, "day": yesterday, "back": "/findings"}
        )
        assert answer.headers["Location"] == "/findings"


async def test_days_and_notes_are_checked_before_anything_runs(start_stack: MakeStack) -> None:
    """A day that has not begun and a note over 500 characters are refused (400) and nothing is
    reconciled or recorded; a paging or date parameter no query can take is 400, not 500."""
    stack = await start_stack(console=True, scheduler=False)
    tomorrow = (dt.datetime.now(dt.UTC).date() + dt.timedelta(days=1)).isoformat()
    yesterday = (dt.datetime.now(dt.UTC).date() - dt.timedelta(days=1)).isoformat()
    async with _client() as session:
        csrf, _ = await _login(session, stack)
        answer = await _post(session, stack, "/reconcile", {"csrf": csrf, "day": tomorrow})
        assert answer.status == 400
        long_note = {"csrf": csrf, "day": yesterday, "note": "x" * 501}
        assert (await _post(session, stack, "/reconcile", long_note)).status == 400
        assert await _recorded(stack) == []
        for path in (
            "/deposits?page=99999999999999999999",
            "/events?page=1000000000",
            "/ledger?day=2026-13-01",
        ):
            async with session.get(stack.console_url + path) as got:
                assert got.status == 400, path
        async with session.get(stack.console_url + "/findings?page=-3") as got:
            assert got.status == 200 and "page 1" in await got.text()


async def test_every_set_cookie_carries_httponly_and_samesite(start_stack: MakeStack) -> None:
    """The login form's cookie, the session cookie and the removals at login and logout all
    carry HttpOnly and SameSite=Strict."""
    stack = await start_stack(console=True, scheduler=False)
    async with _client() as session:
        csrf, cookies = await _login(session, stack)
        async with session.post(
            stack.console_url + "/logout", data={"csrf": csrf}, allow_redirects=False
        ) as answer:
            cookies += answer.headers.getall("Set-Cookie", [])
    names = {c.split("=", 1)[0] for c in cookies}
    assert names == {"depositd_login", "depositd_console"} and len(cookies) == 4
    for cookie in cookies:
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie, cookie


async def test_a_login_ends_the_session_held_before(start_stack: MakeStack) -> None:
    """Logging in again from a browser that has a session gives a new id and ends the old one."""
    stack = await start_stack(console=True, scheduler=False)
    async with _client() as session:
        await _login(session, stack)
        first = session.cookie_jar.filter_cookies(URL(stack.console_url))["depositd_console"].value
        await _login(session, stack)
        second = session.cookie_jar.filter_cookies(URL(stack.console_url))["depositd_console"].value
    assert first != second
    async with (
        aiohttp.ClientSession(cookies={"depositd_console": first}) as old,
        old.get(stack.console_url + "/", allow_redirects=False) as answer,
    ):
        assert answer.status == 303 and answer.headers["Location"] == "/login"


def test_the_throttle_counts_ipv6_by_prefix_and_stays_bounded() -> None:
    """Wrong tokens from addresses of one IPv6 /64 count together; a flood of addresses keeps
    at most MAX_ADDRESSES in memory; thousands of failures never overflow the delay."""
    now = [0.0]
    throttle = Throttle(clock=lambda: now[0])
    for n in range(FREE_FAILURES):
        throttle.failed(f"2001:db8::{n + 1:x}")
    assert throttle.wait_s("2001:db8::ffff") > 0
    assert throttle.wait_s("2001:db8:0:1::1") == 0
    for n in range(MAX_ADDRESSES + 100):
        throttle.failed(f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}")
    assert len(throttle) == MAX_ADDRESSES
    for _ in range(2000):
        now[0] += 400
        throttle.failed("192.0.2.7")
    assert 0 < throttle.wait_s("192.0.2.7") <= 300


def test_a_hosted_url_cannot_add_to_the_content_security_policy(tmp_path: Path) -> None:
    """hosted_url goes into the CSP: spaces, ; , quotes or a missing host are refused."""
    token = tmp_path / "token"
    for bad in (
        "https://h.example; script-src *",
        "https://h.example 'unsafe-inline'",
        "https:///x",
    ):
        with pytest.raises(ValidationError):
            ConsoleSettings(token_file=token, hosted_url=bad)
    assert ConsoleSettings(token_file=token, hosted_url="https://h.example/hosted/").hosted_url == (
        "https://h.example/hosted"
    )


def test_an_id_cannot_point_a_form_or_link_at_another_path(tmp_path: Path) -> None:
    """An eventId or transactionId with "/", "?" or "#" stays one path segment in the Replay
    form's action and in the deposit link."""
    app = build_console(ConsoleSettings(token_file=tmp_path / "t"), None, None, lambda: None)  # type: ignore[arg-type]
    html = (
        aiohttp_jinja2.get_env(app)
        .get_template("events.html")
        .render(
            rows=[
                {
                    "received_at": None,
                    "event_id": "x/../../findings/1/ack?",
                    "event_type": "t",
                    "transaction_id": "T/../../logout#",
                    "status": "failed",
                    "error": None,
                }
            ],
            csrf="c",
            session=None,
            dark=False,
            prev=None,
            next=None,
            page=1,
            status=None,
            type=None,
        )
    )
    assert 'action="/events/x%2F..%2F..%2Ffindings%2F1%2Fack%3F/retry"' in html
    assert 'href="/deposits/T%2F..%2F..%2Flogout%23"' in html


async def test_a_fault_answers_without_detail_and_with_the_headers() -> None:
    """A closed store is 503 and any other fault 500, both with the security headers and no
    traceback in the page."""

    async def closed(request: web.Request) -> web.Response:
        raise StorageError("store is closed")

    async def broken(request: web.Request) -> web.Response:
        raise RuntimeError("secret-detail")

    app = web.Application(middlewares=[guard(Sessions(60), {"X-Frame-Options": "DENY"})])
    app.router.add_get("/static/closed", closed)
    app.router.add_get("/static/broken", broken)
    async with TestClient(TestServer(app)) as client:
        answer = await client.get("/static/closed")
        assert answer.status == 503 and answer.headers["X-Frame-Options"] == "DENY"
        answer = await client.get("/static/broken")
        text = await answer.text()
        assert answer.status == 500 and answer.headers["X-Frame-Options"] == "DENY"
        assert "secret-detail" not in text and "Traceback" not in text


async def test_a_double_click_reconciles_a_day_once(start_stack: MakeStack) -> None:
    """Two requests to reconcile the same day at once: one runs, the other is refused (409)
    and recorded as refused."""
    stack = await start_stack(console=True, scheduler=False)
    stack.sandbox.set_fault("settlement", "latency", count=None, latency_s=0.5)
    yesterday = (dt.datetime.now(dt.UTC).date() - dt.timedelta(days=1)).isoformat()
    async with _client() as session:
        csrf, _ = await _login(session, stack)
        form = {"csrf": csrf, "day": yesterday, "note": "twice"}
        first, second = await asyncio.gather(
            _post(session, stack, "/reconcile", form), _post(session, stack, "/reconcile", form)
        )
    assert sorted([first.status, second.status]) == [303, 409]
    outcomes = [r["outcome"] for r in await _recorded(stack)]
    assert len(outcomes) == 2 and "refused: already running" in outcomes


async def test_the_operator_name_is_recorded_without_control_characters(
    start_stack: MakeStack,
) -> None:
    """A name typed with a line break or a terminal escape is recorded printable only."""
    stack = await start_stack(console=True, scheduler=False)
    yesterday = (dt.datetime.now(dt.UTC).date() - dt.timedelta(days=1)).isoformat()
    async with _client() as session:
        async with session.get(stack.console_url + "/login") as answer:
            found = re.search(r'name="csrf" value="([^"]+)"', await answer.text())
        assert found
        login = {"csrf": found.group(1), "token": stack.console_token}
        login["operator"] = "ana\r\nforged line\x1b[31m"
        async with session.post(stack.console_url + "/login", data=login) as answer:
            html = await answer.text()
        csrf = re.search(r'name="csrf" value="([^"]+)"', html)
        assert csrf
        await _post(session, stack, "/reconcile", {"csrf": csrf.group(1), "day": yesterday})
    (row,) = await _recorded(stack)
    assert row["remote"] == "anaforged line[31m@127.0.0.1"


async def test_a_second_acknowledgement_does_not_replace_the_first(
    start_stack: MakeStack,
) -> None:
    """A finding acknowledged already keeps who, when and why; the second try is refused (409)
    and recorded as refused."""
    stack = await start_stack(console=True, scheduler=False)
    finding = Finding(day="2026-01-02", kind="extra", subject="0xnotbooked", report_amount="1")
    (finding_id,) = await stack.store.write(
        lambda db: findings_store.save_findings(db, finding.day, [finding], "2026-01-03T00:00:00Z")
    )
    async with _client() as session:
        csrf, _ = await _login(session, stack)
        path = f"/findings/{finding_id}/ack"
        assert (await _post(session, stack, path, {"csrf": csrf, "note": "first"})).status == 303
        assert (await _post(session, stack, path, {"csrf": csrf, "note": "second"})).status == 409
    row = await stack.store.read(lambda db: findings_store.get_finding(db, finding_id))
    assert row is not None and row["note"] == "first"
    outcomes = [r["outcome"] for r in await _recorded(stack)]
    assert outcomes == ["refused: acknowledged already by ana", "acknowledged"]


async def test_a_rotated_token_ends_the_sessions_it_opened(start_stack: MakeStack) -> None:
    """After the token file gets a new token, a session opened with the old one opens nothing
    (back to the login); the new token logs in."""
    stack = await start_stack(console=True, scheduler=False)
    async with _client() as session:
        await _login(session, stack)
        stack.console_token = "a-new-token-after-a-leak"
        stack.console_token_path.write_text(stack.console_token + "\n", encoding="utf-8")
        async with session.get(stack.console_url + "/", allow_redirects=False) as answer:
            assert answer.status == 303 and answer.headers["Location"] == "/login"
        await _login(session, stack)
        async with session.get(stack.console_url + "/", allow_redirects=False) as answer:
            assert answer.status == 200


async def test_a_change_is_never_left_without_its_record(
    start_stack: MakeStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the record of an acknowledgement cannot be written, the acknowledgement is not
    kept either (one transaction); the answer is a 500 without detail."""
    stack = await start_stack(console=True, scheduler=False)
    finding = Finding(day="2026-01-02", kind="extra", subject="0xnotbooked", report_amount="1")
    (finding_id,) = await stack.store.write(
        lambda db: findings_store.save_findings(db, finding.day, [finding], "2026-01-03T00:00:00Z")
    )

    def unwritable(*args: Any, **kwargs: Any) -> int:
        raise RuntimeError("operator_actions unwritable")

    async with _client() as session:
        csrf, _ = await _login(session, stack)
        monkeypatch.setattr(operator_store, "record", unwritable)
        answer = await _post(
            session, stack, f"/findings/{finding_id}/ack", {"csrf": csrf, "note": "n"}
        )
    assert answer.status == 500
    row = await stack.store.read(lambda db: findings_store.get_finding(db, finding_id))
    assert row is not None and row["acknowledged_at"] is None
