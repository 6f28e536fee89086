"""The console's approve path over plain HTTP: a deposit waiting for payer details offers the
stored profiles by name (never their contents); the post needs the CSRF token, is recorded,
submits once, and is refused (409) once the deposit no longer waits."""

from __future__ import annotations

import re

import aiohttp

from tests.support.stacks import MakeStack
from worker.dev.harness import Stack
from worker.store import operator as operator_store

NO_PROFILE = "TConsoleSubmitNoProfile0000000001"  # wallet 1001 has no fallback profile


async def _login(session: aiohttp.ClientSession, stack: Stack) -> str:
    """Log in as "ana"; the session's CSRF token."""
    async with session.get(stack.console_url + "/login") as answer:
        found = re.search(r'name="csrf" value="([^"]+)"', await answer.text())
    assert found
    async with session.post(
        stack.console_url + "/login",
        data={"csrf": found.group(1), "token": stack.console_token, "operator": "ana"},
        allow_redirects=False,
    ) as answer:
        assert answer.status == 303
    async with session.get(stack.console_url + "/") as answer:
        csrf = re.search(r'name="csrf" value="([^"]+)"', await answer.text())
    assert csrf
    return csrf.group(1)


async def _post(session: aiohttp.ClientSession, url: str, data: dict[str, str]) -> int:
    async with session.post(url, data=data, allow_redirects=False) as answer:
        await answer.read()
        return answer.status


async def test_a_stored_profile_is_submitted_from_the_deposit_page(start_stack: MakeStack) -> None:
    """Names only on the page; 403 without the CSRF token, 400 for a profile not stored; one
    submission for two posts of the same profile; 409 once the deposit is submitted; every
    post recorded with who, the note and the outcome."""
    stack = await start_stack(console=True, scheduler=False)
    order = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "75.00", NO_PROFILE)
    tx = str(order["transactionId"])
    await stack.settle()
    page = f"{stack.console_url}/deposits/{tx}"
    post = f"{page}/submit"
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session:
        csrf = await _login(session, stack)
        async with session.get(page) as answer:
            html = await answer.text()
        assert 'id="submit-profile"' in html
        assert '<option value="demo-entity"' in html and '<option value="demo-person"' in html
        # Names only: no field of a stored profile reaches the page.
        assert "Demo Trading" not in html and "Demo Street" not in html and "1990-01-31" not in html

        assert await _post(session, post, {"profile": "demo-entity"}) == 403  # no CSRF token
        assert await _post(session, post, {"csrf": csrf, "profile": "nobody"}) == 400
        assert stack.sandbox.state.orders[tx].white_list_status.value == "init"

        data = {"csrf": csrf, "profile": "demo-entity", "note": "called the payer"}
        assert await _post(session, post, data) == 303
        await stack.settle()
        assert stack.sandbox.state.orders[tx].white_list_status.value == "pending"
        # The same profile again (a double click, a second tab): nothing new is submitted.
        assert await _post(session, post, data) == 303
        # Another profile once the deposit no longer waits: 409.
        other = {"csrf": csrf, "profile": "demo-person"}
        assert await _post(session, post, other) == 409
        await stack.settle()
        async with session.get(page) as answer:
            html = await answer.text()
        assert 'id="submit-profile"' not in html

    submissions = [a for a in await stack.actions(tx) if a["action"] == "submit_profile"]
    assert [(a["trigger"], a["status"]) for a in submissions] == [("operator", "done")]
    recorded = await stack.store.read(lambda db: operator_store.recent(db, subject=tx))
    kinds = {(r["kind"], r["remote"]) for r in recorded}
    assert kinds == {("submit_profile", "ana@127.0.0.1")}
    outcomes = [r["outcome"] for r in reversed(recorded)]
    assert outcomes[0].startswith("unknown profile 'nobody'")
    assert outcomes[1].startswith("queued submission #")
    assert outcomes[2].startswith("submitted already: submission #")
    assert outcomes[3].startswith(f"refused: {tx} is submitted")
    assert [r["note"] for r in reversed(recorded)][1] == "called the payer"
