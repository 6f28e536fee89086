"""`depositd demo [--keep DIR]`: the scripted scenarios of docs/getting-started.md, end to end.

One process runs the sandbox, the worker (shipped rules and demo profiles), an SMTP server and a
Slack endpoint on temporary storage (`worker.dev.harness.Stack`). Each scenario drives the sandbox,
waits for the worker, then prints the webhooks received, the transitions, the actions with their
outcomes, the alerts and the ledger rows. Exit 0 only when every scenario ended as expected.

Profiles are personal data: the demo names a profile, never prints what it holds. Logs go to
`depositd.log` in the work folder so the console stays readable.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import io
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import TextIO

import yaml

from worker.clock import now_ms
from worker.commands.registration import register
from worker.dev import demo_hosted, demo_money
from worker.dev.demokit import Checks, Demo, Result
from worker.dev.harness import Stack
from worker.errors import ConfigError
from worker.logs import configure
from worker.provider.models import AddressStatus, CreditStatus, WhiteListStatus
from worker.store.facts import count_blocked_polls
from worker.track.facts import fact_from_order
from worker.track.tracker import State

KNOWN_PAYER = "TDemoKnownPayer1111111111111111111"  # demo-entity by source address
KNOWN_PERSON = "0x00000000000000000000000000000000000De111"  # demo-person by source address
SCENARIO_TIMEOUT_S = 20.0
DETAIL_REREADS = 3


async def known_profile(demo: Demo) -> Result:
    """Unknown address with a stored profile: auto-submit, approve, credit, book once."""
    tx = demo.inject(1001, "USDT", "TRON", "1250.00", KNOWN_PAYER)
    await demo.wait_submitted(tx)
    demo.step("the worker submitted the stored profile demo-entity; the sandbox approves")
    demo.stack.sandbox.approve_review(tx)
    await demo.wait_state(tx, State.CREDITED)
    demo.step("wallet 1001 sweeps to the main account (auto-collection); the order completes")
    demo.stack.sandbox.finish_sweep(tx)
    await demo.stack.settle()
    check = Checks()
    submits = await demo.submits(tx)
    books = [a for a in await demo.stack.actions(tx) if a["action"] == "book"]
    ledger = await demo.ledger_rows(tx)
    check.expect("completed", await demo.state_of(tx) == State.COMPLETED.value)
    check.expect("one submission", [s["status"] for s in submits] == ["done"])
    check.expect("booked once", len(ledger) == 1 and len(books) == 1)
    return check.result(
        f"{len(submits)} submission, {len(ledger)} ledger row, {await demo.state_of(tx)}"
    )


async def no_profile(demo: Demo) -> Result:
    """No profile: a warning in Slack and by e-mail, nothing submitted."""
    tx = demo.inject(1001, "USDT", "TRON", "75.00", "TUnknownPayer22222222222222222222")
    demo.step("wallet 1001 has no fallback profile and the address has none")
    stack = demo.stack
    await stack.wait_for(
        lambda: bool(
            stack.slack_for(tx, "needs_details") and stack.emails_for(tx, "needs_details")
        ),
        what="the needs_details alert",
    )
    await stack.settle()
    check = Checks()
    slack, mails = stack.slack_for(tx, "needs_details"), stack.emails_for(tx, "needs_details")
    check.expect("one Slack warning", len(slack) == 1 and "WARNING" in slack[0]["text"])
    check.expect("one e-mail warning", len(mails) == 1 and "WARNING" in str(mails[0]["Subject"]))
    submits = await demo.submits(tx)
    check.expect("nothing submitted", not submits and demo.sandbox_wls(tx) is WhiteListStatus.INIT)
    return check.result(
        f"warning: slack {len(slack)}, e-mail {len(mails)}; {len(submits)} submissions"
    )


def corrected_profiles(text: str) -> str:
    """The profiles file with demo-entity's companyAddress corrected (fictitious data)."""
    data = yaml.safe_load(text)
    data["profiles"]["demo-entity"]["companyAddress"] = "1 Demo Road #01-01, Singapore 000001"
    return str(yaml.safe_dump(data, sort_keys=False))


