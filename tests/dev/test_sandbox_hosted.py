"""The sandbox's hosted deposit Travel Rule page over HTTP: the token, the queue (screen 1), the
deep link and payer form (screen 2), submission through the submit operation with one
Idempotency-Key per form, the refusals shown on the form, dark mode and the page's script."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from decimal import Decimal
from html.parser import HTMLParser

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from structlog.testing import capture_logs
from yarl import URL

from tests.support.sandboxes import StartSandbox
from worker.dev.sandbox import Sandbox
from worker.dev.sandbox import hosted_html as ui
from worker.dev.sandbox.records import Order
from worker.dev.sandbox.testing import ENTITY_PAYER, INDIVIDUAL_PAYER
from worker.provider.client import ProviderClient
from worker.provider.models import CreditStatus, OrderStatus, WhiteListStatus

SOURCE = "0x9f8e7d6c5b4a39281706f5e4d3c2b1a098765432"
FORM_FIELDS = {
    "correspondentType",
    "countryCode",
    "fullName",
    "companyAddress",
    "firstName",
    "lastName",
    "birthday",
    "residentialAddress",
    "walletType",
    "provider",
    "othersPleaseSpecify",
    "walletLabel",
    "addressType",
}


class Page(HTMLParser):
    """The parts of a page a test looks at: elements by id, form values, scripts."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
        self.ids: dict[str, dict[str, str]] = {}
        self.values: dict[str, str] = {}
        self.scripts: list[dict[str, str]] = []
        self.names: set[str] = set()
        self._textarea: str | None = None
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if "id" in a:
            self.ids[a["id"]] = {"tag": tag, **a}
        if tag == "script":
            self.scripts.append(a)
        if tag in ("input", "select", "textarea") and "name" in a:
            self.names.add(a["name"])
        if tag == "input" and "name" in a:
            self.values[a["name"]] = a.get("value", "")
        if tag == "textarea":
            self._textarea = a.get("name")
            self.values[a.get("name", "")] = ""

    def handle_data(self, data: str) -> None:
        if self._textarea is not None:
            self.values[self._textarea] += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "textarea":
            self._textarea = None

    def selected(self, name: str) -> str | None:
        """The selected option of a select, by name."""
        m = re.search(rf'<select[^>]*name="{name}"[^>]*>(.*?)</select>', self.text, re.S)
        assert m is not None
        chosen = re.search(r'<option value="([^"]*)" selected>', m.group(1))
        return chosen.group(1) if chosen else None


@dataclass
class Env:
    sandbox: Sandbox
    server: TestServer
    client: ProviderClient
    session: aiohttp.ClientSession
    clock: list[int]

    def deposit(self, wallet_id: int = 1001, source: str = SOURCE) -> str:
        self.clock[0] += 1000
        order = self.sandbox.inject_deposit(wallet_id, "USDT", "ETH", "1234.5678", source)
        return str(order["transactionId"])

    async def link(self, wallet_id: int = 1001, transaction_id: str | None = None) -> URL:
        made = await self.client.travel_rule_link(wallet_id, transaction_id=transaction_id)
        return URL(made.url)

    async def get(self, url: URL | str, **query: str) -> tuple[int, Page, aiohttp.ClientResponse]:
        target = URL(str(url)).update_query(query) if query else URL(str(url))
        async with self.session.get(target) as resp:
            return resp.status, Page(await resp.text()), resp

    async def post(self, url: URL, form: dict[str, str]) -> tuple[int, Page]:
        async with self.session.post(url.with_query(None), data=form) as resp:
            return resp.status, Page(await resp.text())

    async def status_of(self, tx: str) -> WhiteListStatus | None:
        return (await self.client.transaction_detail(tx)).whiteListStatus


@pytest.fixture
async def env(start_sandbox: StartSandbox) -> AsyncIterator[Env]:
    s = await start_sandbox(clock=1_800_000_000_000)
    assert s.clock is not None
    async with aiohttp.ClientSession() as session:
        yield Env(s.sandbox, s.server, s.client, session, s.clock)


async def open_form(env: Env, tx: str) -> tuple[URL, Page]:
    url = await env.link(1001)
    status, page, _ = await env.get(url, transactionId=tx)
    assert status == 200 and "payer-form" in page.ids
    return url, page


