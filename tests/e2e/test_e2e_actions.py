"""End to end: rules, payer profiles and the submit / book / alert / forward actions.

Everything is real and on loopback: the provider sandbox, the worker (ingress, processor,
outbox, polls), an aiosmtpd server and an HTTP Slack stand-in (`worker.dev.harness.Stack`).
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from tests.support.stacks import MakeStack
from worker.clock import now_ms
from worker.dev.harness import WEBHOOK_PATH, Stack
from worker.provider import jsonio
from worker.provider.signing import METHOD_PATH_V1, signed_headers, verify
from worker.track.facts import fact_from_order

ROOT = Path(__file__).resolve().parents[2]
ENTITY_ADDRESS = "TE2eEntityPayer000000000000000001"
ENTITY = {
    "correspondentType": "ENTITY",
    "fullName": "Zebulon Quartz Trading Ltd",
    "countryCode": "SG",
    "companyAddress": "77 Quartz Boulevard, Singapore",
    "walletType": "VASP",
    "provider": "Binance",
    "walletLabel": "Quartz hot wallet",
    "addressType": "STANDARD",
}
PERSON = {
    "correspondentType": "INDIVIDUAL",
    "firstName": "Philippa",
    "lastName": "Wexcombe",
    "birthday": "1984-07-19",
    "residentialAddress": "5 Wexcombe Lane, Bristol",
    "countryCode": "GB",
    "walletType": "SELF_HOSTED",
}
# Strings that must never leave the worker in an alert.
PAYER_DATA = (
    "Zebulon Quartz",
    "77 Quartz Boulevard",
    "Quartz hot wallet",
    "Philippa",
    "Wexcombe",
    "1984-07-19",
    "5 Wexcombe Lane",
)
FORBIDDEN_IN_SUBMIT = {"walletAddress", "network", "memo", "symbol", "txHash"}


def profiles_yaml(entity: Mapping[str, Any] = ENTITY, person: Mapping[str, Any] = PERSON) -> str:
    """A profiles file: the entity by source address, the person as wallet 1002's fallback."""
    return json.dumps(
        {
            "profiles": {"e2e-entity": dict(entity), "e2e-person": dict(person)},
            "addresses": {ENTITY_ADDRESS: "e2e-entity"},
            "wallets": {"1002": "e2e-person"},
        }
    ).replace('"1002"', "1002")


Recorded = list[dict[str, Any]]


def submits(recorded: Recorded, tx: str) -> Recorded:
    """The submit requests the sandbox received for one deposit."""
    return [r for r in recorded if r["method"] == "POST" and r["path"].endswith(f"/{tx}/submit")]


def history_reads(recorded: Recorded) -> int:
    """The history poll's requests so far."""
    paths = ("/v1/wallet/history", "/v1/wallet/transaction/list")
    return sum(r["path"].startswith(paths) for r in recorded)


@pytest.fixture
def make_stack(tmp_path: Path, start_stack: MakeStack) -> MakeStack:
    """Start a Stack with the test profiles (and optional rules); stopped at teardown."""

    async def make(profiles: str | None = None, **kw: Any) -> Stack:
        path = tmp_path / "profiles-source.yaml"
        path.write_text(profiles if profiles is not None else profiles_yaml())
        return await start_stack(profiles=path, **kw)

    return make


async def actions_of(stack: Stack, tx: str, action: str) -> list[dict[str, Any]]:
    """Action rows of one kind for one deposit."""
    return [a for a in await stack.actions(tx) if a["action"] == action]


async def submitted(stack: Stack, tx: str) -> None:
    """Wait until the deposit's submission is done and the tracker shows it."""

    async def done() -> bool:
        rows = await actions_of(stack, tx, "submit_profile")
        return bool(rows) and rows[-1]["status"] == "done"

    await stack.wait_for(done, what="submission done")
    await stack.settle()


def alert_texts(stack: Stack) -> list[str]:
    """Every Slack payload and e-mail the sinks received, as text."""
    texts = [json.dumps(p, ensure_ascii=False) for p in stack.slack]
    texts += [m.as_string() for m in stack.emails]
    return texts


