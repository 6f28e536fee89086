"""The polling fallback end to end: sandbox, worker, SMTP and Slack on loopback
(worker.dev.harness)."""

from __future__ import annotations

import json
import time
from decimal import Decimal
from typing import Any

import aiohttp
import pytest
import structlog

from tests.support.stacks import MakeStack, scrape
from worker.clock import now_ms
from worker.dev.harness import Stack
from worker.provider.models import WhiteListStatus
from worker.track.facts import fact_from_order

FAST = 0.3  # scheduler intervals of the stacks that poll on their own
NEVER = 3600.0  # scheduler intervals of the stacks whose polls the test runs by hand
KNOWN_PAYER = "TDemoKnownPayer1111111111111111111"  # rules/profiles.yaml: demo-entity

FACT_SOURCES = "SELECT source FROM facts WHERE transaction_id=?"


@pytest.fixture
def make_stack(start_stack: MakeStack) -> MakeStack:
    """Start stacks on demand (shipped rules and profiles); every one is stopped afterwards."""

    async def make(**kw: Any) -> Stack:
        kw.setdefault("history_interval_s", FAST)
        kw.setdefault("detail_interval_s", FAST)
        return await start_stack(**kw)

    return make


async def first_polls_done(stack: Stack) -> None:
    """Wait until both polls ran once (a stack polls at start), so later polls are the test's."""
    poller = stack.runtime.poller
    assert poller is not None
    await stack.wait_for(
        lambda: {"history", "detail"} <= set(poller.stats.last_success), 5, "the first polls"
    )


def inject(stack: Stack, wallet: int, amount: str, source: str) -> str:
    """An on-chain deposit at the sandbox; its transactionId."""
    order = stack.sandbox.inject_deposit(wallet, "USDT", "TRON", amount, source)
    return str(order["transactionId"])


def whitelist(stack: Stack, tx: str) -> WhiteListStatus | None:
    """The deposit's whiteListStatus as the sandbox holds it."""
    return stack.sandbox.state.order(tx).white_list_status


async def state_of(stack: Stack, tx: str) -> str | None:
    """The worker's tracked state of a deposit (None: not tracked)."""
    deposit = await stack.deposit(tx)
    return deposit.state.value if deposit is not None else None


async def reach(stack: Stack, tx: str, state: str, timeout: float = 10) -> None:  # noqa: ASYNC109
    """Wait until the worker tracks `tx` in `state`."""

    async def there() -> bool:
        return await state_of(stack, tx) == state

    await stack.wait_for(there, timeout, f"{tx} to be {state}")


async def count_actions(stack: Stack, tx: str, action: str) -> int:
    """How many action rows of one kind a deposit has."""
    return sum(1 for a in await stack.actions(tx) if a["action"] == action)


def polls(samples: dict[Any, float], poll: str, outcome: str) -> float:
    """depositd_polls_total for one poll and outcome (0 when absent)."""
    return samples.get(("depositd_polls_total", (("outcome", outcome), ("poll", poll))), 0.0)


def last_success(samples: dict[Any, float], poll: str) -> float | None:
    """The poll's last-success gauge, if it was ever set."""
    return samples.get(("depositd_poll_last_success_timestamp_seconds", (("poll", poll),)))


def system_alerts(stack: Stack, condition: str) -> tuple[int, int]:
    """(Slack messages, e-mails) about a condition that concerns no single deposit."""
    slack = sum(1 for p in stack.slack if condition in json.dumps(p))
    mails = sum(1 for m in stack.emails if m.get("X-Depositd-Condition") == condition)
    return slack, mails


