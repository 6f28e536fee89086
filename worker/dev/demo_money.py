"""The demo's money-integrity scenarios: an UNMATCHED abnormal fund alerted once, and a day
whose settlement report and ledger disagree, each finding reported once."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from worker.dev.demokit import Checks, Demo, Result
from worker.store import abnormal as abnormal_store
from worker.store import findings as findings_store


def _alerts(demo: Demo, condition: str, text: str | None = None) -> tuple[int, int]:
    """(Slack payloads, e-mails) of one alert condition (and mentioning `text`)."""
    slack = [
        p
        for p in demo.stack.slack
        if f"condition `{condition}`" in json.dumps(p) and (text is None or text in json.dumps(p))
    ]
    mails = [
        m
        for m in demo.stack.emails
        if m.get("X-Depositd-Condition") == condition
        and (text is None or text in m.get_body().get_content())  # type: ignore[union-attr]
    ]
    return len(slack), len(mails)


async def abnormal_fund(demo: Demo) -> Result:
    """Money that matched no order: stored from the abnormal-fund list, alerted once."""
    stack = demo.stack
    money = stack.runtime.money
    assert money is not None
    fund = stack.sandbox.inject_abnormal_fund(
        {
            "amount": "321.5",
            "currency": "USDT",
            "network": "TRON",
            "fromAddress": "TAbnormalSender0000000000000000001",
            "toAddress": "TAbnormalTarget0000000000000000001",
            "txHash": "0xdemoabnormal",
        }
    )
    demo.step(f"the sandbox lists abnormal fund {fund['id']}: 321.5 USDT matched no order")
    for _ in range(3):
        await money.abnormal.poll()
    demo.step("three abnormal-fund polls read it")
    await stack.settle()
    rows = await stack.store.read(abnormal_store.list_abnormal)
    slack, mails = _alerts(demo, "abnormal_fund", "0xdemoabnormal")
    check = Checks()
    check.expect("stored once", [r["id"] for r in rows].count(str(fund["id"])) == 1)
    check.expect("one Slack alert", slack == 1)
    check.expect("one e-mail", mails == 1)
    return check.result(f"stored, slack {slack}, e-mail {mails} after 3 polls")


async def report_disagrees(demo: Demo) -> Result:
    """Today's report lists a deposit with another amount and money never booked: each
    finding is reported once, however often the day is reconciled."""
    stack = demo.stack
    money = stack.runtime.money
    assert money is not None
    ledger = await stack.ledger()
    day = dt.datetime.now(dt.UTC).date()
    date = day.isoformat()
    tx = str(ledger[0]["transaction_id"])
    stack.sandbox.add_discrepancy(
        {"kind": "amount", "date": date, "transactionId": tx, "amount": "0.01"}
    )
    stack.sandbox.add_discrepancy(
        {
            "kind": "extra",
            "date": date,
            "asset": "USDT",
            "network": "TRON",
            "amount": "77",
            "txHash": "0xdemounbooked",
        }
    )
    demo.step(f"the sandbox's report for {date}: {tx} at 0.01, and 77 USDT never booked")
    for _ in range(2):
        await money.daily.reconcile(day)
    demo.step("reconciled the day twice")
    await stack.settle()
    rows: list[dict[str, Any]] = await stack.store.read(
        lambda db: findings_store.findings_of_day(db, date)
    )
    kinds = sorted(r["kind"] for r in rows)
    slack, mails = _alerts(demo, "reconcile_finding")
    stack.sandbox.clear_discrepancies()
    check = Checks()
    check.expect("amount_differs found", "amount_differs" in kinds)
    check.expect("missing_in_ledger found", "missing_in_ledger" in kinds)
    check.expect("one Slack alert per finding", slack == len(rows))
    check.expect("one e-mail per finding", mails == len(rows))
    return check.result(f"{', '.join(kinds)}: slack {slack}, e-mail {mails} after 2 runs")