def assert_no_payer_data(stack: Stack) -> None:
    """No alert carries any payer profile value."""
    for text in alert_texts(stack):
        for value in PAYER_DATA:
            assert value not in text


async def test_address_profile_submitted_approved_booked_once_with_stable_key(
    make_stack: MakeStack, recorded: Recorded
) -> None:
    """Unknown address with an address profile: submitted (retried once, same key), booked once."""
    stack = await make_stack()
    stack.sandbox.set_fault("submit", "5xx", count=1)
    order = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "1234.5678", ENTITY_ADDRESS)
    tx = order["transactionId"]
    await submitted(stack, tx)

    [action] = await actions_of(stack, tx, "submit_profile")
    assert action["params"]["profile"] == "e2e-entity"
    assert action["trigger"] == "needs_details" and action["rule_set_version"]
    calls = submits(recorded, tx)
    assert len(calls) == 2  # the injected 503, then the retry
    assert {c["headers"]["Idempotency-Key"] for c in calls} == {action["idempotency_key"]}
    assert calls[0]["body"] == calls[1]["body"]
    body = json.loads(calls[1]["body"])
    assert body == ENTITY
    assert not FORBIDDEN_IN_SUBMIT & set(body)
    assert stack.sandbox.state.order(tx).white_list_status.value == "pending"
    assert (await stack.deposit(tx)).state.value == "submitted"  # type: ignore[union-attr]

    stack.sandbox.approve_review(tx)
    await stack.settle()
    stack.sandbox.finish_sweep(tx)  # wallet 1001 sweeps: SUCCESS, a second "funds are there"
    await stack.settle()
    ledger = await stack.ledger()
    assert [(r["transaction_id"], r["amount"], r["trigger"]) for r in ledger] == [
        (tx, "1234.5678", "credited")
    ]
    # Redelivery and a restart change nothing: still one entry, still one submission.
    await stack.restart_worker()
    await stack.settle()
    assert len(await stack.ledger()) == 1
    assert len(submits(recorded, tx)) == 2
    assert (await stack.deposit(tx)).state.value == "completed"  # type: ignore[union-attr]
    assert [a["outcome"] for a in await actions_of(stack, tx, "book")] == ["booked"]
    assert stack.slack == [] and stack.emails == []  # nothing needed a human


async def test_wallet_fallback_profile_used_for_unknown_address(
    make_stack: MakeStack, recorded: Recorded
) -> None:
    """Unknown address into a wallet with a fallback profile: that profile is submitted."""
    stack = await make_stack()
    order = stack.sandbox.inject_deposit(1002, "USDC", "ETH", "75.125", "0xUnknownPayer0001")
    tx = order["transactionId"]
    await submitted(stack, tx)
    [action] = await actions_of(stack, tx, "submit_profile")
    assert action["params"]["profile"] == "e2e-person"
    [call] = submits(recorded, tx)
    assert json.loads(call["body"]) == PERSON
    assert call["headers"]["Idempotency-Key"] == action["idempotency_key"]

    stack.sandbox.approve_review(tx)  # wallet 1002: no sweep, SUCCESS at once
    await stack.settle()
    assert [(r["transaction_id"], r["amount"]) for r in await stack.ledger()] == [(tx, "75.125")]
    assert (await stack.deposit(tx)).state.value == "completed"  # type: ignore[union-attr]


async def test_no_profile_alerts_on_slack_and_email_and_submits_nothing(
    make_stack: MakeStack, recorded: Recorded
) -> None:
    """No profile applies: one warning alert per channel, nothing submitted."""
    stack = await make_stack()
    tx = stack.sandbox.inject_deposit(
        1001, "USDT", "TRON", "980", "TNobodyKnowsThisPayer00000000001"
    )["transactionId"]
    await stack.wait_for(lambda: stack.slack_for(tx) and stack.emails_for(tx), what="alerts")
    await stack.settle()
    [slack] = stack.slack_for(tx, "needs_details")
    [mail] = stack.emails_for(tx, "needs_details")
    assert "WARNING" in slack["text"] and "Payer details needed" in slack["text"]
    assert "WARNING" in mail["Subject"] and "980" in mail["Subject"]
    assert tx in mail.get_content() and "payer details needed" in mail.get_content()
    assert submits(recorded, tx) == []
    assert await actions_of(stack, tx, "submit_profile") == []
    assert (await stack.deposit(tx)).state.value == "needs_details"  # type: ignore[union-attr]
    assert stack.sandbox.state.order(tx).white_list_status.value == "init"
    assert len(stack.slack) == 1 and len(stack.emails) == 1


