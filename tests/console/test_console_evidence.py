"""The deposit page's evidence download over HTTP against a real stack (sandbox webhooks, an
automatic submission, the credit and the booking): only for a logged-in operator, the same
document `depositd evidence` writes, without the payer's details."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.stacks import MakeStack
from worker.dev.harness import Stack
from worker.store import journal
from worker.store.evidence_file import check

# Every test here runs on SQLite and on PostgreSQL, its stacks too.
pytestmark = pytest.mark.usefixtures("engine")

PAYER = {
    "correspondentType": "ENTITY",
    "fullName": "Ondrecht Varnish Trading BV",
    "countryCode": "NL",
    "companyAddress": "19 Ondrecht Kade, Rotterdam",
    "walletType": "VASP",
    "provider": "Binance",
    "walletLabel": "Ondrecht hot wallet",
    "addressType": "STANDARD",
}
SOURCE = "TConsoleEvidencePayer00000000001"


def _client() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))


async def _log_in(session: aiohttp.ClientSession, stack: Stack) -> None:
    async with session.get(stack.console_url + "/login") as answer:
        found = re.search(r'name="csrf" value="([^"]+)"', await answer.text())
    assert found
    async with session.post(
        stack.console_url + "/login",
        data={"csrf": found.group(1), "token": stack.console_token, "operator": "ana"},
    ) as answer:
        assert answer.status == 200


async def _booked(stack: Stack) -> str:
    """A deposit from an unknown address into wallet 1002, submitted with the wallet's profile,
    approved, credited and booked; its transactionId."""
    tx = str(stack.sandbox.inject_deposit(1002, "USDT", "TRON", "310.75", SOURCE)["transactionId"])

    async def state_is(state: str) -> bool:
        deposit = await stack.deposit(tx)
        return deposit is not None and deposit.state.value == state

    await stack.wait_for(lambda: state_is("submitted"), what="the submission")
    stack.sandbox.approve_review(tx)

    async def booked() -> bool:
        return any(row["transaction_id"] == tx for row in await stack.ledger())

    await stack.wait_for(booked, what="the booking")
    await stack.settle()
    return tx


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (k, *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


async def test_the_deposit_page_downloads_its_evidence_without_payer_data(
    start_stack: MakeStack, tmp_path: Path
) -> None:
    """Logged out, the download sends to the login; logged in, the deposit page links it and it
    is an attachment: the canonical document with its sha256, the webhooks as received, the
    submission by field names and hash, the ledger row and the journal's entries, verifying on
    its own, and no payer value anywhere. An unknown deposit is a 404."""
    profiles = tmp_path / "profiles.yaml"
    text = json.dumps({"profiles": {"ondrecht": PAYER}, "wallets": {"1002": "ondrecht"}})
    profiles.write_text(text.replace('"1002"', "1002"))  # a walletId is a number
    stack = await start_stack(console=True, profiles=profiles)
    tx = await _booked(stack)
    url = f"{stack.console_url}/deposits/{tx}/evidence.json"
    async with _client() as session:
        async with session.get(url, allow_redirects=False) as answer:
            assert answer.status == 303 and answer.headers["Location"] == "/login"
        await _log_in(session, stack)
        async with session.get(f"{stack.console_url}/deposits/{tx}") as answer:
            page = await answer.text()
        assert f'href="/deposits/{tx}/evidence.json"' in page
        async with session.get(url, allow_redirects=False) as answer:
            assert answer.status == 200
            assert answer.headers["Content-Type"].startswith("application/json")
            disposition = answer.headers["Content-Disposition"]
            assert disposition == f'attachment; filename="depositd-evidence-{tx}.json"'
            assert answer.headers["Cache-Control"] == "no-store"
            data = await answer.read()
        async with session.get(f"{stack.console_url}/deposits/tx-nobody/evidence.json") as answer:
            assert answer.status == 404
    doc = json.loads(data)
    assert journal.canonical(doc) == data
    assert doc["sha256"] == journal.sha256_hex(journal.canonical(doc["bundle"]))
    bundle = doc["bundle"]
    assert bundle["transaction_id"] == tx and bundle["with_personal_data"] is False
    assert bundle["written_by"].startswith("ana@")
    types = [e["event_type"] for e in bundle["webhooks"]["events"]]
    assert "DEPOSIT_WHITELIST_REQUIRED" in types and "DEPOSIT_WHITELIST_CREDITED" in types
    assert {"webhook", "submit"} <= {f["source"] for f in bundle["facts"]}
    submit = [a for a in bundle["rules"]["matched"] if a["action"] == "submit_profile"]
    assert [a["params"]["profile"] for a in submit] == ["ondrecht"]
    (sent,) = bundle["submissions"]
    assert sent["profile"] == "ondrecht" and sent["fields"] == sorted(PAYER)
    assert "payload" not in sent
    kinds = {e["kind"] for e in bundle["journal"]["entries"]}
    assert {journal.SUBMITTED, journal.BOOKED} <= kinds
    assert bundle["ledger"]["amount"] == "310.75"
    texts = _strings(bundle)
    for value in PAYER.values():
        assert value not in texts and not (len(value) > 5 and value.encode() in data), value
    verdict = check(data)
    assert verdict.problem is None and str(verdict.head) == bundle["journal"]["proof"]["head"]