async def rejected_then_corrected(demo: Demo) -> Result:
    """Rejection, then a corrected profile: resubmitted once with a new key, approved, booked."""
    stack = demo.stack
    tx = demo.inject(1002, "USDT", "TRON", "400.00", "TNewPayer333333333333333333333333")
    await demo.wait_submitted(tx)
    reason = "companyAddress does not match the registered address"
    demo.step(f"the worker submitted wallet 1002's fallback profile; the sandbox rejects: {reason}")
    stack.sandbox.reject_review(tx, reason)
    await demo.wait_state(tx, State.REJECTED)
    await stack.wait_for(lambda: bool(stack.slack_for(tx, "rejected")), what="the rejected alert")
    await stack.settle()
    demo.step("profiles file rewritten (demo-entity: companyAddress corrected); reload as SIGHUP")
    text = stack.profiles_path.read_text(encoding="utf-8")
    reloaded = await stack.rewrite_profiles(corrected_profiles(text))
    await demo.wait_submitted(tx)
    demo.step("the worker resubmitted the corrected profile; the sandbox approves")
    stack.sandbox.approve_review(tx)
    await stack.settle()
    check = Checks()
    submits = await demo.submits(tx)
    keys = [s["idempotency_key"] for s in submits]
    check.expect("profiles reloaded", reloaded)
    check.expect(
        "rejected alert in Slack and e-mail",
        len(stack.slack_for(tx, "rejected")) == 1 and len(stack.emails_for(tx, "rejected")) == 1,
    )
    check.expect("two submissions, both done", [s["status"] for s in submits] == ["done", "done"])
    check.expect("a new Idempotency-Key", len(set(keys)) == 2)
    check.expect("resubmitted for the changed profile", submits[-1]["trigger"] == "profile_changed")
    check.expect("the sandbox saw both keys", all(k in stack.sandbox.idempotency for k in keys))
    ledger = await demo.ledger_rows(tx)
    check.expect("booked", len(ledger) == 1)
    return check.result(
        f"rejected alert, {len(submits)} submissions with {len(set(keys))} keys,"
        f" {len(ledger)} ledger row"
    )


async def active_address(demo: Demo) -> Result:
    """Deposit from an ACTIVE address: no whitelist events, booked on completion."""
    stack = demo.stack
    client = stack.runtime.client
    assert client is not None
    demo.step(f"register source address {KNOWN_PERSON} on ETH for wallet 1002 (demo-person)")
    quiet = io.StringIO()
    with contextlib.redirect_stderr(quiet):  # register() reports progress on stderr
        task = asyncio.create_task(
            register(
                stack.settings,
                client,
                stack.store,
                wallet_id=1002,
                address=KNOWN_PERSON,
                network="ETH",
                profile="demo-person",
                poll_s=0.05,
                timeout_s=10,
            )
        )

        def processing() -> list[str]:
            return [
                a.id
                for a in stack.sandbox.state.addresses.values()
                if a.wallet_address == KNOWN_PERSON and a.status is AddressStatus.PROCESSING
            ]

        await stack.wait_for(lambda: bool(processing()), what="the address registration")
        address_id = processing()[0]
        demo.step(f"address record {address_id} PROCESSING; the sandbox approves it")
        stack.sandbox.approve_address(address_id)
        record = await task
    demo.step(f"address record {address_id}: {record.status.value}")
    tx = demo.inject(1002, "USDC", "ETH", "90.00", KNOWN_PERSON)
    await stack.settle()
    check = Checks()
    types = [e["event_type"] for e in await stack.events(tx)]
    ledger = await demo.ledger_rows(tx)
    check.expect("address ACTIVE", record.status is AddressStatus.ACTIVE)
    check.expect("no DEPOSIT_WHITELIST_* event", not [t for t in types if "WHITELIST" in t])
    check.expect("booked on DEPOSIT_ORDER_NOTIFICATION", types == ["DEPOSIT_ORDER_NOTIFICATION"])
    check.expect("booked once", len(ledger) == 1 and ledger[0]["trigger"] == "credited")
    check.expect("nothing submitted", not await demo.submits(tx))
    return check.result(
        f"address {record.status.value}, events {', '.join(types) or 'none'},"
        f" {len(ledger)} ledger row"
    )


async def lost_webhook(demo: Demo) -> Result:
    """A lost webhook: the history poller finds the deposit; submitted and booked."""
    stack = demo.stack
    stack.sandbox.drop_webhooks(1)
    demo.step("the sandbox will lose the next webhook")
    tx = demo.inject(1002, "USDT", "TRON", "60.00", KNOWN_PAYER)
    await demo.wait_submitted(tx)
    demo.step("the history poll found it and the worker submitted; the sandbox approves")
    stack.sandbox.approve_review(tx)
    await stack.settle()
    check = Checks()
    deposit = await stack.deposit(tx)
    types = [e["event_type"] for e in await stack.events(tx)]
    ledger = await demo.ledger_rows(tx)
    check.expect("found by the poller", deposit is not None and deposit.first_source == "poll")
    check.expect("the REQUIRED webhook never arrived", "DEPOSIT_WHITELIST_REQUIRED" not in types)
    check.expect("one submission", len(await demo.submits(tx)) == 1)
    check.expect("booked", len(ledger) == 1)
    source = deposit.first_source if deposit else "nobody"
    return check.result(f"first seen by {source}, {len(ledger)} ledger row")