def filled(page: Page, payer: dict[str, str]) -> dict[str, str]:
    """The form as a browser posts it: hidden fields, the payer's values, other fields blank."""
    hidden = {k: page.values[k] for k in ("token", "transactionId", "idempotencyKey", "darkMode")}
    return {**hidden, **dict.fromkeys(FORM_FIELDS, ""), **payer}


async def test_token_missing_unknown_or_expired_is_refused(env: Env) -> None:
    """Without a token, with an unknown one, or after it expired, the page shows no deposit."""
    tx = env.deposit()
    url = await env.link(1001)
    base = url.with_query(None)
    status, page, _ = await env.get(base)
    assert status == 401 and "token-error" in page.ids and tx not in page.text
    status, page, _ = await env.get(base, token="not-a-token")
    assert status == 403 and "token-error" in page.ids and tx not in page.text
    env.clock[0] += 901_000  # the link lives 900 s
    status, page, _ = await env.get(url)
    assert status == 403 and "expired" in page.text and tx not in page.text
    status, page = await env.post(url, {"token": url.query["token"], "transactionId": tx})
    assert status == 403 and tx not in page.text
    assert await env.status_of(tx) is WhiteListStatus.INIT


async def test_list_shows_the_wallets_init_and_rejected_deposits_only(env: Env) -> None:
    """Screen 1 lists the token's wallet's deposits awaiting details (init, rejected), each
    linking to its form; pending, approved, other wallets' and ACTIVE-source deposits are absent."""
    waiting = env.deposit()
    rejected = env.deposit()
    env.sandbox.submit(rejected, ENTITY_PAYER)
    env.sandbox.reject_review(rejected, "name does not match")
    pending = env.deposit()
    env.sandbox.submit(pending, ENTITY_PAYER)
    approved = env.deposit()
    env.sandbox.submit(approved, ENTITY_PAYER)
    env.sandbox.approve_review(approved)
    other_wallet = env.deposit(wallet_id=1002)
    active = "0x1111111111111111111111111111111111111111"
    record = env.sandbox.register_address(
        {**INDIVIDUAL_PAYER, "walletId": 1001, "walletAddress": active, "network": "ETH"}
    )
    env.sandbox.approve_address(record["id"])
    from_active = env.deposit(source=active)

    status, page, resp = await env.get(await env.link(1001))
    assert status == 200 and page.ids["deposit-list"]["data-count"] == "2"
    assert {f"deposit-{waiting}", f"deposit-{rejected}"} <= set(page.ids)
    for absent in (pending, approved, other_wallet, from_active):
        assert absent not in page.text
    links = re.findall(r'class="deposit-link" href="([^"]+)"', page.text)
    status, form, _ = await env.get(resp.url.join(URL(links[1].replace("&amp;", "&"))))
    assert status == 200 and form.ids["deposit-transaction-id"] and rejected in form.text
    assert "rejection" in form.ids and "name does not match" in form.text


async def test_deep_link_opens_the_form_of_that_deposit_only(env: Env) -> None:
    """transactionId goes straight to the deposit and its form; another wallet's deposit, one
    not awaiting details, or a link issued for another deposit get a clear message instead."""
    tx = env.deposit()
    url, page = await open_form(env, tx)
    assert page.ids["deposit-travel-rule"]["data-screen"] == "form"
    assert "1234.5678 USDT" in page.text and "ETH" in page.text and SOURCE in page.text
    order = env.sandbox.state.orders[tx]
    assert page.ids["deposit-tx-hash"] and order.transaction_hash in page.text
    assert page.values["transactionId"] == tx and page.values["idempotencyKey"]
    assert {"token", "transactionId", "idempotencyKey"} <= set(page.values)
    assert page.names == FORM_FIELDS | {"token", "transactionId", "idempotencyKey", "darkMode"}
    assert page.ids["field-walletLabel"]["maxlength"] == "50"

    other = env.deposit(wallet_id=1002)
    status, page, _ = await env.get(url, transactionId=other)
    assert status == 404 and "notice" in page.ids and "payer-form" not in page.ids
    env.sandbox.submit(tx, ENTITY_PAYER)
    status, page, _ = await env.get(url, transactionId=tx)
    assert status == 409 and "pending review" in page.text and "payer-form" not in page.ids

    bound_tx = env.deposit()
    bound = await env.link(1001, transaction_id=bound_tx)
    status, page, _ = await env.get(bound)
    assert status == 200 and page.values["transactionId"] == bound_tx
    status, page, _ = await env.get(bound, transactionId=env.deposit())
    assert status == 403 and "payer-form" not in page.ids


