"""The demo's hosted-page scenario: a deposit with no profile gets its payer details typed into
the provider's hosted Travel Rule page (here the sandbox's), as a person in the operator console
would; the worker submits nothing itself and books the deposit once after the review passes."""

from __future__ import annotations

import re

import aiohttp

from worker.dev.demokit import Checks, Demo, Result
from worker.provider.models import WhiteListStatus
from worker.track.tracker import State

HOSTED_SOURCE = "THostedPagePayer4444444444444444444"
# What the person types in: fictitious, and never printed.
TYPED_PAYER = {
    "correspondentType": "ENTITY",
    "fullName": "Hosted Page Demo Co",
    "companyAddress": "9 Example Lane, Singapore 000009",
    "countryCode": "SG",
    "walletType": "SELF_HOSTED",
    "walletLabel": "treasury",
    "addressType": "STANDARD",
}
_HIDDEN = re.compile(r'<input type="hidden" name="([A-Za-z]+)" value="([^"]*)">')


async def fill_in(url: str, payer: dict[str, str]) -> tuple[int, str]:
    """Open the hosted page at `url` (a deep link) and post its form with `payer`, as a browser
    would: the hidden fields (token, transactionId, idempotencyKey) come from the page."""
    async with aiohttp.ClientSession() as session:
        async with session.get(url) as resp:
            page = await resp.text()
        form = {name: value for name, value in _HIDDEN.findall(page)}
        action = url.split("?", 1)[0]
        async with session.post(action, data={**form, **payer}) as resp:
            return resp.status, await resp.text()


async def hosted_page(demo: Demo) -> Result:
    """No profile: the details come from the hosted page; approved, booked once."""
    stack = demo.stack
    tx = demo.inject(1001, "USDT", "TRON", "42.00", HOSTED_SOURCE)
    await stack.wait_for(lambda: bool(stack.slack_for(tx, "needs_details")), what="the alert")
    demo.step("no profile: the operator opens the provider's hosted page for this deposit")
    client = stack.runtime.client
    assert client is not None
    link = await client.travel_rule_link(1001, transaction_id=tx)
    status, page = await fill_in(link.url, TYPED_PAYER)
    submitted = status == 200 and 'id="submission-confirmation"' in page
    demo.step(f"payer details typed into the hosted page: HTTP {status}, pending review")
    stack.sandbox.approve_review(tx)
    demo.step("the sandbox approves; wallet 1001 sweeps to the main account")
    await demo.wait_state(tx, State.CREDITED)
    stack.sandbox.finish_sweep(tx)
    await demo.wait_state(tx, State.COMPLETED)
    await stack.settle()
    check = Checks()
    ledger = await demo.ledger_rows(tx)
    check.expect("confirmed by the page", submitted)
    check.expect("the worker submitted nothing", not await demo.submits(tx))
    check.expect("approved", demo.sandbox_wls(tx) is WhiteListStatus.APPROVED)
    check.expect("booked once", len(ledger) == 1)
    return check.result(f"submitted on the hosted page, {len(ledger)} ledger row")