async def test_lost_webhooks_polling_alone_submits_books_and_alerts(make_stack: MakeStack) -> None:
    """With every webhook lost, polls find, submit, book and alert exactly as webhooks would."""
    stack = await make_stack()
    stack.sandbox.drop_webhooks(10_000)
    auto = inject(stack, 1002, "125.50", "TLostHookPayer0000000000000000001")  # wallet profile
    human = inject(stack, 1001, "9.99", "TLostHookNoProfile000000000000001")  # no profile

    await stack.wait_for(lambda: whitelist(stack, auto) is WhiteListStatus.PENDING, 10, "submit")
    stack.sandbox.approve_review(auto)  # wallet 1002 has no auto-collection: SUCCESS at once
    await reach(stack, auto, "completed")
    await stack.wait_for(
        lambda: bool(stack.slack_for(human) and stack.emails_for(human)), 10, "the alert"
    )
    await stack.settle()

    assert await stack.events() == [], "no webhook may have reached the worker"
    deposit = await stack.deposit(auto)
    assert deposit is not None and deposit.first_source == "poll"
    assert deposit.white_list_status is WhiteListStatus.APPROVED
    ledger = await stack.ledger()
    assert [(r["transaction_id"], Decimal(r["amount"])) for r in ledger] == [
        (auto, Decimal("125.50"))
    ]
    assert await count_actions(stack, auto, "submit_profile") == 1
    assert await count_actions(stack, auto, "book") == 1
    assert await state_of(stack, human) == "needs_details"
    assert len(stack.slack_for(human)) == 1
    assert len(stack.emails_for(human)) == 1
    assert stack.slack_for(auto) == [] and stack.emails_for(auto) == []


async def test_blocked_after_submission_alerts_once_in_slack_and_email(
    make_stack: MakeStack,
) -> None:
    """BLOCKED, which only transaction detail shows, raises one critical alert per channel."""
    stack = await make_stack()
    tx = inject(stack, 1002, "40", "TBlockedPayer00000000000000000001")
    await reach(stack, tx, "submitted")
    await stack.settle()
    stack.sandbox.block(tx)
    await reach(stack, tx, "blocked")

    # Many more detail polls, and the same BLOCKED reading observed again and again.
    samples = await scrape(stack)
    runs = polls(samples, "detail", "ok")
    await stack.wait_for(
        lambda: (
            stack.runtime.poller is not None
            and stack.runtime.poller.stats.last_success.get("detail", 0) > time.time() - 0.1
        ),
        5,
        "a fresh detail poll",
    )
    detail = await stack.runtime.client.transaction_detail(tx)  # type: ignore[union-attr]
    for _ in range(3):
        await stack.processor.observe_fact(fact_from_order(detail, source="poll", sent_at=now_ms()))

    async def more_runs() -> bool:
        return polls(await scrape(stack), "detail", "ok") >= runs + 4

    await stack.wait_for(more_runs, 10, "four more detail polls")
    await stack.settle()

    assert len(stack.slack_for(tx)) == 1
    assert len(stack.emails_for(tx)) == 1
    [mail] = stack.emails_for(tx)
    assert "blocked" in str(mail.get("X-Depositd-Condition"))
    assert "critical" in json.dumps(stack.slack_for(tx)[0]).lower()
    assert await count_actions(stack, tx, "alert") == 1
    assert await stack.ledger() == []


async def _redeliver(stack: Stack, event_type: str, tx: str) -> None:
    """Deliver again, late, the webhook of `event_type` for `tx` that the sandbox dropped."""
    [dropped] = [
        d
        for d in stack.sandbox.deliverer.history
        if d.state == "dropped"
        and d.envelope["eventType"] == event_type
        and d.envelope["referenceId"] == tx
    ]
    stack.sandbox.deliverer.enqueue(dict(dropped.envelope))
    await stack.settle()