async def blocked(demo: Demo) -> Result:
    """BLOCKED (detail only): one critical alert, however often the detail is read."""
    stack = demo.stack
    tx = demo.inject(1002, "USDT", "TRON", "5000.00", "TBlockedPayer66666666666666666666")
    await demo.wait_submitted(tx)
    demo.step("submitted; the sandbox sets creditStatus BLOCKED (no webhook: detail shows it)")
    stack.sandbox.block(tx)
    await demo.wait_state(tx, State.BLOCKED)
    demo.step(f"the detail poll saw BLOCKED; reading the detail {DETAIL_REREADS} more times")
    client = stack.runtime.client
    assert client is not None
    reads = 0
    for _ in range(DETAIL_REREADS):
        sent_at = now_ms()
        order = await client.transaction_detail(tx)
        reads += order.creditStatus is CreditStatus.BLOCKED
        await stack.processor.observe_fact(fact_from_order(order, sent_at=sent_at))
    await asyncio.sleep(2 * stack.detail_interval_s)  # let the scheduler poll again too
    await stack.settle()
    check = Checks()
    polls = await stack.store.read(lambda db: count_blocked_polls(db, tx))
    slack, mails = stack.slack_for(tx, "blocked"), stack.emails_for(tx, "blocked")
    alerts = [
        a
        for a in await stack.actions(tx)
        if a["action"] == "alert" and a["trigger"].startswith("blocked")
    ]
    # A reread that says what the poll said is not stored again: one BLOCKED poll fact.
    check.expect("several detail reads showed BLOCKED", polls >= 1 and reads == DETAIL_REREADS)
    check.expect("one critical Slack alert", len(slack) == 1 and "CRITICAL" in slack[0]["text"])
    check.expect("one critical e-mail", len(mails) == 1)
    check.expect("one alert action", len(alerts) == 1)
    check.expect("nothing booked", not await demo.ledger_rows(tx))
    return check.result(
        f"critical: slack {len(slack)}, e-mail {len(mails)} after {reads + 1} detail reads"
    )


async def released(demo: Demo) -> Result:
    """BLOCKED, then support releases it: found by the blocked-deposit poll, booked once."""
    stack = demo.stack
    tx = demo.inject(1002, "USDT", "TRON", "777.77", "TReleasedPayer7777777777777777777")
    await demo.wait_submitted(tx)
    stack.sandbox.block(tx)
    await demo.wait_state(tx, State.BLOCKED)
    demo.step("BLOCKED seen; support releases it and its webhooks are lost")
    stack.sandbox.drop_webhooks(2)
    stack.sandbox.release(tx)
    await demo.wait_state(tx, State.COMPLETED)
    client = stack.runtime.client
    assert client is not None
    # The same release read again, as a poll after a restart would: nothing more happens.
    sent_at = now_ms()
    await stack.processor.observe_fact(
        fact_from_order(await client.transaction_detail(tx), sent_at=sent_at)
    )
    await stack.settle()
    check = Checks()
    books = [a for a in await stack.actions(tx) if a["action"] == "book"]
    slack, mails = stack.slack_for(tx, "released"), stack.emails_for(tx, "released")
    check.expect("booked once", len(await demo.ledger_rows(tx)) == 1 and len(books) == 1)
    check.expect("one released alert per channel", len(slack) == 1 and len(mails) == 1)
    return check.result(f"released, booked once; slack {len(slack)}, e-mail {len(mails)}")


@dataclass(frozen=True)
class Scenario:
    """One scripted scenario."""

    title: str
    expected: str
    run: Callable[[Demo], Awaitable[Result]]