async def test_submit_makes_the_deposit_pending_once_for_a_double_post(env: Env) -> None:
    """The form goes through the submit operation: whiteListStatus pending (not SUCCESS), and
    posting the same form twice is one accepted submission; payer data reaches no log."""
    tx = env.deposit()
    url, page = await open_form(env, tx)
    form = filled(page, INDIVIDUAL_PAYER)
    with capture_logs() as logs:
        first = await env.post(url, form)
        second = await env.post(url, form)
    for status, done in (first, second):
        assert status == 200 and done.ids["submission-confirmation"]["data-transaction-id"] == tx
        assert done.ids["submission-confirmation"]["data-white-list-status"] == "pending"
        assert "pending review" in done.text
    assert await env.status_of(tx) is WhiteListStatus.PENDING
    detail = await env.client.transaction_detail(tx)
    assert detail.status.value == "PROCESSING"
    assert [e["event"] for e in logs].count("payer details submitted") == 1
    assert not any(v in repr(logs) for v in ("Lovelace", "12 Example Road", "1990-12-10"))
    # A fresh render (new key) would be a second submission: the state machine refuses it.
    status, later = await env.post(url, {**form, "idempotencyKey": "another-key"})
    assert status == 409 and "10000104" in later.text


async def test_missing_field_shows_10000102_and_keeps_the_fields(env: Env) -> None:
    """A form without a mandatory payer field shows 10000102 with the message; the entered
    values stay and the next try gets a new Idempotency-Key."""
    tx = env.deposit()
    url, page = await open_form(env, tx)
    payer = {k: v for k, v in INDIVIDUAL_PAYER.items() if k != "lastName"}
    status, again = await env.post(url, filled(page, payer))
    assert status == 422 and again.ids["form-error"]["data-code"] == "10000102"
    assert "lastName is mandatory" in again.text
    assert again.ids["field-lastName"].get("aria-invalid") == "true"
    assert again.values["firstName"] == "Ada" and again.values["residentialAddress"].startswith(
        "12"
    )
    assert again.selected("countryCode") == "GB" and again.selected("walletType") == "SELF_HOSTED"
    assert again.values["idempotencyKey"] != page.values["idempotencyKey"]
    assert await env.status_of(tx) is WhiteListStatus.INIT
    status, done = await env.post(url, filled(again, INDIVIDUAL_PAYER))
    assert status == 200 and "submission-confirmation" in done.ids


@pytest.mark.parametrize(
    "change",
    [{"countryCode": "XX"}, {"walletLabel": "x" * 51}, {"birthday": "10/12/1990"}],
    ids=["country", "label", "birthday"],
)
async def test_bad_value_shows_10000103(env: Env, change: dict[str, str]) -> None:
    """An unaccepted value (country, a label over 50 characters, a date) shows 10000103."""
    tx = env.deposit()
    url, page = await open_form(env, tx)
    status, again = await env.post(url, filled(page, {**INDIVIDUAL_PAYER, **change}))
    assert status == 422 and again.ids["form-error"]["data-code"] == "10000103"
    field = next(iter(change))
    assert again.ids[f"field-{field}"].get("aria-invalid") == "true"
    assert await env.status_of(tx) is WhiteListStatus.INIT


async def test_entity_with_a_vasp_provider_is_accepted(env: Env) -> None:
    """An entity paying from a VASP listed by options is accepted; the individual fields the
    payer left filled in are not sent."""
    tx = env.deposit()
    url, page = await open_form(env, tx)
    form = filled(page, {**ENTITY_PAYER, "firstName": "stray"})
    assert page.selected("provider") is None and "Binance" in page.text
    status, done = await env.post(url, form)
    assert status == 200 and "submission-confirmation" in done.ids
    assert await env.status_of(tx) is WhiteListStatus.PENDING