@pytest.mark.parametrize("first", ["webhook", "poll"])
async def test_fact_from_webhook_and_poll_acts_once(make_stack: MakeStack, first: str) -> None:
    """A deposit announced by webhook and by poll, in either order, is submitted and booked once."""
    stack = await make_stack(history_interval_s=NEVER, detail_interval_s=NEVER)
    poller = stack.runtime.poller
    assert poller is not None
    await first_polls_done(stack)
    if first == "webhook":
        # Hold the submission at the provider so the poll still sees the deposit as init.
        stack.sandbox.set_fault("submit", "latency", count=1, latency_s=0.5)
        tx = inject(stack, 1001, "777.7", KNOWN_PAYER)
        await stack.wait_for(
            lambda: (
                any(d.envelope["referenceId"] == tx for d in stack.sandbox.deliverer.history)
                and not stack.sandbox.deliverer.pending()
            ),
            5,
            "the webhook",
        )
        await reach(stack, tx, "needs_details", 5)
        assert whitelist(stack, tx) is WhiteListStatus.INIT
        assert await poller.poll_history() == 1
        await stack.settle()
        await reach(stack, tx, "submitted")
        stack.sandbox.approve_review(tx)  # auto-collection: credited, still PROCESSING
        await stack.settle()
        await reach(stack, tx, "credited")
        assert await poller.poll_detail() == 1
    else:
        stack.sandbox.drop_webhooks(1)
        tx = inject(stack, 1001, "777.7", KNOWN_PAYER)
        assert await poller.poll_history() == 1
        await stack.settle()
        await reach(stack, tx, "submitted")
        await _redeliver(stack, "DEPOSIT_WHITELIST_REQUIRED", tx)
        stack.sandbox.drop_webhooks(1)
        stack.sandbox.approve_review(tx)
        assert await poller.poll_detail() == 1
        await stack.settle()
        await reach(stack, tx, "credited")
        await _redeliver(stack, "DEPOSIT_WHITELIST_CREDITED", tx)
    stack.sandbox.finish_sweep(tx)
    await stack.settle()
    await reach(stack, tx, "completed")

    sources = await stack.store.read(
        lambda db: {
            r[0] for r in db.execute("SELECT source FROM facts WHERE transaction_id=?", [tx])
        }
    )
    assert {"webhook", "poll"} <= sources
    assert await count_actions(stack, tx, "submit_profile") == 1
    assert len(stack.sandbox.idempotency) == 1, "the provider saw more than one submission"
    assert await count_actions(stack, tx, "book") == 1
    assert [r["transaction_id"] for r in await stack.ledger()] == [tx]
    assert [e["status"] for e in await stack.events(tx)] == ["processed"] * 3


async def test_provider_down_backs_off_alerts_once_and_catches_up(make_stack: MakeStack) -> None:
    """5xx and timeouts on both polls: back-off in logs and /metrics, one alert each, recovery."""
    stack = await make_stack()
    poller = stack.runtime.poller
    assert poller is not None
    poller.backoff_s, poller.backoff_max_s = 0.05, 0.8
    stack.sandbox.cfg.fault_timeout_s = 0.2  # a held request ends as a gateway timeout
    tx = inject(stack, 1002, "310", "TOutagePayer000000000000000000001")
    await reach(stack, tx, "submitted")
    await stack.settle()

    down_since = time.time()
    stack.sandbox.drop_webhooks(10_000)
    stack.sandbox.set_fault("history", "5xx", count=None)
    stack.sandbox.set_fault("detail", "timeout", count=None)
    stack.sandbox.approve_review(tx)  # its webhooks are lost: only the detail poll can tell

    with structlog.testing.capture_logs() as logs:

        async def failing_long_enough() -> bool:
            samples = await scrape(stack)
            return (
                polls(samples, "history", "error") >= 4
                and polls(samples, "detail", "error") >= 4
                and system_alerts(stack, "poll_failing:history") == (1, 1)
                and system_alerts(stack, "poll_failing:detail") == (1, 1)
            )

        await stack.wait_for(failing_long_enough, 20, "polls failing and alerted")

    samples = await scrape(stack)
    for poll in ("history", "detail"):
        seen = last_success(samples, poll)
        assert seen is not None and seen < down_since, f"{poll}: last success moved while down"
    backoffs = [
        e for e in logs if e["event"] == "poll failed; backing off" and e["poll"] == "history"
    ]
    assert len(backoffs) >= 4
    assert [e["failures"] for e in backoffs[:4]] == [1, 2, 3, 4]
    assert backoffs[3]["backoffSeconds"] >= backoffs[0]["backoffSeconds"]
    assert await state_of(stack, tx) == "submitted"
    async with aiohttp.ClientSession() as http, http.get(stack.worker_url + "/readyz") as resp:
        assert resp.status == 200, "the scheduler must survive the outage"

    stack.sandbox.clear_faults()
    await reach(stack, tx, "completed", 15)

    async def fresh() -> bool:
        samples = await scrape(stack)
        return all((last_success(samples, p) or 0) > down_since for p in ("history", "detail"))

    await stack.wait_for(fresh, 10, "both polls to succeed again")
    await stack.settle()
    assert [r["transaction_id"] for r in await stack.ledger()] == [tx]
    assert system_alerts(stack, "poll_failing:history") == (1, 1)
    assert system_alerts(stack, "poll_failing:detail") == (1, 1)
    assert poller.stats.failures == {"history": 0, "detail": 0, "blocked": 0}


