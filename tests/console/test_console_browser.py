"""The operator console in a real headless Chromium against a real stack (sandbox, worker with
its console, Slack endpoint, SMTP server), including the provider's hosted Travel Rule page
embedded in its iframe."""

from __future__ import annotations

import datetime as dt
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.select import Select
from selenium.webdriver.support.ui import WebDriverWait

from tests.support.livestack import LiveStack, log_in, submit
from worker.act.approve import approve
from worker.clock import utc_now
from worker.store import operator as operator_store
from worker.store.journal import Head
from worker.store.meta import all_meta
from worker.store.tx import conn_of
from worker.store.verification import Verification, record

ROOT = Path(__file__).resolve().parents[2]
NO_PROFILE_SOURCE = "TConsoleNoProfile000000000000001"  # wallet 1001 has no fallback profile
KNOWN_PAYER = "TDemoKnownPayer1111111111111111111"  # demo-entity in rules/profiles.yaml
PAYER = {
    "firstName": "Ottoline",
    "lastName": "Brackenbury-Vesk",
    "birthday": "1979-03-14",
    "residentialAddress": "12 Vesk Mews, Leeds",
}
PAGES = ("/", "/deposits", "/events", "/ledger", "/findings", "/findings?all=1", "/addresses")


def _wait(driver: webdriver.Chrome, timeout: float = 15) -> WebDriverWait[webdriver.Chrome]:
    return WebDriverWait(driver, timeout)


def _waiting_deposit(live: LiveStack, source: str = NO_PROFILE_SOURCE) -> str:
    """A deposit from an address no profile covers, once the worker tracks it as needing
    details and its alert went out."""
    stack = live.stack
    order = live.call(lambda: stack.sandbox.inject_deposit(1001, "USDT", "TRON", "75.00", source))
    tx = str(order["transactionId"])

    async def waiting() -> bool:
        deposit = await stack.deposit(tx)
        return deposit is not None and deposit.state.value == "needs_details"

    live.until(waiting, "the deposit to need details")
    return tx


def _status(url: str, data: bytes | None = None, cookie: str = "") -> int:
    request = urllib.request.Request(url, data=data, headers={"Cookie": cookie})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _screenshot(driver: webdriver.Chrome, name: str) -> None:
    """Write docs/<name> when DEPOSITD_SCREENSHOTS is set (`make screenshots`)."""
    if os.environ.get("DEPOSITD_SCREENSHOTS"):
        driver.save_screenshot(str(ROOT / "docs" / name))


def test_login_is_required_and_a_wrong_token_is_refused(
    live: LiveStack, browser: webdriver.Chrome
) -> None:
    """Every page sends a stranger to the login form; a wrong token is refused there."""
    browser.get(live.stack.console_url + "/")
    assert browser.current_url.endswith("/login")
    log_in(browser, live, token="not-the-token")
    assert browser.current_url.endswith("/login")
    assert "Wrong token" in browser.find_element(By.CSS_SELECTOR, ".error").text
    assert not browser.get_cookie("depositd_console")
    log_in(browser, live)
    assert browser.find_element(By.TAG_NAME, "h1").text == "Overview"
    cookie = browser.get_cookie("depositd_console")
    assert cookie is not None and cookie["httpOnly"] and cookie["sameSite"] == "Strict"


