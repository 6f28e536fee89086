"""Reconciliation: a sandbox day's settlement report and balances against the ledger
(sandbox, worker and Slack on loopback; worker.dev.harness)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import sys
from typing import Any

import pytest

from tests.support.processes import Processes
from tests.support.stacks import (
    NEVER,
    UNKNOWN_SOURCE,
    MakeStack,
    booked_day,
    catchups_done,
    open_findings,
)
from worker.clock import iso_from_ms, now_ms
from worker.dev.harness import Stack
from worker.reconcile.reconciler import Reconciler
from worker.store import findings as findings_store
from worker.store.meta import CREATED_AT, set_meta

# Every test here runs on SQLite and on PostgreSQL, its stacks too.
pytestmark = pytest.mark.usefixtures("engine")


def finding_alerts(stack: Stack) -> list[dict[str, Any]]:
    """Slack payloads of reconciliation findings."""
    return [p for p in stack.slack if "condition `reconcile_finding`" in json.dumps(p)]


async def test_a_clean_day_reports_nothing(start_stack: MakeStack) -> None:
    """A day whose report lists exactly the deposits booked: clean, no finding, no alert."""
    stack = await start_stack(history_interval_s=NEVER, detail_interval_s=NEVER)
    await catchups_done(stack)
    day, _ = await booked_day(stack, 2)
    money = stack.runtime.money
    assert money is not None
    for _ in range(2):  # twice: a balance drift would show on the second check
        result = await money.daily.reconcile(day)
        assert result is not None and result.outcome == "clean" and result.findings == []
    await stack.settle()
    assert await open_findings(stack, day) == {}
    assert finding_alerts(stack) == []


async def test_every_finding_kind_is_found_reported_once_and_resolved_when_fixed(
    start_stack: MakeStack,
) -> None:
    """Each injected discrepancy is one finding of its kind with exact amounts, alerted once;
    a re-run reports nothing again; once fixed at the provider a re-run resolves them."""
    stack = await start_stack(history_interval_s=NEVER, detail_interval_s=NEVER)
    await catchups_done(stack)
    day, txs = await booked_day(stack, 4)
    date = day.isoformat()
    sb = stack.sandbox
    sb.add_discrepancy({"kind": "drop", "date": date, "transactionId": txs[0]})
    sb.add_discrepancy({"kind": "amount", "date": date, "transactionId": txs[1], "amount": "9.99"})
    sb.add_discrepancy(
        {
            "kind": "status",
            "date": date,
            "transactionId": txs[2],
            "reconciliationStatus": "MANUAL_REVIEW",
        }
    )
    sb.add_discrepancy(
        {
            "kind": "status",
            "date": date,
            "transactionId": txs[3],
            "reconciliationStatus": "MISMATCHED",
        }
    )
    sb.add_discrepancy(
        {
            "kind": "extra",
            "date": date,
            "asset": "USDT",
            "network": "TRON",
            "amount": "42.000001",
            "txHash": "0xnotbooked",
        }
    )
    # Money held at the provider that depositd never heard of: a drift on two checks in a row.
    sb.drop_webhooks(5)
    sb.inject_deposit(1002, "USDT", "TRON", "5", UNKNOWN_SOURCE)
    at = [now_ms()]
    client = stack.runtime.client
    assert client is not None
    reconciler = Reconciler(
        client, stack.store, lambda: stack.runtime.rules, drift_after_s=60, clock=lambda: at[0]
    )
    await reconciler.run(day)
    first = await open_findings(stack, day)
    assert "held_balance_drift" not in first  # one check is not enough
    at[0] += 60_000  # the second check, `drift_after_s` later
    result = await reconciler.run(day)
    assert result is not None and result.outcome == "findings"
    found = await open_findings(stack, day)
    assert set(found) == {
        "missing_in_report",
        "amount_differs",
        "provider_review",
        "provider_mismatch",
        "missing_in_ledger",
        "held_balance_drift",
    }
    assert found["missing_in_report"]["transaction_id"] == txs[0]
    assert (found["amount_differs"]["ledger_amount"], found["amount_differs"]["report_amount"]) == (
        "2.25",
        "9.99",
    )
    assert found["missing_in_ledger"]["report_amount"] == "42.000001"
    assert found["held_balance_drift"]["report_amount"] == "5"
    await stack.settle()
    await stack.wait_for(lambda: len(finding_alerts(stack)) >= 6, 10, "finding alerts")
    assert len(finding_alerts(stack)) == 6  # one per finding (one rule, one Slack channel)
    await reconciler.run(day)
    await stack.settle()
    assert len(finding_alerts(stack)) == 6  # a re-run reports nothing again

    sb.clear_discrepancies()
    result = await reconciler.run(day)
    await stack.settle()
    assert result is not None
    left = await open_findings(stack, day)
    assert set(left) == {"held_balance_drift"}  # the held deposit is still unknown to depositd
    assert len(finding_alerts(stack)) == 6


async def cli(processes: Processes, stack: Stack, *argv: str) -> tuple[int, str, str]:
    """`depositd ARGV --config` of the stack, as a user runs it."""
    proc = processes.own(
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "worker",
            *argv,
            "--config",
            str(stack.config_path),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_reconcile_command_json_exit_status_ack_and_status(
    start_stack: MakeStack, processes: Processes
) -> None:
    """`reconcile --json` prints one object per finding and exits 3; 0 on a clean day;
    `--ack` records who and why (a second `--ack` exits 1 and replaces nothing), and `status`
    shows the last run and what is still open."""
    stack = await start_stack(history_interval_s=NEVER, detail_interval_s=NEVER)
    await catchups_done(stack)
    day, txs = await booked_day(stack, 1)
    date = day.isoformat()
    code, out, _ = await cli(processes, stack, "reconcile", "--date", date)
    assert code == 0 and "no findings" in out
    stack.sandbox.add_discrepancy(
        {"kind": "amount", "date": date, "transactionId": txs[0], "amount": "1.2500001"}
    )
    code, out, _ = await cli(processes, stack, "reconcile", "--date", date, "--json")
    assert code == 3
    lines = [json.loads(line) for line in out.splitlines()]
    assert len(lines) == 1
    item = lines[0]
    assert {k: item[k] for k in ("date", "kind", "transactionId", "currency", "network")} == {
        "date": date,
        "kind": "amount_differs",
        "transactionId": txs[0],
        "currency": "USDT",
        "network": "TRON",
    }
    assert (item["ledgerAmount"], item["reportAmount"]) == ("1.25", "1.2500001")
    assert item["txHash"]
    code, out, _ = await cli(processes, stack, "status")
    rec = json.loads(out)["reconciliation"]
    assert rec["lastRun"]["outcome"] == "findings" and rec["openFindings"] == {"amount_differs": 1}
    code, out, err = await cli(
        processes, stack, "reconcile", "--ack", str(item["id"]), "--by", "ana", "--note", "checked"
    )
    assert code == 0, err
    code, out, _ = await cli(processes, stack, "status")
    assert json.loads(out)["reconciliation"]["openFindings"] == {}
    row = await stack.store.read(lambda db: findings_store.get_finding(db, item["id"]))
    assert row is not None and (row["acknowledged_by"], row["note"]) == ("ana", "checked")
    # A second acknowledgement is refused (exit 1) and replaces nothing.
    code, out, err = await cli(
        processes, stack, "reconcile", "--ack", str(item["id"]), "--by", "bob", "--note", "mine"
    )
    assert code == 1 and "acknowledged already by ana" in err
    again = await stack.store.read(lambda db: findings_store.get_finding(db, item["id"]))
    assert again == row


async def test_a_report_of_many_pages_is_read_whole(start_stack: MakeStack) -> None:
    """A report read one record per page gives the same findings as one page."""
    stack = await start_stack(history_interval_s=NEVER, detail_interval_s=NEVER)
    await catchups_done(stack)
    day, txs = await booked_day(stack, 3)
    stack.sandbox.add_discrepancy(
        {"kind": "drop", "date": day.isoformat(), "transactionId": txs[1]}
    )
    client = stack.runtime.client
    assert client is not None
    reconciler = Reconciler(client, stack.store, lambda: stack.runtime.rules, page_size=1)
    result = await reconciler.run(day)
    assert [(f.kind, f.transaction_id) for f in result.findings] == [("missing_in_report", txs[1])]


async def test_a_provider_outage_records_the_failure_alerts_and_the_next_run_completes(
    start_stack: MakeStack,
) -> None:
    """The report failing mid-run: the run is recorded failed with nothing half-written, one
    alert says so; once the provider answers the day is reconciled."""
    stack = await start_stack(history_interval_s=NEVER, detail_interval_s=NEVER)
    await catchups_done(stack)
    day, txs = await booked_day(stack, 3)
    date = day.isoformat()
    stack.sandbox.add_discrepancy({"kind": "drop", "date": date, "transactionId": txs[0]})
    client = stack.runtime.client
    assert client is not None
    reconciler = Reconciler(client, stack.store, lambda: stack.runtime.rules, page_size=1)
    stack.sandbox.set_fault("settlement", "5xx", count=None)
    for _ in range(2):
        result = await reconciler.run(day)
        assert result.outcome == "failed" and "ProviderUnavailable" in (result.error or "")
    assert await open_findings(stack, day) == {}
    runs = await stack.store.read(lambda db: findings_store.last_run(db))
    assert runs is not None and runs["outcome"] == "failed"
    await stack.settle()
    await stack.wait_for(
        lambda: any("condition `reconcile_failed`" in json.dumps(p) for p in stack.slack),
        10,
        "the failure alert",
    )
    failed = [p for p in stack.slack if "condition `reconcile_failed`" in json.dumps(p)]
    assert len(failed) == 1  # one per day, not one per failed run
    stack.sandbox.clear_faults()
    result = await reconciler.run(day)
    assert result.outcome == "findings"
    assert set(await open_findings(stack, day)) == {"missing_in_report"}


async def test_a_missed_reconciliation_runs_once_when_the_jobs_start(
    start_stack: MakeStack,
) -> None:
    """Jobs starting after the reconciliation minute (a restart, or a new scheduler leader
    after the old one died) reconcile yesterday unless a run completed it already."""
    stack = await start_stack(history_interval_s=NEVER, detail_interval_s=NEVER)
    await catchups_done(stack)
    money = stack.runtime.money
    assert money is not None

    async def runs() -> list[str]:
        def read(db: Any) -> list[str]:
            return [r[0] for r in db.execute("SELECT day FROM reconcile_runs ORDER BY id")]

        return await stack.store.read(read)

    before = len(await runs())
    await money.daily.reconcile_due()
    days = await runs()
    yesterday = (dt.datetime.now(dt.UTC) - dt.timedelta(days=1)).date().isoformat()
    assert days[before:] == [yesterday]
    await money.daily.reconcile_due()  # completed already: not again
    assert await runs() == days


async def test_a_start_after_the_minute_reconciles_only_on_a_store_that_was_there(
    start_stack: MakeStack,
) -> None:
    """Jobs starting within the misfire grace after `scheduler.reconcile_at` reconcile the days
    due at once when the store was there at that minute (the service was down then); a store
    created after it (a first start) has no run to catch up on and compares nothing."""
    just_past = (dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)).strftime("%H:%M")
    stack = await start_stack(
        history_interval_s=NEVER, detail_interval_s=NEVER, reconcile_at=just_past
    )

    async def missed_run() -> list[str]:
        money = stack.runtime.money
        assert money is not None
        run = money.in_flight("reconcile-missed")
        assert run is not None, "the start looked at the minute it passed"
        await run

        def read(db: Any) -> list[str]:
            return [r[0] for r in db.execute("SELECT day FROM reconcile_runs ORDER BY id")]

        return await stack.store.read(read)

    assert await missed_run() == []
    a_day_back = iso_from_ms(now_ms() - 86_400_000)
    await stack.store.write(lambda db: set_meta(db, CREATED_AT, a_day_back))
    await stack.restart_worker()
    assert await missed_run() == [a_day_back[:10]]


async def test_a_missed_day_runs_even_when_a_later_day_was_reconciled(
    start_stack: MakeStack,
) -> None:
    """Today reconciled from the console does not stand for yesterday: the missed run of
    yesterday still happens when the jobs start."""
    stack = await start_stack(history_interval_s=NEVER, detail_interval_s=NEVER)
    await catchups_done(stack)
    money = stack.runtime.money
    assert money is not None
    today = dt.datetime.now(dt.UTC).date()
    result = await money.daily.reconcile(today)
    assert result is not None and result.outcome == "clean"
    await money.daily.reconcile_due()

    def days(db: Any) -> list[str]:
        return [r[0] for r in db.execute("SELECT day FROM reconcile_runs ORDER BY id")]

    yesterday = (today - dt.timedelta(days=1)).isoformat()
    assert (await stack.store.read(days))[-2:] == [today.isoformat(), yesterday]


def other_zone_day(now: dt.datetime) -> str:
    """A zone in which the UTC moment `now` falls on another calendar day."""
    return "Etc/GMT-14" if now.hour >= 12 else "Etc/GMT+12"  # UTC+14 / UTC-12


async def test_the_report_is_asked_for_utc_days(start_stack: MakeStack) -> None:
    """A provider whose report defaults to another zone: reconciliation asks for UTC, so the
    deposits credited on the UTC day are the ones compared (clean)."""
    stack = await start_stack(history_interval_s=NEVER, detail_interval_s=NEVER)
    await catchups_done(stack)
    day, _ = await booked_day(stack, 1)
    stack.sandbox.cfg.report_default_timezone = other_zone_day(dt.datetime.now(dt.UTC))
    money = stack.runtime.money
    assert money is not None
    result = await money.daily.reconcile(day)
    assert result is not None and (result.outcome, result.findings) == ("clean", [])


async def test_a_report_in_another_zone_fails_the_run_alerted_once(
    start_stack: MakeStack,
) -> None:
    """A report answered in another zone than asked: the run fails (nothing compared, no
    finding), recorded and alerted once however often it is tried."""
    stack = await start_stack(history_interval_s=NEVER, detail_interval_s=NEVER)
    await catchups_done(stack)
    day, _ = await booked_day(stack, 1)
    stack.sandbox.cfg.report_timezone = "Asia/Shanghai"
    money = stack.runtime.money
    assert money is not None
    for _ in range(2):
        result = await money.daily.reconcile(day)
        assert result is not None and result.outcome == "failed"
        assert "timezone 'Asia/Shanghai'" in (result.error or "")
    assert await open_findings(stack, day) == {}
    await stack.settle()
    await stack.wait_for(
        lambda: any("condition `reconcile_failed`" in json.dumps(p) for p in stack.slack),
        10,
        "the failure alert",
    )
    failed = [p for p in stack.slack if "condition `reconcile_failed`" in json.dumps(p)]
    assert len(failed) == 1


async def test_held_balance_drift_is_of_the_time_it_was_read(start_stack: MakeStack) -> None:
    """Two checks seconds apart (the daily job and a console click) do not make a credit in
    flight a finding; checks `detail_interval_s` apart do, dated the day the balances were
    read, whichever day is reconciled."""
    stack = await start_stack(history_interval_s=NEVER, detail_interval_s=NEVER)
    await catchups_done(stack)
    day, _ = await booked_day(stack, 1)
    stack.sandbox.drop_webhooks(5)
    stack.sandbox.inject_deposit(1002, "USDT", "TRON", "5", UNKNOWN_SOURCE)
    money = stack.runtime.money
    assert money is not None
    for _ in range(2):
        result = await money.daily.reconcile(day)
        assert result is not None and (result.outcome, result.findings) == ("clean", [])
    client = stack.runtime.client
    assert client is not None
    later = now_ms() + int(NEVER * 1000)
    reconciler = Reconciler(
        client, stack.store, lambda: stack.runtime.rules, drift_after_s=NEVER, clock=lambda: later
    )
    old_day = day - dt.timedelta(days=3)
    result = await reconciler.run(old_day)
    read_day = dt.datetime.fromtimestamp(later / 1000, dt.UTC).date()
    assert [(f.kind, f.day) for f in result.findings] == [
        ("held_balance_drift", read_day.isoformat())
    ]
    assert await open_findings(stack, old_day) == {}
    assert set(await open_findings(stack, read_day)) == {"held_balance_drift"}