async def test_a_profile_added_after_the_alert_submits_the_held_deposit(
    make_stack: MakeStack, recorded: Recorded
) -> None:
    """The human's answer to "payer details needed" is a profile for the address: on the
    reload the held deposit is submitted (once; another reload changes nothing)."""
    payer = "TNobodyKnewThisPayerUntilNow0001"
    stack = await make_stack()
    tx = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "980", payer)["transactionId"]
    await stack.wait_for(lambda: stack.slack_for(tx, "needs_details"), what="the alert")
    await stack.settle()
    assert submits(recorded, tx) == []

    known = f'"{ENTITY_ADDRESS}": "e2e-entity"'
    added = profiles_yaml().replace(known, f'{known}, "{payer}": "e2e-entity"')
    assert payer in added
    assert await stack.rewrite_profiles(added)
    await submitted(stack, tx)
    assert await stack.rewrite_profiles(added + "\n")
    await stack.settle()
    [row] = await actions_of(stack, tx, "submit_profile")
    assert (row["trigger"], row["status"]) == ("profile_added", "done")
    assert len(submits(recorded, tx)) == 1
    assert (await stack.deposit(tx)).state.value == "submitted"  # type: ignore[union-attr]


async def test_rejection_alerts_without_resubmit_until_profile_changes(
    make_stack: MakeStack, recorded: Recorded
) -> None:
    """Rejected: alert with failMessage, no resubmit; changed profile: resubmitted once, new key."""
    stack = await make_stack()
    tx = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "500", ENTITY_ADDRESS)["transactionId"]
    await submitted(stack, tx)
    first_key = submits(recorded, tx)[0]["headers"]["Idempotency-Key"]

    stack.sandbox.reject_review(tx, "company address does not match the registry")
    await stack.settle()
    # Two more rounds of the history poll (each reads the new and the rejected deposits): still
    # no resubmission.
    asked = history_reads(recorded)
    await stack.wait_for(lambda: history_reads(recorded) >= asked + 4, what="two more polls")
    await stack.settle()
    assert len(submits(recorded, tx)) == 1
    [slack] = stack.slack_for(tx, "rejected")
    [mail] = stack.emails_for(tx, "rejected")
    for text in (json.dumps(slack), mail.get_content()):
        assert "company address does not match the registry" in " ".join(text.split())
    assert (await stack.deposit(tx)).state.value == "rejected"  # type: ignore[union-attr]

    # Reloading an unchanged file is no correction.
    assert await stack.rewrite_profiles(profiles_yaml())
    await stack.settle()
    assert len(submits(recorded, tx)) == 1

    corrected = {**ENTITY, "companyAddress": "78 Quartz Boulevard, Singapore"}
    assert await stack.rewrite_profiles(profiles_yaml(entity=corrected))
    await stack.settle()
    assert await stack.rewrite_profiles(profiles_yaml(entity=corrected))  # reload again: no-op
    await stack.settle()
    calls = submits(recorded, tx)
    assert len(calls) == 2
    second_key = calls[1]["headers"]["Idempotency-Key"]
    assert second_key != first_key
    assert json.loads(calls[1]["body"]) == corrected
    rows = await actions_of(stack, tx, "submit_profile")
    assert [(r["trigger"], r["status"]) for r in rows] == [
        ("needs_details", "done"),
        ("profile_changed", "done"),
    ]
    assert rows[1]["idempotency_key"] == second_key

    stack.sandbox.approve_review(tx)
    await stack.settle()
    assert [r["transaction_id"] for r in await stack.ledger()] == [tx]
    assert len(submits(recorded, tx)) == 2
    assert len(stack.slack_for(tx)) == 1  # the rejection only
    assert_no_payer_data(stack)


