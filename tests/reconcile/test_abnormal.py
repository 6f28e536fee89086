"""Abnormal funds: the poll stores each record by id and alerts once per record, across polls
and restarts (sandbox, worker and Slack on loopback; worker.dev.harness)."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from tests.support.stacks import NEVER, MakeStack
from worker.clock import now_ms
from worker.dev.harness import Stack
from worker.reconcile.abnormal import AbnormalPoll
from worker.store import abnormal as abnormal_store

FUND = {
    "amount": "250.75",
    "currency": "USDT",
    "network": "TRON",
    "fromAddress": "TFromAbnormal000000000000000000001",
    "toAddress": "TToAbnormal00000000000000000000001",
    "txHash": "0xfeed01",
    "userId": "user-secret-7",
}


def alerts(stack: Stack, condition: str) -> list[dict[str, Any]]:
    """Slack payloads of one alert condition."""
    return [p for p in stack.slack if f"condition `{condition}`" in json.dumps(p)]


async def polled(stack: Stack) -> int:
    """One abnormal poll of the running worker; the records read."""
    money = stack.runtime.money
    assert money is not None
    count = await money.abnormal.poll()
    await stack.settle()
    return count


async def test_an_unmatched_fund_is_stored_and_alerted_once_across_polls_and_restarts(
    start_stack: MakeStack,
) -> None:
    """An UNMATCHED abnormal fund is stored by id and alerted once (warning), however many
    polls and restarts follow; its alert carries no payer data."""
    stack = await start_stack(history_interval_s=NEVER, detail_interval_s=NEVER)
    fund = stack.sandbox.inject_abnormal_fund(FUND)
    assert await polled(stack) == 1
    await stack.wait_for(lambda: len(alerts(stack, "abnormal_fund")) >= 1, 10, "the alert")
    await polled(stack)
    await stack.restart_worker()
    await polled(stack)
    await stack.settle()
    sent = alerts(stack, "abnormal_fund")
    assert len(sent) == 1
    text = json.dumps(sent[0])
    assert "250.75" in text and "0xfeed01" in text and "warning" in text.lower()
    assert FUND["fromAddress"] not in text and "user-secret-7" not in text
    rows = await stack.store.read(abnormal_store.list_abnormal)
    assert [(r["id"], r["status"], r["amount"]) for r in rows] == [
        (str(fund["id"]), "UNMATCHED", "250.75")
    ]
    assert alerts(stack, "abnormal_expiring") == []


async def test_a_risky_fund_is_critical_and_an_expiring_one_alerts_once_more(
    start_stack: MakeStack,
) -> None:
    """A fund from an address flagged HIGH risk alerts critical; one within 24 h of expiry
    alerts abnormal_expiring once as well."""
    stack = await start_stack(history_interval_s=NEVER, detail_interval_s=NEVER)
    stack.sandbox.inject_abnormal_fund(
        {
            **FUND,
            "txHash": "0xfeed02",
            "addressRiskStatus": "HIGH",
            "expiresTime": now_ms() + 3600_000,
        }
    )
    await polled(stack)
    await polled(stack)
    await stack.wait_for(lambda: len(alerts(stack, "abnormal_expiring")) >= 1, 10, "alerts")
    await polled(stack)
    first = alerts(stack, "abnormal_fund")
    assert len(first) == 1 and "critical" in json.dumps(first[0]).lower()
    assert len(alerts(stack, "abnormal_expiring")) == 1


def test_a_record_without_id_is_skipped_and_the_others_are_read() -> None:
    """A page with a record without an id (the sandbox never sends one): that record is left
    out, the rest of the page is read, and the page is not taken for the last one."""
    from worker.provider.stable_calls import abnormal_page

    good = {**FUND, "id": 2, "amount": Decimal("1.5"), "status": "UNMATCHED"}
    bad = {k: v for k, v in good.items() if k != "id"}
    data = {"pageNumber": 1, "pageSize": 50, "totalPage": 1, "totalRow": 2, "records": [bad, good]}
    page = abnormal_page(data)
    assert [f.id for f in page.records] == [2] and page.refused == 1
    assert str(page.records[0].amount) == "1.5"


async def test_the_notification_webhook_starts_a_poll(start_stack: MakeStack) -> None:
    """ABNORMAL_FUND_NOTIFICATION makes serve read the list at once (not after the interval)."""
    stack = await start_stack(history_interval_s=NEVER, detail_interval_s=NEVER)
    money = stack.runtime.money
    assert money is not None
    await stack.wait_for(lambda: money.abnormal.last_ok is not None, 10, "the first poll")
    stack.sandbox.inject_abnormal_fund({**FUND, "txHash": "0xhint"}, notify=True)

    async def stored() -> bool:
        return bool(await stack.store.read(abnormal_store.list_abnormal))

    for _ in range(100):
        await stack.sandbox.delivered_idle()
        await stack.settle()
        if await stored():
            break
    assert await stored()


async def test_funds_past_the_page_cap_are_all_seen_within_a_few_polls(
    start_stack: MakeStack,
) -> None:
    """Nine unmatched funds, two per page, at most two pages per poll: each poll goes on where
    the last one stopped, so every fund is stored and alerted once within four polls; the next
    poll starts at page 1 again."""
    stack = await start_stack(scheduler=False)  # only this test's polls read the list
    for i in range(9):
        stack.sandbox.inject_abnormal_fund({**FUND, "txHash": f"0xcap{i:02d}"})
    client = stack.runtime.client
    assert client is not None
    poll = AbnormalPoll(client, stack.store, lambda: stack.runtime.rules, page_size=2, max_pages=2)
    for _ in range(4):
        await poll.run()
    rows = await stack.store.read(abnormal_store.list_abnormal)
    assert len(rows) == 9
    await stack.settle()
    await stack.wait_for(lambda: len(alerts(stack, "abnormal_fund")) >= 9, 10, "nine alerts")
    assert await poll.run() == 4  # pages 1 and 2 again
    await stack.settle()
    assert len(alerts(stack, "abnormal_fund")) == 9
