"""End to end: what the journal records of a running depositd (docs/audit.md, "What is
recorded"). The provider sandbox delivers webhooks to the real worker; its submissions, its
bookings, the console's operator actions and a reconciliation each append their entry with
what they decided, and no payer value ever reaches it."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.stacks import MakeStack
from worker.commands.cli import main
from worker.dev.harness import Stack
from worker.dev.sandbox.testing import ENTITY_PAYER
from worker.rules.fingerprint import rules_hash
from worker.store import journal, submissions

ENTITY_ADDRESS = "TE2eJournalEntity0000000000000001"
NO_PROFILE = "TE2eJournalNobody0000000000000001"  # wallet 1001 has no fallback profile
PROFILES = json.dumps(
    {"profiles": {"journal-entity": ENTITY_PAYER}, "addresses": {ENTITY_ADDRESS: "journal-entity"}}
)


async def entries_of(stack: Stack) -> list[journal.Entry]:
    """The stack's journal, its chain checked whole."""
    entries = await stack.store.read(lambda db: list(journal.entries(db)))
    assert journal.chain_problem(entries) is None
    return entries


def assert_no_payer_value(entries: list[journal.Entry], payer: dict[str, Any]) -> None:
    """No value of the payer profile appears anywhere in the journal's text."""
    text = json.dumps([e.as_json() for e in entries], ensure_ascii=False)
    for value in payer.values():
        assert str(value) not in text, value


async def rows(stack: Stack, sql: str, *args: Any) -> list[dict[str, Any]]:
    """Rows of a query on the stack's store, as dicts."""
    return await stack.store.read(lambda db: [dict(r) for r in db.execute(sql, args).fetchall()])


async def wait_done(stack: Stack, tx: str) -> dict[str, Any]:
    """The deposit's submission once its outcome is recorded."""

    async def recorded() -> bool:
        found = [a for a in await stack.actions(tx) if a["action"] == "submit_profile"]
        return bool(found) and found[-1]["status"] in ("done", "failed")

    await stack.wait_for(recorded, what="the submission's outcome")
    await stack.settle()
    return [a for a in await stack.actions(tx) if a["action"] == "submit_profile"][-1]


async def test_a_submission_and_the_booking_that_follows_are_journalled(
    start_stack: MakeStack, tmp_path: Path
) -> None:
    """The sandbox's webhooks for a deposit from a known address: its submission (accepted)
    is journalled with the profile, the field names and the hash of the payload kept in
    `submissions`, the rule and the rules hash; once credited, its booking with the ledger
    row, the rule and the event. No payer value is in the journal."""
    profiles = tmp_path / "profiles.yaml"
    profiles.write_text(PROFILES)
    stack = await start_stack(profiles=profiles)
    tx = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "1234.5678", ENTITY_ADDRESS)[
        "transactionId"
    ]
    action = await wait_done(stack, tx)
    assert action["status"] == "done"
    stack.sandbox.approve_review(tx)
    await stack.settle()
    stack.sandbox.finish_sweep(tx)
    await stack.settle()
    [row] = await stack.ledger()
    entries = await entries_of(stack)
    assert [(e.kind, e.subject) for e in entries] == [
        (journal.SUBMITTED, tx),
        (journal.BOOKED, tx),
    ]
    submitted, booked = entries
    in_force = rules_hash(stack.runtime.bundle.rules, stack.runtime.bundle.profiles)
    [kept] = await stack.store.read(lambda db: submissions.of_deposit(db, tx))
    assert kept["payload_sha256"] == submissions.payload_sha256(ENTITY_PAYER)
    assert submitted.body == {
        "action_id": action["id"],
        "profile": "journal-entity",
        "fields": sorted(ENTITY_PAYER),
        "payload_sha256": kept["payload_sha256"],
        "rule_set": action["rule_set"],
        "rule_set_version": action["rule_set_version"],
        "rules_hash": in_force,
        "outcome": "done",
    }
    assert (kept["action_id"], kept["outcome"]) == (action["id"], "done")
    [book] = [a for a in await stack.actions(tx) if a["action"] == "book"]
    assert booked.body == {
        **journal.ledger_body(row),
        "rule_set": book["rule_set"],
        "rule_set_version": book["rule_set_version"],
        "rules_hash": in_force,
        "event_id": book["event_id"],
    }
    assert book["event_id"] in {e["event_id"] for e in await stack.events(tx)}
    assert_no_payer_value(entries, ENTITY_PAYER)


async def test_a_submission_the_provider_refuses_is_journalled_failed(
    start_stack: MakeStack, tmp_path: Path
) -> None:
    """A submission refused by its wallet code (10000102, the details refused): SUBMITTED with
    the outcome failed, its payload hash the one kept."""
    profiles = tmp_path / "profiles.yaml"
    profiles.write_text(PROFILES)
    stack = await start_stack(profiles=profiles)
    stack.sandbox.set_fault("submit", "code", code="10000102")
    tx = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "5", ENTITY_ADDRESS)["transactionId"]
    action = await wait_done(stack, tx)
    assert action["status"] == "failed"
    [entry] = [e for e in await entries_of(stack) if e.kind == journal.SUBMITTED]
    assert (entry.subject, entry.body["outcome"], entry.body["action_id"]) == (
        tx,
        "failed",
        action["id"],
    )
    [kept] = await stack.store.read(lambda db: submissions.of_deposit(db, tx))
    assert entry.body["payload_sha256"] == kept["payload_sha256"]
    assert kept["outcome"] == "failed"


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