def test_overview_lists_a_deposit_waiting_for_a_profile_and_its_timeline(
    live: LiveStack, browser: webdriver.Chrome
) -> None:
    """A deposit no profile covers is on the overview under "payer details needed"; its
    timeline shows the facts with their source and the alert by channel."""
    tx = _waiting_deposit(live, "TConsoleNoProfile000000000000002")
    live.wait(lambda: bool(live.stack.slack_for(tx, "needs_details")), "the alert")
    log_in(browser, live)
    section = browser.find_element(By.ID, "waiting")
    assert "payer details needed" in section.text and tx in section.text
    section.find_element(By.LINK_TEXT, tx).click()
    assert tx in browser.find_element(By.TAG_NAME, "h1").text
    assert browser.find_element(By.ID, "state").text == "needs_details"
    facts = browser.find_element(By.ID, "facts").text
    assert "webhook" in facts or "poll" in facts
    # Each fact says what it changed; "moved" (and the row's emphasis) only for a state change.
    rows = browser.find_elements(By.CSS_SELECTOR, "#facts tbody tr")
    changes = [row.find_elements(By.TAG_NAME, "td")[-1].text for row in rows]
    assert changes[0] == "first seen: needs_details", changes
    for row, change in zip(rows, changes, strict=True):
        emphasised = "transition" in (row.get_attribute("class") or "")
        assert emphasised == change.startswith(("moved ", "first seen: ")), changes
        assert change.startswith(("moved ", "first seen: ", "changed ", "known already"))
    alerts = browser.find_element(By.ID, "alerts").text
    assert "needs_details" in alerts and "slack" in alerts and "email" in alerts


def test_retry_of_a_failed_alert_reaches_slack_once(
    live: LiveStack, browser: webdriver.Chrome
) -> None:
    """An alert Slack refused is listed as failed; Retry sends it to Slack once (e-mail, which
    took it, is not sent it again), and the retry is recorded with its note."""
    stack = live.stack
    stack.slack_status = 500
    try:
        tx = _waiting_deposit(live, "TConsoleNoProfile000000000000003")

        async def failed() -> bool:
            return any(
                a["action"] == "alert" and a["status"] == "failed" for a in await stack.actions(tx)
            )

        live.until(failed, "the alert to fail")
    finally:
        stack.slack_status = 200
    mails = len(stack.emails_for(tx, "needs_details"))
    log_in(browser, live)
    row = next(
        r
        for r in browser.find_elements(By.CSS_SELECTOR, "tr.failed-alert")
        if tx in r.text and r.get_attribute("data-channel") == "slack"
    )
    row.find_element(By.NAME, "note").send_keys("Slack is back")
    submit(browser, row.find_element(By.CSS_SELECTOR, "button"))
    live.wait(lambda: bool(stack.slack_for(tx, "needs_details")), "the Slack alert")
    live.run(stack.settle())
    assert len(stack.slack_for(tx, "needs_details")) == 1
    assert len(stack.emails_for(tx, "needs_details")) == mails
    done = live.run(stack.store.read(lambda db: operator_store.recent(db)))
    assert any(d["kind"] == "retry_alert" and d["note"] == "Slack is back" for d in done)


def test_acknowledging_a_finding(live: LiveStack, browser: webdriver.Chrome) -> None:
    """A day reconciled again from the console shows its finding; acknowledging it with a note
    takes it off the open list and records who and why."""
    day = (dt.datetime.now(dt.UTC) - dt.timedelta(days=1)).date().isoformat()
    spec: dict[str, Any] = {
        "kind": "extra",
        "date": day,
        "asset": "USDT",
        "network": "TRON",
        "amount": "42.000001",
        "txHash": "0xconsolenotbooked",
    }
    live.call(lambda: live.stack.sandbox.add_discrepancy(spec))
    log_in(browser, live)
    form = browser.find_element(By.CSS_SELECTOR, "form[action='/reconcile']")
    browser.execute_script(
        "arguments[0].value = arguments[1]", form.find_element(By.NAME, "day"), day
    )
    form.find_element(By.NAME, "note").send_keys("again after the report was fixed")
    submit(browser, form.find_element(By.CSS_SELECTOR, "button"))
    rows = browser.find_elements(By.CSS_SELECTOR, "#findings tr.finding")
    assert len(rows) == 1 and "42.000001" in rows[0].text
    _screenshot(browser, "console-overview.png")
    rows[0].find_element(By.NAME, "note").send_keys("booked by hand, ticket 77")
    submit(browser, rows[0].find_element(By.CSS_SELECTOR, "button"))
    assert not browser.find_elements(By.CSS_SELECTOR, "#findings tr.finding")
    browser.get(live.stack.console_url + "/findings?all=1")
    text = browser.find_element(By.CSS_SELECTOR, "tr.finding").text
    assert "ana" in text and "booked by hand, ticket 77" in text