RULES_EVERY_MATCH = """
wallet: '*'
rules:
  - name: submit
    on: [needs_details]
    if: {profile: found}
    then: [submit_profile]
  - name: warn on rejection
    on: [rejected]
    then: [{alert: {severity: warning, channels: [slack]}}]
  - name: escalate rejection
    on: [rejected]
    then: [{alert: {severity: critical, channels: [slack]}}]
  - name: every failed event
    on: [DEPOSIT_WHITELIST_FAILED]
    then: [{alert: {severity: warning, channels: [email]}}]
  - name: funds in
    on: [credited, completed]
    then: [{alert: {severity: info, channels: [slack]}}]
"""


async def test_every_matching_rule_acts_and_once_per_fact(
    make_stack: MakeStack, tmp_path: Path
) -> None:
    """Two rules alerting on the same trigger both alert, each rejection round again; a rule on
    a raw eventType alerts for each such event; a rule naming two triggers that one fact causes
    together (the CREDITED webhook lost, SUCCESS says both) acts once."""
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "every.yaml").write_text(RULES_EVERY_MATCH)
    stack = await make_stack(rules=rules, scheduler=False)
    tx = stack.sandbox.inject_deposit(1002, "USDT", "TRON", "7", ENTITY_ADDRESS)["transactionId"]
    for round_ in (1, 2):
        await submitted(stack, tx)
        stack.sandbox.reject_review(tx, f"rejection {round_}")
        await stack.settle()
        texts = [json.dumps(p) for p in stack.slack_for(tx)]
        assert sum("CRITICAL" in t for t in texts) == round_
        assert sum("WARNING" in t for t in texts) == round_
        assert len(stack.emails_for(tx)) == round_
        corrected = {**ENTITY, "companyAddress": f"{round_} Quartz Boulevard, Singapore"}
        assert await stack.rewrite_profiles(profiles_yaml(entity=corrected))
        await stack.settle()
    await submitted(stack, tx)
    stack.sandbox.drop_webhooks(1)  # DEPOSIT_WHITELIST_CREDITED
    stack.sandbox.approve_review(tx)
    await stack.settle()
    assert (await stack.deposit(tx)).state.value == "completed"  # type: ignore[union-attr]
    funds_in = [p for p in stack.slack_for(tx) if "INFO" in json.dumps(p)]
    assert len(funds_in) == 1


@pytest.mark.parametrize("provider_clock_offset_ms", [-30_000, 30_000])
async def test_rejections_and_resubmissions_tracked_whatever_the_provider_clock(
    make_stack: MakeStack, recorded: Recorded, provider_clock_offset_ms: int
) -> None:
    """Our own submission is placed in the provider's time, never this machine's: with the
    provider's clock 30 s behind, its rejection (older than our clock) still wins over our
    "pending"; 30 s ahead, our resubmission still wins over its earlier rejection."""
    stack = await make_stack(provider_clock_offset_ms=provider_clock_offset_ms)
    tx = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "500", ENTITY_ADDRESS)["transactionId"]
    for round_ in (1, 2):
        await submitted(stack, tx)
        assert (await stack.deposit(tx)).state.value == "submitted"  # type: ignore[union-attr]
        stack.sandbox.reject_review(tx, f"rejection {round_}")
        await stack.settle()
        assert (await stack.deposit(tx)).state.value == "rejected"  # type: ignore[union-attr]
        assert len(stack.slack_for(tx)) == round_  # each rejection alerts
        corrected = {**ENTITY, "companyAddress": f"{round_} Quartz Boulevard, Singapore"}
        assert await stack.rewrite_profiles(profiles_yaml(entity=corrected))
        await stack.settle()
        assert len(submits(recorded, tx)) == round_ + 1
    await submitted(stack, tx)
    assert (await stack.deposit(tx)).state.value == "submitted"  # type: ignore[union-attr]


