"""Deadlines on deposits waiting on a person (docs/rules.md, "Deadlines"): the alert past the
deadline, once per wait, raised, to the escalate channels or the first alert's; against a real
stack (sandbox, worker, SMTP server, Slack endpoint) and a real store, on both engines."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

from tests.support.stacks import MakeStack
from tests.support.stores import StoreMaker
from worker.act.kinds import SPECS
from worker.act.waits import Checked, check_deadlines
from worker.clock import now_ms
from worker.dev.harness import Stack, shipped_profiles
from worker.rules import RuleBook
from worker.schedule.deadlines import DeadlineJob
from worker.store.schema import MIGRATIONS
from worker.store.sqlitestore import Store
from worker.store.waits import Wait, open_waits_of, start_wait
from worker.track.conflicts import decide
from worker.track.facts import fact_from_order
from worker.track.processor import apply_fact
from worker.track.tracker import Fact

MINUTE = 60_000
NO_PROFILE = "TDeadlineNoProfile00000000000001"  # wallet 1001 has no fallback profile
KNOWN_PAYER = "TDemoKnownPayer1111111111111111111"  # demo-entity in rules/profiles.yaml
PAYER_VALUES = ("Demo Trading Ltd", "1 Demo Road, Singapore", "Demo hot wallet")

# Wallet 1001: 30 minutes, escalated to e-mail. Every other wallet: an hour, to the channels
# of the alert that began the wait (a rejection alerts on Slack only).
WALLET_1001 = """\
wallet: 1001
deadline: 30m
escalate: [email]
rules:
  - name: payer details needed
    "on": [needs_details]
    if: {profile: missing}
    then: [{alert: {severity: warning, message: payer details needed}}]
  - name: blocked
    "on": [blocked]
    then: [{alert: {severity: critical}}]
"""
EVERY_WALLET = """\
wallet: "*"
deadline: 1h
rules:
  - name: submit stored profile
    "on": [needs_details]
    if: {profile: found}
    then: [submit_profile]
  - name: rejected
    "on": [rejected]
    then: [{alert: {severity: warning, channels: [slack]}}]
  - name: book
    "on": [credited]
    then: [book]
"""


def rules_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "rules"
    folder.mkdir(exist_ok=True)
    (folder / "wallet-1001.yaml").write_text(WALLET_1001, encoding="utf-8")
    (folder / "default.yaml").write_text(EVERY_WALLET, encoding="utf-8")
    return folder


async def waits_of(stack: Stack, tx: str) -> list[Wait]:
    """The deposit's open waits."""
    return (await stack.store.read(lambda db: open_waits_of(db, [tx]))).get(tx, [])


async def run_at(stack: Stack, now: int) -> Checked:
    """One run of the deadline job with its clock at `now` (epoch ms), then quiet."""
    job = DeadlineJob(stack.store, lambda: stack.runtime.rules, wake=stack.outbox.wake)
    job.clock = lambda: now
    checked = await job.run()
    await stack.settle()
    return checked


async def submitted(stack: Stack, tx: str) -> None:
    """Wait until the deposit's submission is done and the tracker shows it."""

    async def done() -> bool:
        rows = [a for a in await stack.actions(tx) if a["action"] == "submit_profile"]
        return bool(rows) and rows[-1]["status"] == "done"

    await stack.wait_for(done, what="submission done")
    await stack.settle()


async def read_detail(stack: Stack, tx: str) -> None:
    """What a detail poll does for one deposit: its detail read and applied, then quiet."""
    assert stack.runtime.client is not None
    order = await stack.runtime.client.transaction_detail(tx)
    await stack.processor.observe_fact(fact_from_order(order, source="poll", sent_at=now_ms()))
    await stack.settle()


def overdue_mails(stack: Stack, tx: str, reason: str) -> list[Any]:
    return stack.emails_for(tx, f"overdue:{reason}")


def overdue_slack(stack: Stack, tx: str, reason: str) -> list[Any]:
    return stack.slack_for(tx, f"overdue:{reason}")