def test_hosted_page_embedded_filled_in_and_closed(
    live: LiveStack, browser: webdriver.Chrome
) -> None:
    """The provider's hosted page opens in the iframe on the deposit's form; the payer details
    typed there are submitted, the close message makes the console read the detail at once,
    and the deposit shows as submitted. No payer value ever reaches a console page."""
    stack = live.stack
    tx = _waiting_deposit(live, "TConsoleNoProfile000000000000004")
    log_in(browser, live)
    browser.get(f"{stack.console_url}/deposits/{tx}")
    browser.find_element(By.ID, "fill-in").click()
    frame = browser.find_element(By.ID, "hosted-frame")
    assert frame.get_attribute("allow") == "clipboard-write"
    assert "allow-same-origin" not in (frame.get_attribute("sandbox") or "")
    src = frame.get_attribute("src") or ""
    assert src.startswith(stack.sandbox_url + "/hosted/") and f"transactionId={tx}" in src
    assert "darkMode=false" in src
    # The frame fills the window below it: the page itself does not scroll (one scrollbar).
    page_height, window_height, frame_height = browser.execute_script(
        "return [document.documentElement.scrollHeight, window.innerHeight,"
        " document.getElementById('hosted-frame').getBoundingClientRect().height]"
    )
    assert page_height <= window_height and frame_height >= 400, (
        page_height,
        window_height,
        frame_height,
    )
    # A close message that does not come from the frame is ignored.
    browser.execute_script(
        "window.postMessage({type: arguments[0], source: 'deposit-travel-rule'}, '*')",
        "DEPOSIT_TRAVEL_RULE_CLOSED",
    )
    browser.switch_to.frame(frame)
    _wait(browser).until(ec.presence_of_element_located((By.ID, "payer-form")))
    Select(browser.find_element(By.ID, "field-correspondentType")).select_by_value("INDIVIDUAL")
    Select(browser.find_element(By.ID, "field-countryCode")).select_by_value("GB")
    Select(browser.find_element(By.ID, "field-walletType")).select_by_value("SELF_HOSTED")
    for name, value in PAYER.items():
        field = browser.find_element(By.ID, f"field-{name}")
        if field.get_attribute("type") == "date":  # typed keys follow the locale's order
            browser.execute_script("arguments[0].value = arguments[1]", field, value)
        else:
            field.send_keys(value)
    browser.switch_to.default_content()
    _screenshot(browser, "console-travel-rule.png")
    browser.switch_to.frame(frame)
    browser.find_element(By.ID, "submit-button").click()
    _wait(browser).until(ec.presence_of_element_located((By.ID, "submission-confirmation")))
    browser.switch_to.default_content()
    _wait(browser).until(ec.visibility_of_element_located((By.ID, "closed")))
    assert browser.find_element(By.ID, "state").text == "submitted"
    assert browser.find_element(By.ID, "wls").text == "pending"
    deposit = live.run(stack.deposit(tx))
    assert deposit is not None and deposit.state.value == "submitted"
    done = live.run(stack.store.read(lambda db: operator_store.recent(db, subject=tx)))
    assert [(d["kind"], d["outcome"]) for d in done] == [("read_detail", "detail read")]
    for path in (*PAGES, f"/deposits/{tx}", f"/ledger?day={dt.date.today()}"):
        browser.get(stack.console_url + path)
        html = browser.page_source
        assert all(value not in html for value in PAYER.values()), path