@pytest.mark.parametrize("provider_clock_offset_ms", [-600_000, -60_000, 0, 60_000, 600_000])
async def test_a_stale_read_of_a_rejection_never_undoes_a_resubmission(
    make_stack: MakeStack, recorded: Recorded, provider_clock_offset_ms: int
) -> None:
    """Facts are ordered in this machine's clock: a detail read of the first rejection whose
    request was sent before the corrected profile was submitted, and whose answer is applied
    after that submission was accepted, changes nothing (the deposit stays submitted, no second
    rejection alert, no third payload), whether the provider's clock is 10 minutes behind or
    ahead; the next rejection, read by a poll with no webhook, is still taken."""
    stack = await make_stack(provider_clock_offset_ms=provider_clock_offset_ms, scheduler=False)
    client = stack.runtime.client
    assert client is not None
    tx = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "500", ENTITY_ADDRESS)["transactionId"]
    await submitted(stack, tx)
    stack.sandbox.reject_review(tx, "rejection 1")
    await stack.settle()
    assert (await stack.deposit(tx)).state.value == "rejected"  # type: ignore[union-attr]
    stale_sent_at = now_ms()
    stale = await client.transaction_detail(tx)  # the old rejection, read now...
    corrected = {**ENTITY, "companyAddress": "1 Quartz Boulevard, Singapore"}
    assert await stack.rewrite_profiles(profiles_yaml(entity=corrected))
    await submitted(stack, tx)
    assert (await stack.deposit(tx)).state.value == "submitted"  # type: ignore[union-attr]
    # ... and applied after the resubmission was accepted.
    await stack.processor.observe_fact(fact_from_order(stale, sent_at=stale_sent_at))
    await stack.settle()
    assert (await stack.deposit(tx)).state.value == "submitted"  # type: ignore[union-attr]
    assert len(stack.slack_for(tx, "rejected")) == 1
    assert len(submits(recorded, tx)) == 2
    # The second rejection's webhook is lost: a detail read sent after it still rejects.
    stack.sandbox.drop_webhooks(1)
    stack.sandbox.reject_review(tx, "rejection 2")
    sent_at = now_ms()
    fresh = await client.transaction_detail(tx)
    await stack.processor.observe_fact(fact_from_order(fresh, sent_at=sent_at))
    await stack.settle()
    deposit = await stack.deposit(tx)
    assert deposit is not None and deposit.state.value == "rejected"
    assert deposit.fail_message == "rejection 2"
    rejections = [p for p in stack.slack_for(tx) if "rejected" in json.dumps(p)]
    assert len(rejections) == 2 and "rejection 2" in json.dumps(rejections[-1])


@pytest.mark.parametrize("update_time", [True, False], ids=["updateTime", "no updateTime"])
async def test_a_rejection_read_by_a_poll_after_a_lost_webhook_is_taken(
    make_stack: MakeStack, update_time: bool
) -> None:
    """The submission was accepted, its DEPOSIT_WHITELIST_FAILED webhook is lost: the detail
    poll's read of `rejected` (a record with or without updateTime, whose createTime is older
    than the submission) rejects the deposit and alerts once."""
    stack = await make_stack(scheduler=False)
    client = stack.runtime.client
    assert client is not None
    tx = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "500", ENTITY_ADDRESS)["transactionId"]
    await submitted(stack, tx)
    stack.sandbox.drop_webhooks(1)
    stack.sandbox.reject_review(tx, "name mismatch")
    sent_at = now_ms()
    order = await client.transaction_detail(tx)
    if not update_time:
        order = order.model_copy(update={"updateTime": None})
    await stack.processor.observe_fact(fact_from_order(order, sent_at=sent_at))
    await stack.settle()
    deposit = await stack.deposit(tx)
    assert deposit is not None and deposit.state.value == "rejected"
    assert len(stack.slack_for(tx, "rejected")) == 1


