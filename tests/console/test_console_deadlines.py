"""The console's overview orders the deposits waiting on a person by time left (docs/console.md):
past their deadline first, then the least time left, then those whose rule set has none; over
plain HTTP against a real stack with its console, on both engines."""

from __future__ import annotations

import re
from pathlib import Path

import aiohttp
import pytest

from tests.support.stacks import MakeStack
from worker.dev.harness import Stack
from worker.store.waits import open_waits_of

# Every test here runs on SQLite and on PostgreSQL, its stacks too.
pytestmark = pytest.mark.usefixtures("engine")

MINUTE = 60_000
NO_PROFILE = "TConsoleDeadline000000000000001"  # neither wallet 1000 nor 1001 has a fallback
KNOWN_PAYER = "TDemoKnownPayer1111111111111111111"  # demo-entity in rules/profiles.yaml

RULE_SETS = {
    "wallet-1001.yaml": """\
wallet: 1001
deadline: 30m
rules:
  - name: payer details needed
    "on": [needs_details]
    if: {profile: missing}
    then: [{alert: {severity: warning}}]
""",
    "wallet-1002.yaml": """\
wallet: 1002
deadline: 2h
rules:
  - name: submit stored profile
    "on": [needs_details]
    if: {profile: found}
    then: [submit_profile]
  - name: rejected
    "on": [rejected]
    then: [{alert: {severity: warning}}]
""",
    "default.yaml": """\
wallet: "*"
rules:
  - name: payer details needed
    "on": [needs_details]
    then: [{alert: {severity: warning}}]
""",
}


async def _logged_in(stack: Stack) -> aiohttp.ClientSession:
    # unsafe: the jar keeps cookies of an IP address (the console listens on 127.0.0.1).
    session = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))
    async with session.get(stack.console_url + "/login") as answer:
        csrf = re.search(r'name="csrf" value="([^"]+)"', await answer.text())
    assert csrf
    data = {"csrf": csrf.group(1), "token": stack.console_token, "operator": "ana"}
    async with session.post(stack.console_url + "/login", data=data, allow_redirects=False) as a:
        assert a.status == 303
    return session


def _waiting_rows(html: str) -> list[tuple[str, str, str]]:
    """(transactionId, waits on, time left) of each row of the overview's waiting table."""
    section = html[html.index('<section id="waiting">') : html.index('<section id="failed">')]
    rows = re.findall(r'<tr class="deposit[^"]*".*?</tr>', section, re.S)
    out = []
    for row in rows:
        cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td.*?</td>", row, re.S)]
        out.append((cells[0], cells[1], cells[-1]))
    return out


async def test_the_overview_lists_waiting_deposits_by_time_left(
    start_stack: MakeStack, tmp_path: Path
) -> None:
    """A deposit 10 minutes past its 30-minute deadline comes first ("overdue by"), then a
    rejected one with about 2 hours left, then one whose rule set has no deadline."""
    folder = tmp_path / "rules"
    folder.mkdir()
    for name, text in RULE_SETS.items():
        (folder / name).write_text(text, encoding="utf-8")
    stack = await start_stack(console=True, rules=folder)
    sandbox = stack.sandbox
    no_deadline = str(
        sandbox.inject_deposit(1000, "USDT", "TRON", "1.00", NO_PROFILE)["transactionId"]
    )
    overdue = str(sandbox.inject_deposit(1001, "USDT", "TRON", "2.00", NO_PROFILE)["transactionId"])
    rejected = str(
        sandbox.inject_deposit(1002, "USDT", "TRON", "3.00", KNOWN_PAYER)["transactionId"]
    )

    async def submitted() -> bool:
        return any(
            a["action"] == "submit_profile" and a["status"] == "done"
            for a in await stack.actions(rejected)
        )

    await stack.wait_for(submitted, what="the submission")
    await stack.settle()
    sandbox.reject_review(rejected, "company address does not match")
    await stack.settle()
    waits = await stack.store.read(lambda db: open_waits_of(db, [no_deadline, overdue, rejected]))
    assert {tx: [w.reason for w in ws] for tx, ws in waits.items()} == {
        no_deadline: ["needs_details"],
        overdue: ["needs_details"],
        rejected: ["rejected"],
    }
    # Forty minutes ago: as if the deposit had waited that long.
    await stack.store.write(
        lambda db: db.execute(
            "UPDATE waits SET started_at = started_at - ? WHERE transaction_id = ?",
            [40 * MINUTE, overdue],
        )
    )

    session = await _logged_in(stack)
    async with session, session.get(stack.console_url + "/") as answer:
        assert answer.status == 200
        rows = _waiting_rows(await answer.text())
    assert [tx for tx, _, _ in rows] == [overdue, rejected, no_deadline]
    (_, first_on, first_left), (_, second_on, second_left), (_, third_on, third_left) = rows
    assert first_on == "payer details needed" and re.fullmatch(
        r"overdue by 1\d min( \d+ s)?", first_left
    )
    assert second_on == "details rejected" and re.fullmatch(r"1 h 5\d min", second_left)
    assert third_on == "payer details needed" and third_left == "no deadline"