async def test_past_its_deadline_a_waiting_deposit_alerts_once_raised_to_escalate(
    start_stack: MakeStack, tmp_path: Path
) -> None:
    """A deposit no profile covers alerts (warning, every channel); a minute before its
    deadline nothing more; past it one critical alert to the escalate channel (e-mail) only,
    saying what it waits on and how long; run again, nothing more."""
    stack = await start_stack(rules=rules_folder(tmp_path))
    assert stack.runtime.deadlines is not None, "the scheduler's leader runs the deadline job"
    tx = str(
        stack.sandbox.inject_deposit(1001, "USDT", "TRON", "75.00", NO_PROFILE)["transactionId"]
    )
    await stack.wait_for(
        lambda: bool(
            stack.emails_for(tx, "needs_details") and stack.slack_for(tx, "needs_details")
        ),
        what="the first alert",
    )
    [wait] = await waits_of(stack, tx)
    assert (wait.reason, wait.severity, wait.channels) == ("needs_details", "warning", None)

    assert (await run_at(stack, wait.started_at + 29 * MINUTE)).alerted == ()
    assert overdue_mails(stack, tx, "needs_details") == []

    first = await run_at(stack, wait.started_at + 31 * MINUTE)
    assert [w.transaction_id for w in first.alerted] == [tx]
    await stack.wait_for(lambda: bool(overdue_mails(stack, tx, "needs_details")), what="mail")
    [mail] = overdue_mails(stack, tx, "needs_details")
    assert str(mail["Subject"]).strip().startswith("[depositd] CRITICAL: Overdue")
    body = " ".join(mail.get_content().split())
    assert "Overdue: Payer details needed" in body
    assert "waiting 31 min" in body and "on payer details" in body
    assert "the deadline of wallet-1001.yaml is 30 min" in body
    assert overdue_slack(stack, tx, "needs_details") == [], "escalate names e-mail only"

    for later in (32, 120):
        assert (await run_at(stack, wait.started_at + later * MINUTE)).alerted == ()
    assert len(overdue_mails(stack, tx, "needs_details")) == 1
    assert len(stack.emails_for(tx)) == 2 and len(stack.slack_for(tx)) == 1


async def test_a_deposit_that_stopped_waiting_is_not_alerted_and_a_new_rejection_waits_anew(
    start_stack: MakeStack, tmp_path: Path
) -> None:
    """A rejected deposit resubmitted before its deadline is never alerted past it; rejected
    again, it waits anew from the second rejection: alerted once an hour after that, on the
    rejection alert's channel (Slack), without payer data."""
    stack = await start_stack(rules=rules_folder(tmp_path))
    tx = str(
        stack.sandbox.inject_deposit(1002, "USDT", "TRON", "12.00", KNOWN_PAYER)["transactionId"]
    )
    await submitted(stack, tx)
    assert await waits_of(stack, tx) == [], "a deposit whose profile was submitted does not wait"

    stack.sandbox.reject_review(tx, "company address does not match")
    await stack.settle()
    [first] = await waits_of(stack, tx)
    assert (first.reason, first.channels) == ("rejected", ("slack",))
    assert (await run_at(stack, first.started_at + 59 * MINUTE)).alerted == ()

    data = yaml.safe_load(shipped_profiles().read_text(encoding="utf-8"))
    data["profiles"]["demo-entity"]["companyAddress"] = "2 Demo Road, Singapore"
    assert await stack.rewrite_profiles(yaml.safe_dump(data))
    await stack.settle()
    assert (await stack.deposit(tx)).state.value == "submitted"  # type: ignore[union-attr]
    stopped = await run_at(stack, first.started_at + 61 * MINUTE)
    assert stopped.alerted == () and stopped.ended == 1
    assert await waits_of(stack, tx) == []

    stack.sandbox.reject_review(tx, "company address does not match again")
    await stack.settle()
    [second] = await waits_of(stack, tx)
    assert second.id != first.id and second.started_at > first.started_at
    # The first rejection's deadline has passed, the second's not: counted from the second.
    assert (await run_at(stack, first.started_at + 60 * MINUTE)).alerted == ()
    alerted = await run_at(stack, second.started_at + 60 * MINUTE)
    assert [w.id for w in alerted.alerted] == [second.id]
    assert (await run_at(stack, second.started_at + 90 * MINUTE)).alerted == ()
    await stack.wait_for(lambda: bool(overdue_slack(stack, tx, "rejected")), what="the alert")
    [slack] = overdue_slack(stack, tx, "rejected")
    text = json.dumps(slack)
    assert "CRITICAL: Overdue: Payer details rejected" in text and "waiting 1 h" in text
    assert overdue_mails(stack, tx, "rejected") == []
    for value in PAYER_VALUES:
        assert value not in text