async def post_webhook(stack: Stack, envelope: Mapping[str, Any]) -> int:
    """Post one signed webhook to the worker's ingress; the HTTP status."""
    import aiohttp

    body = jsonio.dumpb(dict(envelope))
    headers = signed_headers(
        stack.webhook_api_key, stack.webhook_secret, "POST", WEBHOOK_PATH, body
    )
    headers["Content-Type"] = "application/json"
    async with (
        aiohttp.ClientSession() as session,
        session.post(stack.webhook_url, data=body, headers=headers) as resp,
    ):
        return resp.status


async def test_alerts_once_per_condition_and_never_carry_payer_data(
    make_stack: MakeStack,
) -> None:
    """The same BLOCKED and FAILED facts seen five times give one alert each, no payer data."""
    stack = await make_stack(scheduler=False)
    blocked = stack.sandbox.inject_deposit(
        1002, "USDT", "TRON", "10", "TBlockedPayer000000000000000001"
    )
    rejected = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "20", ENTITY_ADDRESS)
    await submitted(stack, blocked["transactionId"])
    await submitted(stack, rejected["transactionId"])

    tx_b = blocked["transactionId"]
    stack.sandbox.block(tx_b)  # no webhook: only transaction detail shows it
    for _ in range(5):  # what five detail polls do
        order = await stack.runtime.client.transaction_detail(tx_b)  # type: ignore[union-attr]
        await stack.processor.observe_fact(fact_from_order(order, source="poll", sent_at=now_ms()))
        await stack.settle()

    tx_r = rejected["transactionId"]
    stack.sandbox.reject_review(tx_r, "payer name unreadable")
    await stack.settle()
    [failed] = [
        d.envelope
        for d in stack.sandbox.deliverer.history
        if d.envelope["eventType"] == "DEPOSIT_WHITELIST_FAILED"
    ]
    for n in range(4):  # the provider resends the same fact under new eventIds
        assert (
            await post_webhook(stack, {**failed, "eventId": f"{failed['eventId']}-again{n}"}) == 200
        )
        await stack.settle()
    assert (
        len([e for e in await stack.events(tx_r) if e["event_type"] == "DEPOSIT_WHITELIST_FAILED"])
        == 5
    )

    assert len(stack.slack_for(tx_b, "blocked")) == 1
    assert len(stack.emails_for(tx_b, "blocked")) == 1
    assert "CRITICAL" in stack.slack_for(tx_b, "blocked")[0]["text"]
    assert len(stack.slack_for(tx_r, "rejected")) == 1
    assert len(stack.emails_for(tx_r, "rejected")) == 1
    assert len(stack.slack) == 2 and len(stack.emails) == 2
    # Alerts name the profile, never its contents.
    assert "e2e-entity" in json.dumps(stack.slack_for(tx_r, "rejected"))
    assert_no_payer_data(stack)


@pytest.mark.parametrize("engine", ["sqlite"])  # SQLite's query plans
async def test_every_filtered_lookup_while_processing_uses_an_index(
    make_stack: MakeStack,
) -> None:
    """What the worker writes through (processor, reactor, outbox) never scans a whole table to
    find rows: that cost grows with every event and action ever recorded."""
    stack = await make_stack()
    statements: list[str] = []
    stack.store._wdb.conn.set_trace_callback(statements.append)  # type: ignore[union-attr]
    booked, rejected = (
        stack.sandbox.inject_deposit(1001, "USDT", "TRON", amount, ENTITY_ADDRESS)["transactionId"]
        for amount in ("12.5", "20")
    )
    await submitted(stack, booked)
    await submitted(stack, rejected)
    stack.sandbox.approve_review(booked)
    stack.sandbox.reject_review(rejected, "payer name unreadable")
    await stack.settle()
    stack.sandbox.finish_sweep(booked)
    await stack.settle()
    assert len(await stack.ledger()) == 1
    assert len(stack.slack_for(rejected, "rejected")) == 1

    plans = sqlite3.connect(stack.store.path)
    scans = set()
    for sql in set(statements):
        if " WHERE " not in sql.upper():
            continue  # a whole-table statement by design
        for _, _, _, detail in plans.execute("EXPLAIN QUERY PLAN " + sql):
            # SCAN CONSTANT ROW: the one row of an INSERT ... SELECT of values, not a table.
            if detail.startswith("SCAN ") and detail != "SCAN CONSTANT ROW":
                scans.add(f"{detail}: {sql}")
    plans.close()
    assert len(statements) > 50
    assert sorted(scans) == []