async def test_restart_in_the_middle_of_history_pages_does_not_double_anything(
    make_stack: MakeStack,
) -> None:
    """120 deposits on small pages, restart mid-way: one submission and one booking each."""
    stack = await make_stack()
    stack.settings.scheduler.page_size = 7
    stack.sandbox.drop_webhooks(10_000)
    txs = [inject(stack, 1002, f"{i + 1}.01", f"TRestartPayer{i:020d}") for i in range(120)]

    async def tracked() -> int:
        return int(
            await stack.store.read(
                lambda db: db.execute("SELECT COUNT(*) FROM deposits").fetchone()[0]
            )
        )

    async def some_tracked() -> bool:
        return await tracked() >= 10

    await stack.wait_for(some_tracked, 10, "the history poll to be under way")
    await stack.restart_worker()
    assert await tracked() < 120, "the restart came too late to interrupt the history poll"

    await stack.wait_for(
        lambda: all(whitelist(stack, tx) is WhiteListStatus.PENDING for tx in txs),
        30,
        "every deposit submitted",
    )
    for tx in txs:
        stack.sandbox.approve_review(tx)

    async def all_booked() -> bool:
        return len(await stack.ledger()) == 120

    await stack.wait_for(all_booked, 30, "every deposit booked")
    await stack.settle()

    actions = await stack.actions()
    for kind in ("submit_profile", "book"):
        per_tx: dict[str, int] = {}
        for a in actions:
            if a["action"] == kind:
                per_tx[a["transaction_id"]] = per_tx.get(a["transaction_id"], 0) + 1
        assert per_tx == dict.fromkeys(txs, 1), f"{kind} ran more or less than once per deposit"
    assert len(stack.sandbox.idempotency) == 120
    assert sorted(r["transaction_id"] for r in await stack.ledger()) == sorted(txs)


async def test_metrics_count_deposits_found_by_poll_only(make_stack: MakeStack) -> None:
    """/metrics counts the deposits a poll found before any webhook, not the announced ones."""
    stack = await make_stack(history_interval_s=NEVER, detail_interval_s=NEVER)
    poller = stack.runtime.poller
    assert poller is not None
    await first_polls_done(stack)
    announced = inject(stack, 1001, "5", "TAnnouncedPayer000000000000000001")
    await reach(stack, announced, "needs_details")
    await stack.settle()
    stack.sandbox.drop_webhooks(2)
    silent = [inject(stack, 1001, "6", f"TSilentPayer{i:021d}") for i in range(2)]

    assert await poller.poll_history() == 3
    samples = await scrape(stack)
    assert samples[("depositd_deposits_found_by_poll_total", ())] == 2
    for tx in silent:
        deposit = await stack.deposit(tx)
        assert deposit is not None and deposit.first_source == "poll"
    deposit = await stack.deposit(announced)
    assert deposit is not None and deposit.first_source == "webhook"

    assert await poller.poll_history() == 3
    assert (await scrape(stack))[("depositd_deposits_found_by_poll_total", ())] == 2


async def test_deposit_gone_at_the_provider_alerts_once(make_stack: MakeStack) -> None:
    """A tracked deposit whose detail answers 10000100 on every poll gives one critical alert."""
    stack = await make_stack()
    tx = inject(stack, 1002, "41", "TGonePayer000000000000000000000001")
    await reach(stack, tx, "submitted")
    await stack.settle()
    stack.sandbox.set_fault("detail", kind="code", code="10000100", count=None)
    samples = await scrape(stack)
    runs = polls(samples, "detail", "ok")

    async def more_runs() -> bool:
        return polls(await scrape(stack), "detail", "ok") >= runs + 4

    await stack.wait_for(more_runs, 10, "four more detail polls")
    await stack.settle()
    gone = [m for m in stack.emails_for(tx) if "deposit_gone" in str(m["X-Depositd-Condition"])]
    assert len(gone) == 1
    assert len([p for p in stack.slack_for(tx) if "10000100" in json.dumps(p)]) == 1
    assert await state_of(stack, tx) == "submitted"