def test_a_stored_profile_is_chosen_by_name_and_submitted(
    live: LiveStack, browser: webdriver.Chrome
) -> None:
    """On a waiting deposit's page the operator picks a stored profile by name (keyboard: the
    select and the button are form controls) and submits it; the deposit shows as submitted,
    the action is listed under "What operators did", and no profile field reaches the page."""
    stack = live.stack
    tx = _waiting_deposit(live, "TConsoleNoProfile000000000000005")
    log_in(browser, live)
    browser.get(f"{stack.console_url}/deposits/{tx}")
    choice = Select(browser.find_element(By.ID, "profile"))
    # No profile applies to this deposit: none is chosen for the operator.
    assert [o.text for o in choice.options] == ["choose a profile", "demo-entity", "demo-person"]
    assert "Demo Trading" not in browser.page_source
    choice.select_by_visible_text("demo-person")
    browser.find_element(By.CSS_SELECTOR, "#submit-profile input[name=note]").send_keys(
        "payer on file"
    )
    submit(browser, browser.find_element(By.ID, "submit-profile-button"))

    async def submitted() -> bool:
        deposit = await stack.deposit(tx)
        return deposit is not None and deposit.state.value == "submitted"

    live.until(submitted, "the submission to be taken")
    browser.get(f"{stack.console_url}/deposits/{tx}")
    assert browser.find_element(By.ID, "state").text == "submitted"
    assert not browser.find_elements(By.ID, "submit-profile")
    done = browser.find_element(By.ID, "operator").text
    assert "submit_profile" in done and "payer on file" in done and "demo-person" in done
    assert "submit_profile" in browser.find_element(By.ID, "actions").text
    assert "Demo Street" not in browser.page_source


def test_a_refused_submission_is_a_console_page_with_a_way_back(
    live: LiveStack, browser: webdriver.Chrome
) -> None:
    """Submitting from a page that went stale (the deposit was submitted meanwhile) is refused
    (409) on a page of the console, saying why, with a link back to the deposit."""
    stack = live.stack
    tx = _waiting_deposit(live, "TConsoleNoProfile000000000000007")
    log_in(browser, live)
    browser.get(f"{stack.console_url}/deposits/{tx}")
    Select(browser.find_element(By.ID, "profile")).select_by_visible_text("demo-entity")
    live.run(
        stack.store.write(
            lambda db: approve(db, tx, "demo-person", stack.runtime.profiles, note="", remote="t")
        )
    )
    stack.outbox.wake()

    async def submitted() -> bool:
        deposit = await stack.deposit(tx)
        return deposit is not None and deposit.state.value == "submitted"

    live.until(submitted, "the other submission to be taken")
    submit(browser, browser.find_element(By.ID, "submit-profile-button"))
    assert browser.find_element(By.TAG_NAME, "h1").text == "Not done"
    assert (
        "not waiting for payer details"
        in browser.find_element(By.CSS_SELECTOR, "#refused .error").text
    )
    assert browser.find_element(By.CSS_SELECTOR, "header nav")  # the console's own layout
    back = browser.find_element(By.ID, "back")
    assert back.get_attribute("href") == f"{stack.console_url}/deposits/{tx}"
    back.click()
    assert browser.find_element(By.ID, "state").text == "submitted"


def test_the_profile_just_rejected_is_not_chosen_again(
    live: LiveStack, browser: webdriver.Chrome
) -> None:
    """A deposit whose applying profile the provider rejected: the form chooses no profile and
    marks that one as just rejected."""
    stack = live.stack
    order = live.call(
        lambda: stack.sandbox.inject_deposit(1001, "USDT", "TRON", "12.00", KNOWN_PAYER)
    )
    tx = str(order["transactionId"])

    async def state_is(state: str) -> bool:
        deposit = await stack.deposit(tx)
        return deposit is not None and deposit.state.value == state

    live.until(lambda: state_is("submitted"), "the stored profile to be submitted")
    live.call(lambda: stack.sandbox.reject_review(tx, "name does not match"))
    live.until(lambda: state_is("rejected"), "the rejection")
    log_in(browser, live)
    browser.get(f"{stack.console_url}/deposits/{tx}")
    choice = Select(browser.find_element(By.ID, "profile"))
    assert choice.first_selected_option.text == "choose a profile"
    assert "demo-entity (applies to this deposit)" not in [o.text for o in choice.options]
    assert "demo-entity (just rejected: correct it first)" in [o.text for o in choice.options]