def cli(stack: Stack, *args: str) -> str:
    """Run `python -m worker ARGS --config <stack config>`; its stdout (exit status 0)."""
    done = subprocess.run(
        [sys.executable, "-m", "worker", *args, "--config", str(stack.config_path)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_ledger_json_and_deposit_history_commands(make_stack: MakeStack) -> None:
    """`ledger --json` prints docs/reference.md's objects; `deposits TX` shows the actions."""
    stack = await make_stack(scheduler=False)
    order = stack.sandbox.inject_deposit(1002, "USDT", "TRON", "1234.5678", ENTITY_ADDRESS)
    tx = order["transactionId"]
    await submitted(stack, tx)
    stack.sandbox.approve_review(tx)
    await stack.settle()

    lines = cli(stack, "ledger", "--json").splitlines()
    assert len(lines) == 1
    entry = json.loads(lines[0])
    booked_at = entry.pop("bookedAt")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", booked_at)
    assert entry == {
        "transactionId": tx,
        "walletId": 1002,
        "walletName": "Ops",
        "currency": "USDT",
        "network": "TRON",
        "amount": "1234.5678",
        "fromAddress": ENTITY_ADDRESS,
        "txHash": order["transactionHash"],
        "trigger": "credited",
    }
    assert re.search(r'"amount":\s*"1234.5678"', lines[0])  # a string, not a JSON number

    history = json.loads(cli(stack, "deposits", tx, "--json"))
    rows = await stack.actions(tx)
    assert [(a["action"], a["trigger"], a["ruleSetVersion"]) for a in history["actions"]] == [
        (r["action"], r["trigger"], r["rule_set_version"]) for r in rows
    ]
    assert [a["action"] for a in history["actions"]] == ["submit_profile", "book"]
    assert all(a["ruleSetVersion"] for a in history["actions"])
    text = cli(stack, "deposits", tx)
    assert rows[0]["rule_set_version"] in text and "submit_profile" in text
    for value in PAYER_DATA:
        assert value not in text


async def test_forward_posts_signed_deposit_and_retries_after_500(
    make_stack: MakeStack,
    tmp_path: Path,
    aiohttp_server: AiohttpServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`forward` POSTs the signed deposit JSON; a 500 is retried until the endpoint takes it."""
    received: list[tuple[bytes, dict[str, str]]] = []

    async def merchant(request: web.Request) -> web.Response:
        received.append((await request.read(), dict(request.headers)))
        return web.Response(status=500 if len(received) == 1 else 200)

    app = web.Application()
    app.router.add_post("/merchant/deposits", merchant)
    server = await aiohttp_server(app)
    url = str(server.make_url("/merchant/deposits"))
    monkeypatch.setenv("E2E_FORWARD_SECRET", "forward-secret-1")
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "forward.yaml").write_text(
        "wallet: '*'\n"
        "rules:\n"
        "  - name: submit\n"
        "    on: [needs_details]\n"
        "    if: {profile: found}\n"
        "    then: [submit_profile]\n"
        "  - name: book and tell the books\n"
        "    on: [credited]\n"
        f"    then: [book, {{forward: {{url: '{url}', secret_env: E2E_FORWARD_SECRET}}}}]\n"
    )
    stack = await make_stack(rules=rules, scheduler=False)
    tx = stack.sandbox.inject_deposit(1002, "USDT", "TRON", "42.000001", ENTITY_ADDRESS)[
        "transactionId"
    ]
    await submitted(stack, tx)
    stack.sandbox.approve_review(tx)
    await stack.settle()
    await stack.wait_for(lambda: len(received) == 2, what="forward retried")
    await stack.settle()

    assert len(received) == 2
    assert received[0][0] == received[1][0]
    body = jsonio.loads(received[1][0])
    deposit = await stack.deposit(tx)
    assert deposit is not None
    assert body["transactionId"] == tx and body["amount"] == "42.000001"
    assert body["walletId"] == 1002 and body["state"] in ("credited", "completed")
    headers = received[1][1]
    verify(
        headers,
        "POST",
        "/merchant/deposits",
        received[1][0],
        api_key=headers["API-KEY"],
        secrets=["forward-secret-1"],
        tolerance_s=60,
        scheme=METHOD_PATH_V1,  # forward's own scheme, whatever the provider's
    )
    [forward] = await actions_of(stack, tx, "forward")
    assert forward["status"] == "done" and forward["attempts"] == 2
    assert "forward-secret-1" not in json.dumps(forward)
    assert len(await stack.ledger()) == 1


async def test_rule_resubmitting_on_rejection_never_resends_identical_payload(
    make_stack: MakeStack, tmp_path: Path, recorded: Recorded
) -> None:
    """A rule that submits on `rejected` sends nothing until the profile has changed."""
    rules = tmp_path / "resubmit-rules"
    rules.mkdir()
    (rules / "resubmit.yaml").write_text(
        "wallet: '*'\n"
        "rules:\n"
        "  - name: submit, and again after a rejection\n"
        "    on: [needs_details, rejected]\n"
        "    if: {profile: found}\n"
        "    then: [submit_profile]\n"
        "  - name: book\n"
        "    on: [credited]\n"
        "    then: [book]\n"
    )
    stack = await make_stack(rules=rules, scheduler=False)
    tx = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "64", ENTITY_ADDRESS)["transactionId"]
    await submitted(stack, tx)
    stack.sandbox.reject_review(tx, "unreadable")
    await stack.settle()
    assert len(submits(recorded, tx)) == 1
    assert (await stack.deposit(tx)).state.value == "rejected"  # type: ignore[union-attr]
    assert stack.sandbox.state.order(tx).white_list_status.value == "rejected"

    corrected = {**ENTITY, "walletLabel": "Quartz cold wallet"}
    assert await stack.rewrite_profiles(profiles_yaml(entity=corrected))
    await stack.settle()
    calls = submits(recorded, tx)
    assert len(calls) == 2 and json.loads(calls[1]["body"]) == corrected
    assert stack.sandbox.state.order(tx).white_list_status.value == "pending"


async def test_profile_change_does_not_submit_what_the_rules_left_to_a_human(
    make_stack: MakeStack, tmp_path: Path, recorded: Recorded
) -> None:
    """A rejected deposit that a human submitted (rules said no) is not resubmitted on reload."""
    rules = tmp_path / "amount-rules"
    rules.mkdir()
    (rules / "amount.yaml").write_text(
        "wallet: '*'\n"
        "rules:\n"
        "  - name: submit small deposits\n"
        "    on: [needs_details]\n"
        "    if: {profile: found, amount: {lte: '100'}}\n"
        "    then: [submit_profile]\n"
        "  - name: a human looks at big ones\n"
        "    on: [needs_details]\n"
        "    if: {amount: {gt: '100'}}\n"
        "    then: [{alert: {severity: warning}}]\n"
    )
    stack = await make_stack(rules=rules, scheduler=False)
    tx = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "5000", ENTITY_ADDRESS)["transactionId"]
    await stack.settle()
    assert submits(recorded, tx) == [] and len(stack.slack_for(tx)) == 1
    client = stack.runtime.client
    assert client is not None
    await client.submit_payer(tx, ENTITY, idempotency_key="by-hand-1")  # the human
    stack.sandbox.reject_review(tx, "unreadable")
    await stack.settle()
    assert (await stack.deposit(tx)).state.value == "rejected"  # type: ignore[union-attr]

    assert await stack.rewrite_profiles(profiles_yaml(entity={**ENTITY, "walletLabel": "x"}))
    await stack.settle()
    assert [c["headers"]["Idempotency-Key"] for c in submits(recorded, tx)] == ["by-hand-1"]
    assert await actions_of(stack, tx, "submit_profile") == []