async def test_a_deposit_whose_submission_the_provider_refused_waits_with_a_deadline(
    start_stack: MakeStack, tmp_path: Path
) -> None:
    """The provider refuses the stored profile's details (10000102): the deposit still needs
    payer details and a person must correct them, so it waits from the refusal, and past the
    deadline (an hour for this wallet) it is alerted once."""
    stack = await start_stack(rules=rules_folder(tmp_path))
    stack.sandbox.set_fault("submit", "code", code="10000102")
    tx = str(
        stack.sandbox.inject_deposit(1002, "USDT", "TRON", "12.00", KNOWN_PAYER)["transactionId"]
    )

    async def refused() -> bool:
        rows = [a for a in await stack.actions(tx) if a["action"] == "submit_profile"]
        return bool(rows) and rows[-1]["status"] == "failed"

    await stack.wait_for(refused, what="the refusal")
    await stack.settle()
    [wait] = await waits_of(stack, tx)
    assert (wait.reason, wait.severity) == ("needs_details", "warning")
    assert (await run_at(stack, wait.started_at + 59 * MINUTE)).alerted == ()
    assert [
        w.transaction_id for w in (await run_at(stack, wait.started_at + 61 * MINUTE)).alerted
    ] == [tx]
    assert (await run_at(stack, wait.started_at + 62 * MINUTE)).alerted == ()
    await stack.wait_for(lambda: bool(overdue_mails(stack, tx, "needs_details")), what="mail")
    assert len(overdue_mails(stack, tx, "needs_details")) == 1


async def test_a_blocked_deposit_stays_critical_and_says_overdue(
    start_stack: MakeStack, tmp_path: Path
) -> None:
    """A BLOCKED deposit alerted critical is alerted again past the deadline still critical,
    its title saying overdue; one released before it is not."""
    stack = await start_stack(rules=rules_folder(tmp_path))
    txs = [
        str(stack.sandbox.inject_deposit(1001, "USDT", "TRON", amount, NO_PROFILE)["transactionId"])
        for amount in ("5.00", "6.00")
    ]
    for tx in txs:
        stack.sandbox.block(tx)
        await read_detail(stack, tx)  # only the detail shows BLOCKED
    assert all(stack.slack_for(tx, "blocked") for tx in txs)
    blocked, released = txs
    waits = {tx: [w for w in await waits_of(stack, tx) if w.reason == "blocked"] for tx in txs}
    assert waits[blocked][0].severity == "critical"
    stack.sandbox.release(released)
    await read_detail(stack, released)
    assert (await stack.deposit(released)).state.value == "completed"  # type: ignore[union-attr]
    latest = max(w.started_at for ws in waits.values() for w in ws)
    checked = await run_at(stack, latest + 31 * MINUTE)
    # Blocked, neither waits for payer details any more: only the one still BLOCKED is alerted.
    assert [(w.transaction_id, w.reason) for w in checked.alerted] == [(blocked, "blocked")]
    await stack.wait_for(lambda: bool(overdue_mails(stack, blocked, "blocked")), what="mail")
    [mail] = overdue_mails(stack, blocked, "blocked")
    assert str(mail["Subject"]).strip().startswith("[depositd] CRITICAL: Overdue")
    assert "provider support" in " ".join(mail.get_content().split())
    assert overdue_mails(stack, released, "blocked") == []