def test_a_post_without_csrf_token_is_refused(live: LiveStack, browser: webdriver.Chrome) -> None:
    """A POST with the session cookie but no CSRF token is 403, as is one without a session."""
    log_in(browser, live)
    cookie = browser.get_cookie("depositd_console")
    assert cookie is not None
    url = live.stack.console_url + "/reconcile"
    body = b"day=2026-01-01&note=x"
    assert _status(url, body, cookie=f"depositd_console={cookie['value']}") == 403
    assert _status(url, body + b"&csrf=forged", cookie=f"depositd_console={cookie['value']}") == 403
    assert _status(url, body) == 403
    done = live.run(
        live.stack.store.read(lambda db: operator_store.recent(db, subject="day#2026-01-01"))
    )
    assert done == []


# --- accessibility (axe-core from npm, installed by `make tools`) ---------------------------------

AXE = Path(
    os.environ.get(
        "DEPOSITD_AXE",
        Path.home() / ".cache" / "depositd-test-tools" / "node_modules" / "axe-core" / "axe.min.js",
    )
)
# Every element a person acts on: what the keyboard must reach.
ACTIONABLE = (
    "a[href], button:not([disabled]), input:not([type=hidden]):not([disabled]),"
    " select:not([disabled]), textarea:not([disabled]), iframe, [tabindex]"
)
MARK_ACTIONABLE = """
const found = [...document.querySelectorAll(arguments[0])].filter(
  (e) => e.getClientRects().length > 0 && getComputedStyle(e).visibility !== 'hidden');
found.forEach((e, i) => e.setAttribute('data-a11y', String(i)));
document.activeElement && document.activeElement.blur();
return found.length;
"""


def _axe_violations(driver: webdriver.Chrome, source: str) -> list[str]:
    """The serious and critical violations axe-core finds on the page, one line each."""
    driver.execute_script(source)
    result = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "axe.run(document, {resultTypes: ['violations']})"
        ".then((r) => done(r.violations), (e) => done([{id: 'axe-error', impact: 'critical',"
        " help: String(e), nodes: []}]));"
    )
    return [
        f"{v['id']} ({v['impact']}): {v['help']}: {[n['target'] for n in v['nodes']][:5]}"
        for v in result
        if v["impact"] in ("serious", "critical")
    ]