async def test_page_escapes_what_it_shows(env: Env) -> None:
    """Markup in a rejection message or an entered value is shown as text, never run."""
    tx = env.deposit()
    env.sandbox.submit(tx, ENTITY_PAYER)
    env.sandbox.reject_review(tx, '<script>alert("x")</script>')
    url, page = await open_form(env, tx)
    assert "<script>alert" not in page.text and "&lt;script&gt;alert" in page.text
    status, again = await env.post(url, filled(page, {"fullName": '"><img src=x>'}))
    assert status == 422 and "<img src=x>" not in again.text


async def test_dark_mode_from_the_query(env: Env) -> None:
    """darkMode true/1/yes turns the dark stylesheet on, false/0/no (or nothing) leaves it off."""
    tx = env.deposit()
    url = await env.link(1001)
    for raw, on in (("true", True), ("1", True), ("yes", True), ("no", False), ("0", False)):
        _, page, _ = await env.get(url, darkMode=raw)
        assert page.ids["dark-stylesheet"]["media"] == ("all" if on else "not all")
        assert f"darkMode={raw}" in page.text  # the list's links keep it
        _, form, _ = await env.get(url, darkMode=raw, transactionId=tx)
        assert form.values["darkMode"] == ("true" if on else "false")
    _, page, _ = await env.get(url)
    assert page.ids["dark-stylesheet"]["media"] == "not all"


async def test_page_script_posts_the_close_message(env: Env) -> None:
    """The page loads one same-origin script (no inline script) that posts the interface's
    close message to the parent only inside a frame; the page sends its own CSP."""
    tx = env.deposit()
    url, _ = await open_form(env, tx)
    _, page, resp = await env.get(url, transactionId=tx)
    csp = resp.headers["Content-Security-Policy"]
    assert "default-src 'self'" in csp and "frame-ancestors *" in csp
    assert resp.headers["Referrer-Policy"] == "no-referrer"
    assert page.scripts == [{"src": "../static/deposit-travel-rule.js", "defer": ""}]
    assert re.search(r"<script(?![^>]*\bsrc=)[^>]*>", page.text) is None
    assert page.ids["close-button"]["tag"] == "button"
    async with env.session.get(resp.url.join(URL(page.scripts[0]["src"]))) as js:
        assert js.status == 200 and js.content_type == "text/javascript"
        code = await js.text()
    assert 'type: "DEPOSIT_TRAVEL_RULE_CLOSED", source: SOURCE' in code
    assert 'var SOURCE = "deposit-travel-rule";' in code
    assert "window.parent !== window" in code and "window.parent.postMessage(" in code
    assert 'getElementById("close-button")' in code and "submission-confirmation" in code
    assert '"DARK_MODE"' in code and "event.source !== window.parent" in code
    for sheet in ("deposit-travel-rule.css", "deposit-travel-rule-dark.css"):
        async with env.session.get(resp.url.join(URL(f"../static/{sheet}"))) as css:
            assert css.status == 200 and css.content_type == "text/css"
    async with env.session.get(resp.url.join(URL("../static/nope.js"))) as missing:
        assert missing.status == 404


async def test_form_for_another_wallets_deposit_is_refused(env: Env) -> None:
    """A form posted with a token of one wallet cannot submit for another wallet's deposit."""
    mine, theirs = env.deposit(), env.deposit(wallet_id=1002)
    url, page = await open_form(env, mine)
    status, refused = await env.post(url, {**filled(page, ENTITY_PAYER), "transactionId": theirs})
    assert status == 404 and "submission-confirmation" not in refused.ids
    assert await env.status_of(theirs) is WhiteListStatus.INIT


def test_a_list_link_keeps_the_transaction_id_one_query_value() -> None:
    """An id holding "&" or "=" cannot add a parameter (another token, another deposit) to the
    link of the list's row."""
    order = Order(
        transaction_id="tx&transactionId=other",
        transaction_hash="0xabc",
        wallet_id=1001,
        wallet_name="main",
        currency="USDT",
        network="ETH",
        amount=Decimal("1"),
        from_address=SOURCE,
        to_address="0xdef",
        status=OrderStatus.SUCCESS,
        white_list_status=WhiteListStatus.INIT,
        credit_status=CreditStatus.PENDING,
        create_time=1,
        update_time=1,
    )
    html = ui.deposit_list([order], "token=t")
    assert "transactionId=tx%26transactionId%3Dother" in html