async def test_operator_actions_and_reconciliations_are_journalled(
    start_stack: MakeStack,
) -> None:
    """The console's submission of a stored profile (refused once, then queued), its
    reconciliation of a day with a finding, the acknowledgement of that finding by
    `depositd reconcile --ack`: an OPERATOR entry each, with who, the note and the outcome, a
    RECONCILED entry for the day, and the SUBMITTED entry of the approved submission."""
    stack = await start_stack(console=True, scheduler=False)
    tx = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "75.00", NO_PROFILE)["transactionId"]
    await stack.settle()
    day = dt.datetime.now(dt.UTC).date().isoformat()
    stack.sandbox.add_discrepancy(
        {
            "kind": "extra",
            "date": day,
            "asset": "USDT",
            "network": "TRON",
            "amount": "3.5",
            "txHash": "0xjournalextra",
        }
    )
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session:
        csrf = await _login(session, stack)
        post = f"{stack.console_url}/deposits/{tx}/submit"
        assert await _post(session, post, {"csrf": csrf, "profile": "nobody"}) == 400
        data = {"csrf": csrf, "profile": "demo-entity", "note": "called the payer"}
        assert await _post(session, post, data) == 303
        await wait_done(stack, tx)
        again = {"csrf": csrf, "day": day, "note": "after the report came"}
        assert await _post(session, f"{stack.console_url}/reconcile", again) == 303
    [finding] = await rows(stack, "SELECT id FROM findings")
    config = str(stack.config_path)
    ack = ["reconcile", "--ack", str(finding["id"]), "--by", "bo", "--note", "known extra"]
    assert await asyncio.to_thread(main, [*ack, "--config", config]) == 0
    assert await asyncio.to_thread(main, [*ack, "--config", config]) == 1  # refused: recorded
    entries = await entries_of(stack)
    operator = [(e.subject, e.body) for e in entries if e.kind == journal.OPERATOR]
    assert [(s, b["action"], b["by"], b["note"]) for s, b in operator] == [
        (tx, "submit_profile", "ana@127.0.0.1", ""),
        (tx, "submit_profile", "ana@127.0.0.1", "called the payer"),
        (f"day#{day}", "reconcile", "ana@127.0.0.1", "after the report came"),
        (f"finding#{finding['id']}", "ack_finding", "bo@cli", "known extra"),
        (f"finding#{finding['id']}", "ack_finding", "bo@cli", "known extra"),
    ]
    outcomes = [b["outcome"] for _, b in operator]
    assert outcomes[0].startswith("unknown profile 'nobody'")
    assert outcomes[1].startswith("queued submission #")
    assert outcomes[3:] == ["acknowledged", "refused: acknowledged already by bo"]
    [submitted] = [e for e in entries if e.kind == journal.SUBMITTED]
    assert (submitted.subject, submitted.body["profile"]) == (tx, "demo-entity")
    assert submitted.body["rule_set"] is None  # an operator's decision, not a rule's
    [run] = await rows(stack, "SELECT * FROM reconcile_runs")
    [reconciled] = [e for e in entries if e.kind == journal.RECONCILED]
    assert (reconciled.subject, reconciled.body) == (
        f"day:{day}",
        {
            "day": day,
            "outcome": run["outcome"],
            "findings": 1,
            "ledger_mark": run["ledger_mark"],
        },
    )
    shipped = stack.runtime.bundle.profiles
    for name in shipped.names():
        assert_no_payer_value(entries, shipped.body(name))


@pytest.mark.parametrize("engine", ["sqlite"])
async def test_the_rules_hash_follows_the_rules_and_the_profiles(
    start_stack: MakeStack, tmp_path: Path
) -> None:
    """The hash changes with a profile's content (a corrected profile) and stays for the same
    files read again."""
    profiles = tmp_path / "profiles.yaml"
    profiles.write_text(PROFILES)
    stack = await start_stack(profiles=profiles, scheduler=False)
    bundle = stack.runtime.bundle
    before = rules_hash(bundle.rules, bundle.profiles)
    corrected = json.loads(PROFILES)
    corrected["profiles"]["journal-entity"]["companyAddress"] = "3 Other Road"
    assert await stack.rewrite_profiles(json.dumps(corrected))
    after = rules_hash(stack.runtime.bundle.rules, stack.runtime.bundle.profiles)
    assert after != before
    assert await stack.rewrite_profiles(PROFILES)
    assert rules_hash(stack.runtime.bundle.rules, stack.runtime.bundle.profiles) == before