SCENARIOS = (
    Scenario("unknown address, stored profile", "auto-submit, approve, book once", known_profile),
    Scenario("no profile", "warning alert, nothing submitted", no_profile),
    Scenario(
        "details on the hosted page", "pending, approved, booked once", demo_hosted.hosted_page
    ),
    Scenario(
        "rejected, profile corrected",
        "rejected alert, resubmit with new key, booked",
        rejected_then_corrected,
    ),
    Scenario("ACTIVE source address", "no whitelist events, booked", active_address),
    Scenario("lost webhook", "found by poll, booked", lost_webhook),
    Scenario("BLOCKED", "critical alert once", blocked),
    Scenario("BLOCKED then released", "found by the blocked poll, booked once", released),
    Scenario("UNMATCHED abnormal fund", "alert once", demo_money.abnormal_fund),
    Scenario("report and ledger disagree", "each finding once", demo_money.report_disagrees),
)


async def play(stack: Stack, out: TextIO) -> list[tuple[Scenario, Result]]:
    """Run every scenario on a started stack; print each, return the results."""
    demo = Demo(stack, out)
    results: list[tuple[Scenario, Result]] = []
    for number, scenario in enumerate(SCENARIOS, 1):
        demo.say()
        demo.say(f"== {number}. {scenario.title}: expected {scenario.expected}")
        demo.txs = []
        try:
            async with asyncio.timeout(SCENARIO_TIMEOUT_S):
                result = await scenario.run(demo)
        except Exception as exc:  # one broken scenario must not hide the others' outcome
            result = Result(f"error: {type(exc).__name__}: {exc}", False)
        for tx in demo.txs:
            await demo.show(tx)
        demo.say(f"  => {'ok' if result.ok else 'FAILED'}: {result.got}")
        results.append((scenario, result))
    return results


def summary(results: list[tuple[Scenario, Result]]) -> list[str]:
    """The summary table: scenario, expected, got, ok."""
    rows = [("#", "scenario", "expected", "got", "ok")]
    for number, (scenario, result) in enumerate(results, 1):
        ok = "ok" if result.ok else "FAILED"
        rows.append((str(number), scenario.title, scenario.expected, result.got, ok))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = []
    for i, row in enumerate(rows):
        cells = [cell.ljust(widths[j]) for j, cell in enumerate(row[:4])]
        lines.append("  ".join([*cells, row[4]]))
        if i == 0:
            lines.append("  ".join("-" * w for w in [*widths, 6]))
    return lines


async def main(workdir: Path, out: TextIO, *, kept: bool = False) -> int:
    """Start the stack in `workdir`, play the scenarios, print the summary; 0 if all ok."""
    started = time.monotonic()
    async with Stack(workdir) as stack:
        print(f"depositd demo: sandbox {stack.sandbox_url}, worker {stack.webhook_url}", file=out)
        where = "kept" if kept else "removed at exit; --keep DIR keeps them"
        print(f"files in {workdir} ({where}); logs in depositd.log there", file=out)
        results = await play(stack, out)
    print(file=out)
    for line in summary(results):
        print(line, file=out)
    passed = sum(1 for _, r in results if r.ok)
    took = Decimal(str(time.monotonic() - started)).quantize(Decimal("0.1"))
    print(f"\n{passed}/{len(results)} scenarios as expected in {took} s", file=out)
    return 0 if passed == len(results) else 1


def _run_in(workdir: Path, *, kept: bool) -> int:
    log_path = workdir / "depositd.log"
    with log_path.open("a", encoding="utf-8") as log_file:
        # One renderer for depositd's and the libraries' lines (libraries at warning and up).
        configure("json", "info", stream=log_file)
        try:
            return asyncio.run(main(workdir, sys.stdout, kept=kept))
        finally:
            configure("console", "error")


def run(args: argparse.Namespace) -> int:
    """`depositd demo [--keep DIR]`."""
    if getattr(args, "config", None) is not None:
        raise ConfigError(
            [
                f"--config {args.config}: the demo writes its own configuration and reads none;"
                " leave --config out (`depositd init --sandbox DIR` writes one to keep)"
            ]
        )
    if importlib.util.find_spec("aiosmtpd") is None:
        raise ConfigError(["the demo needs its SMTP server: pip install 'depositd[demo]'"])
    keep = getattr(args, "keep", None)
    if keep is None:
        with tempfile.TemporaryDirectory(prefix="depositd-demo-") as tmp:
            return _run_in(Path(tmp), kept=False)
    workdir = Path(keep).resolve()
    if (workdir / "depositd.db").exists():
        raise ConfigError([f"{workdir}: holds a previous demo's database; give an empty folder"])
    workdir.mkdir(parents=True, exist_ok=True)
    code = _run_in(workdir, kept=True)
    print(f"kept: {workdir} (try: depositd ledger --config {workdir / 'depositd.yaml'})")
    return code