async def test_with_two_instances_the_leader_runs_it_and_a_wait_is_alerted_once(
    start_stack: MakeStack, make_store: StoreMaker, tmp_path: Path
) -> None:
    """Two instances on one database: the deadline job runs on the leader only, and the check
    run on both at once past the deadline alerts the wait once."""
    storage = make_store.storage("shared.db")
    folder = rules_folder(tmp_path)
    leader = await start_stack(storage=storage, rules=folder)
    # Alike but for the sinks (each stack has its own): whichever outbox claims the alert sends
    # it. (A follower without `notify` once claimed it and sent nothing, now and then.)
    follower = await start_stack(storage=storage, rules=folder, sole=False)
    assert leader.runtime.deadlines is not None and follower.runtime.deadlines is None
    order = leader.sandbox.inject_deposit(1001, "USDT", "TRON", "9.00", NO_PROFILE)
    tx = str(order["transactionId"])

    async def waiting() -> bool:
        return bool(await waits_of(leader, tx))

    await leader.wait_for(waiting, what="the wait")
    [wait] = await waits_of(leader, tx)
    now = wait.started_at + 31 * MINUTE
    runs = await asyncio.gather(
        *(check_deadlines(s.store, s.runtime.rules, now=now) for s in (leader, follower, leader))
    )
    assert sorted(len(r.alerted) for r in runs) == [0, 0, 1]

    def mails() -> list[Any]:
        return [m for s in (leader, follower) for m in overdue_mails(s, tx, "needs_details")]

    leader.outbox.wake()
    follower.outbox.wake()
    await leader.wait_for(lambda: bool(mails()), what="mail")
    await leader.settle()
    await follower.settle()
    assert len(mails()) == 1


# --- a booking held for a decision, on a store alone ---------------------------------------

TX = "tx-held"
T0 = 1_700_000_000_000
HELD_RULES = """\
wallet: "*"
deadline: 2h
escalate: [slack, email]
rules: []
"""


def conflicting(t: int, amount: str) -> Fact:
    return Fact(
        TX,
        "webhook",
        T0 + t,
        event_id=f"e{t}",
        wallet_id=1001,
        currency="USDT",
        network="TRON",
        amount=Decimal(amount),
        from_address="TFrom",
        to_address="TTo",
        tx_hash="0xabc",
    )


def alert_rows(db: Any) -> list[dict[str, Any]]:
    rows = db.execute(
        "SELECT params, trigger FROM actions WHERE action = 'alert' AND trigger = 'deadline'"
        " ORDER BY id"
    ).fetchall()
    return [{**json.loads(r[0]), "trigger": r[1]} for r in rows]


async def test_a_held_booking_waits_until_decided_and_a_new_conflict_waits_anew(
    store: Store, tmp_path: Path
) -> None:
    """A fixed field in conflict holds the booking: one wait (not two for a second conflict),
    alerted once past the deadline to the escalate channels; decided, the wait ends; a later
    conflict starts a new one, not alerted before its own deadline."""
    path = tmp_path / "held.yaml"
    path.write_text(HELD_RULES, encoding="utf-8")
    rules = RuleBook.load(path, specs=SPECS)
    await store.write(lambda db: apply_fact(db, conflicting(0, "10"), None))
    await store.write(lambda db: apply_fact(db, conflicting(1, "11"), None))
    [first] = (await store.read(lambda db: open_waits_of(db, [TX])))[TX]
    await store.write(lambda db: apply_fact(db, conflicting(2, "12"), None))
    [wait] = (await store.read(lambda db: open_waits_of(db, [TX])))[TX]
    assert (wait.reason, wait.severity) == ("held", "critical")
    assert (wait.id, wait.started_at) == (first.id, first.started_at), "the wait started again"

    assert (await check_deadlines(store, rules, now=wait.started_at + 119 * MINUTE)).alerted == ()
    past = await check_deadlines(store, rules, now=wait.started_at + 121 * MINUTE)
    assert [w.id for w in past.alerted] == [wait.id]
    assert (await check_deadlines(store, rules, now=wait.started_at + 200 * MINUTE)).alerted == ()
    [row] = await store.read(alert_rows)
    assert (row["condition"], row["severity"], row["channels"]) == (
        "overdue:held",
        "critical",
        ["slack", "email"],
    )
    assert "a decision on its held booking" in row["detail"]

    await store.write(lambda db: decide(db, TX, {"amount": Decimal("10")}, by="ana", note=None))
    assert (await store.read(lambda db: open_waits_of(db, [TX]))) == {}
    await store.write(lambda db: apply_fact(db, conflicting(3, "13"), None))
    [again] = (await store.read(lambda db: open_waits_of(db, [TX])))[TX]
    assert again.id != wait.id
    assert (await check_deadlines(store, rules, now=again.started_at + 119 * MINUTE)).alerted == ()
    assert len(await store.read(alert_rows)) == 1