def _unreached_by_tab(driver: webdriver.Chrome) -> list[str]:
    """The actionable elements that pressing Tab from the top of the page never focuses."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    total = int(driver.execute_script(MARK_ACTIONABLE, ACTIONABLE))
    reached: set[str] = set()
    # A date field takes three stops (day, month, year): up to four presses per element.
    for _ in range(4 * total + 5):
        if len(reached) == total:
            break
        ActionChains(driver).send_keys(Keys.TAB).perform()
        mark = driver.execute_script(
            "const e = document.activeElement; return e && e.getAttribute('data-a11y');"
        )
        if mark is not None:
            reached.add(str(mark))
    return [
        str(driver.execute_script(
            "const e = document.querySelector(`[data-a11y=\"${arguments[0]}\"]`);"
            "return e.outerHTML.slice(0, 120);", str(i)
        ))
        for i in range(total)
        if str(i) not in reached
    ]  # fmt: skip


def test_every_page_passes_axe_and_every_action_is_keyboard_reachable(
    live: LiveStack, browser: webdriver.Chrome
) -> None:
    """axe-core finds no serious or critical violation on any console page (the login, every
    list, a deposit's timeline, search, not booked), and Tab reaches every link, button and
    field on each."""
    assert AXE.is_file(), f"{AXE} missing: run `make tools` (npm install of axe-core)"
    source = AXE.read_text(encoding="utf-8")
    tx = _waiting_deposit(live, "TConsoleNoProfile000000000000005")
    pages = (*PAGES, "/unbooked", f"/search?q={tx}", f"/deposits/{tx}")
    problems: dict[str, list[str]] = {}
    browser.get(live.stack.console_url + "/login")
    problems["/login"] = _axe_violations(browser, source) + _unreached_by_tab(browser)
    log_in(browser, live)
    for path in pages:
        browser.get(live.stack.console_url + path)
        found = _axe_violations(browser, source) + _unreached_by_tab(browser)
        if found:
            problems[path] = found
    found = [f"{path}: {problem}" for path, some in problems.items() for problem in some]
    assert found == [], "\n".join(found)


def test_overview_shows_refused_webhook_deliveries(
    live: LiveStack, browser: webdriver.Chrome
) -> None:
    """With the provider signing with another webhook secret, the overview says deliveries are
    refused and names the two settings to compare (and passes axe); once a delivery is accepted
    again, the notice is gone."""
    stack = live.stack
    right = stack.sandbox.cfg.webhook_secret
    stack.sandbox.cfg.webhook_secret = "not-the-secret-the-worker-has"
    try:
        live.call(
            lambda: stack.sandbox.inject_deposit(1002, "USDT", "TRON", "5.00", NO_PROFILE_SOURCE)
        )

        async def streak() -> bool:
            meta = await stack.store.read(lambda db: all_meta(conn_of(db)))
            return bool(meta.get("webhook_auth_refused"))

        live.until(streak, "the refusals in a row to be recorded")
        log_in(browser, live)
        notice = browser.find_element(By.ID, "webhook-auth")
        assert "webhook.secret" in notice.text and "webhook.api_key" in notice.text
        assert notice.get_attribute("role") == "alert"
        assert AXE.is_file(), f"{AXE} missing: run `make tools` (npm install of axe-core)"
        assert _axe_violations(browser, AXE.read_text(encoding="utf-8")) == []
    finally:
        stack.sandbox.cfg.webhook_secret = right

    async def cleared() -> bool:
        meta = await stack.store.read(lambda db: all_meta(conn_of(db)))
        return not meta.get("webhook_auth_refused")

    live.until(cleared, "an accepted delivery to end the streak")
    browser.get(stack.console_url + "/")
    assert not browser.find_elements(By.ID, "webhook-auth")


def test_overview_shows_the_journal_head_and_its_last_verification(
    live: LiveStack, browser: webdriver.Chrome
) -> None:
    """A verification that found a record changed is an alarm on the overview, naming what it
    found (and passing axe); once the daily job has verified the journal again, the overview
    shows the head and the verification instead."""
    stack = live.stack
    problem = "ledger row tx-console-9 has no journal entry (inserted by hand?)"
    found = Verification(
        at=utc_now(),
        entries=3,
        head=Head(3, "ab" * 32),
        ledger_rows=3,
        submissions=0,
        problem=problem,
    )
    live.run(stack.store.write(lambda db: record(db, found)))
    log_in(browser, live)
    notice = browser.find_element(By.ID, "journal-broken")
    assert problem in notice.text and "depositd verify" in notice.text
    assert notice.get_attribute("role") == "alert"
    assert AXE.is_file(), f"{AXE} missing: run `make tools` (npm install of axe-core)"
    assert _axe_violations(browser, AXE.read_text(encoding="utf-8")) == []

    job = stack.runtime.journal
    assert job is not None
    outcome = live.run(job.publish())
    assert outcome is not None and outcome.verified
    browser.get(stack.console_url + "/")
    assert not browser.find_elements(By.ID, "journal-broken")
    shown = browser.find_element(By.ID, "journal").text
    assert (str(outcome.head) if outcome.head else "empty") in shown
    assert "verified" in shown