async def test_a_held_booking_decided_on_one_of_two_fields_still_waits(store: Store) -> None:
    """Held for its amount and its receiving address: a decision on the amount alone leaves
    the deposit waiting (on the address); the second decision ends the wait."""
    await store.write(lambda db: apply_fact(db, conflicting(0, "10"), None))
    other = replace(conflicting(1, "11"), to_address="TElsewhere")
    await store.write(lambda db: apply_fact(db, other, None))
    [wait] = (await store.read(lambda db: open_waits_of(db, [TX])))[TX]
    await store.write(lambda db: decide(db, TX, {"amount": Decimal("10")}, by="ana", note=None))
    assert [w.id for w in (await store.read(lambda db: open_waits_of(db, [TX])))[TX]] == [wait.id]
    await store.write(lambda db: decide(db, TX, {"to_address": "TTo"}, by="ana", note=None))
    assert (await store.read(lambda db: open_waits_of(db, [TX]))) == {}


async def test_deposits_waiting_before_the_upgrade_wait_from_the_upgrade(store: Store) -> None:
    """The migration that brings the waits opens one for each deposit waiting then (payer
    details with no submission, rejected, BLOCKED, a booking held), counted from the upgrade,
    and none for the others."""
    rows = [
        ("tx-details", "needs_details", None),
        ("tx-submitted", "needs_details", "done"),
        ("tx-skipped", "needs_details", "skipped"),
        ("tx-rejected", "rejected", None),
        ("tx-blocked", "blocked", None),
        ("tx-credited", "credited", None),
        ("tx-held", "credited", None),
        ("tx-decided", "credited", None),
    ]

    def before(db: Any) -> None:
        db.execute("DELETE FROM waits")
        for tx, state, submission in rows:
            db.execute(
                "INSERT INTO deposits (transaction_id, state, updated_at) VALUES (?, ?, ?)",
                [tx, state, "2026-01-01T00:00:00.000Z"],
            )
            if submission:
                db.execute(
                    "INSERT INTO actions (transaction_id, action, status) VALUES (?, ?, ?)",
                    [tx, "submit_profile", submission],
                )
        for tx, decided in (("tx-held", None), ("tx-decided", "2026-01-02T00:00:00Z")):
            db.execute(
                "INSERT INTO conflicts (transaction_id, field, fixed_value, seen_value,"
                " decided_at) VALUES (?, 'amount', '1', '2', ?)",
                [tx, decided],
            )

    await store.write(before)
    upgrade = MIGRATIONS[[m.__name__ for m in MIGRATIONS].index("_migrate_waits")]
    started = now_ms()
    await store.write(upgrade)
    waits = await store.read(lambda db: open_waits_of(db, [tx for tx, _, _ in rows]))
    assert {tx: [(w.reason, w.severity) for w in ws] for tx, ws in waits.items()} == {
        "tx-details": [("needs_details", "warning")],
        "tx-skipped": [("needs_details", "warning")],
        "tx-rejected": [("rejected", "warning")],
        "tx-blocked": [("blocked", "critical")],
        "tx-held": [("held", "critical")],
    }
    assert all(w.started_at >= started for ws in waits.values() for w in ws)


async def test_a_wait_past_its_deadline_is_found_behind_many_without_one(
    store: Store, tmp_path: Path
) -> None:
    """Hundreds of older waits in a wallet whose rule set has no deadline do not hide one
    whose wallet has a deadline that has passed."""
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "a.yaml").write_text("wallet: 1001\ndeadline: 1h\nrules: []\n")
    (tmp_path / "rules" / "b.yaml").write_text('wallet: "*"\nrules: []\n')
    rules = RuleBook.load(tmp_path / "rules", specs=SPECS)

    def waiting(db: Any) -> None:
        for n in range(450):
            tx, wallet = (f"tx-old-{n}", 1002) if n < 449 else ("tx-due", 1001)
            db.execute(
                "INSERT INTO deposits (transaction_id, wallet_id, state, updated_at)"
                " VALUES (?, ?, 'blocked', '2026-01-01T00:00:00.000Z')",
                [tx, wallet],
            )
            start_wait(
                db, tx, "blocked", now=T0 + n, severity="critical", channels=None, again=False
            )

    await store.write(waiting)
    checked = await check_deadlines(store, rules, now=T0 + 449 + 60 * MINUTE)
    assert [w.transaction_id for w in checked.alerted] == ["tx-due"]
