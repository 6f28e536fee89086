"""The daily journal job: the leader verifies the journal and publishes its head (SEQ:HASH and
the time) once per UTC day to the Slack endpoint and the SMTP server on loopback, never a payer
value; a journal that does not verify alerts critical. On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.support.configs import JSON_LOGS, make_config, write_config
from tests.support.journalrows import book, by_hand, submit
from tests.support.ports import free_port
from tests.support.processes import Processes
from tests.support.stacks import NEVER, MakeStack
from tests.support.stores import StoreMaker
from worker.clock import iso_from_ms, now_ms
from worker.dev.harness import Stack
from worker.schedule.journal import JournalJob
from worker.store import journal
from worker.store.meta import CREATED_AT, set_meta
from worker.store.verification import last_verification

# Every test here runs on SQLite and on PostgreSQL, its stacks too.
pytestmark = pytest.mark.usefixtures("engine")

ProfileFactory = Callable[..., dict[str, Any]]
# A store's creation time a day back: there at any daily minute a start catches up on.
YESTERDAY = iso_from_ms(now_ms() - 86_400_000)


def slack_of(stack: Stack, condition: str) -> list[str]:
    """The Slack payloads of one alert condition, as text."""
    texts = [json.dumps(p) for p in stack.slack]
    return [t for t in texts if f"condition `{condition}`" in t]


def mails_of(stack: Stack, condition: str) -> list[EmailMessage]:
    """The e-mails of one alert condition."""
    return [m for m in stack.emails if m.get("X-Depositd-Condition") == condition]


def personal(payer: dict[str, Any]) -> list[str]:
    """The values of a payer profile that must never leave the database."""
    keys = ("fullName", "companyAddress", "walletLabel", "firstName", "lastName", "birthday")
    return [str(payer[k]) for k in keys if k in payer]


def everything_sent(stack: Stack) -> str:
    """Every Slack payload and every e-mail (headers and body) received, as one text."""
    mails = [str(m) + m.get_content() for m in stack.emails]
    return "\n".join([*(json.dumps(p) for p in stack.slack), *mails])


def first_day(stack: Stack) -> datetime:
    """Half a minute past the stack's daily journal minute on a day of 2026."""
    hour, minute = (int(x) for x in stack.journal_at.split(":"))
    return datetime(2026, 5, 4, hour, minute, 30, tzinfo=UTC)


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.000Z")


def job_of(stack: Stack) -> JournalJob:
    job = stack.runtime.journal
    assert job is not None, "the worker leads the scheduler: its journal job runs"
    return job


async def test_the_head_is_published_once_a_day_without_payer_values(
    start_stack: MakeStack, entity_payer: ProfileFactory
) -> None:
    stack = await start_stack(history_interval_s=NEVER, detail_interval_s=NEVER)
    payer = entity_payer(walletLabel="Ledger of Ms Example")

    def write(db: Any) -> None:
        book(db, "tx-1")
        submit(db, "tx-1", payer, profile="demo-entity")
        book(db, "tx-2", amount="7.25")

    await stack.store.write(write)
    head = await stack.store.read(journal.head)
    assert head is not None and head.seq == 3

    day = first_day(stack)
    outcome = await job_of(stack).publish(day)
    assert outcome is not None and outcome.verified and outcome.head == head
    await stack.wait_for(
        lambda: slack_of(stack, "journal_head") and mails_of(stack, "journal_head"),
        what="the head on Slack and by e-mail",
    )
    [slack], [mail] = slack_of(stack, "journal_head"), mails_of(stack, "journal_head")
    line = f"Journal head {head} at {iso(day)}: verified"
    assert line in slack and line in " ".join(mail.get_content().split())
    assert "INFO" in mail["Subject"]

    # Later that day, from this instance or from one that took the lead after a restart: the
    # day's head is out already.
    assert await job_of(stack).publish(day + timedelta(hours=5)) is None
    await stack.restart_worker()
    assert await job_of(stack).publish(day + timedelta(hours=23, minutes=59)) is None
    await stack.settle()
    assert len(slack_of(stack, "journal_head")) == 1 and len(mails_of(stack, "journal_head")) == 1

    # The next day's, once.
    await stack.store.write(lambda db: book(db, "tx-3"))
    outcome = await job_of(stack).publish(day + timedelta(days=1))
    assert outcome is not None and outcome.head is not None and outcome.head.seq == 4
    await stack.wait_for(
        lambda: (
            len(slack_of(stack, "journal_head")) == 2 and len(mails_of(stack, "journal_head")) == 2
        ),
        what="the second day's head",
    )
    assert (
        f"Journal head {outcome.head} at {iso(day + timedelta(days=1))}"
        in slack_of(stack, "journal_head")[1]
    )
    sent = everything_sent(stack)
    assert "demo-entity" not in sent  # not even the profile's name: the head is all there is
    for value in personal(payer):
        assert value not in sent
    last = await stack.store.read(last_verification)
    assert last is not None and last["verified"] and last["head"] == str(outcome.head)


async def test_a_journal_that_does_not_verify_alerts_critical(start_stack: MakeStack) -> None:
    stack = await start_stack(history_interval_s=NEVER, detail_interval_s=NEVER)
    await stack.store.write(lambda db: book(db, "tx-1"))
    assert stack.storage is not None
    by_hand(
        stack.storage,
        "INSERT INTO ledger (transaction_id, wallet_id, currency, amount, booked_at, trigger)"
        " VALUES ('tx-9', 1001, 'USDT', '99', '2026-01-01T00:00:00.000Z', 'credited')",
    )
    outcome = await job_of(stack).publish(first_day(stack))
    assert outcome is not None and not outcome.verified
    await stack.wait_for(
        lambda: slack_of(stack, "journal_broken") and mails_of(stack, "journal_broken"),
        what="the critical alert",
    )
    [slack], [mail] = slack_of(stack, "journal_broken"), mails_of(stack, "journal_broken")
    assert "CRITICAL" in mail["Subject"] and "CRITICAL" in slack
    problem = "ledger row tx-9 has no journal entry (inserted by hand?)"
    assert problem in slack and problem in " ".join(mail.get_content().split())
    assert slack_of(stack, "journal_head") == []
    last = await stack.store.read(last_verification)
    assert last is not None and (last["verified"], last["problem"]) == (False, problem)


async def test_the_leader_publishes_at_the_daily_minute_missed_at_start(
    start_stack: MakeStack,
) -> None:
    """A worker starting within the misfire grace after `scheduler.journal_at` on a store that
    was there at that minute publishes the day's head then (it was down at that minute); its
    restart does not publish it again. A store created after the minute (a first start)
    publishes nothing at start: no run was missed."""
    just_past = (datetime.now(UTC) - timedelta(minutes=1)).strftime("%H:%M")
    stack = await start_stack(
        history_interval_s=NEVER, detail_interval_s=NEVER, journal_at=just_past
    )
    started = job_of(stack).in_flight
    assert started is not None, "the start looked at the minute it passed"
    assert await started is None  # nothing published
    await stack.settle()
    assert slack_of(stack, "journal_head") == []
    assert await stack.store.read(last_verification) is None
    await stack.store.write(lambda db: set_meta(db, CREATED_AT, YESTERDAY))
    await stack.restart_worker()
    await stack.wait_for(lambda: slack_of(stack, "journal_head"), what="the head at start")
    assert "The journal is empty at" in slack_of(stack, "journal_head")[0]
    await stack.restart_worker()
    await stack.settle()
    assert len(slack_of(stack, "journal_head")) == 1


async def test_serve_logs_and_sends_the_head_once_across_restarts(
    tmp_path: Path,
    make_store: StoreMaker,
    provider_url: str,
    processes: Processes,
    aiohttp_server: Callable[[web.Application], Awaitable[TestServer]],
) -> None:
    """`serve` started within the hour after `scheduler.journal_at` writes the head line to its
    log and posts it to Slack; started again the same day, it publishes nothing more."""
    posted: list[str] = []

    async def slack(request: web.Request) -> web.Response:
        posted.append(await request.text())
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/slack", slack)
    server = await aiohttp_server(app)
    store = make_store()
    await store.open()
    try:
        await store.write(lambda db: [book(db, f"tx-{n}") for n in (1, 2)])
        await store.write(lambda db: set_meta(db, CREATED_AT, YESTERDAY))  # there at the minute
        head = await store.read(journal.head)
    finally:
        await store.close()
    port = free_port()
    cfg = make_config(
        make_store.storage(),
        provider_url,
        port=port,
        scheduler={"journal_at": (datetime.now(UTC) - timedelta(minutes=1)).strftime("%H:%M")},
        notify={"slack": {"webhook_url": str(server.make_url("/slack"))}},
        log=JSON_LOGS,
    )
    config = write_config(tmp_path, cfg)
    log = tmp_path / "serve.log"

    def head_lines() -> list[dict[str, Any]]:
        lines = [json.loads(t) for t in log.read_text().splitlines() if t.startswith("{")]
        return [line for line in lines if line["event"] == "journal head"]

    serve = processes.serve(config, port, log)
    await serve.start()
    await wait_until(lambda: head_lines() and posted, "the head in the log and on Slack")
    [line] = head_lines()
    assert (line["head"], line["verified"]) == (str(head), True)
    assert line["at"] in posted[0] and str(head) in posted[0]
    assert await serve.signal(signal.SIGTERM) == 0

    again = processes.serve(config, port, log)
    await again.start()
    await asyncio.sleep(2)  # the job ran at start, found the day's head out, and did nothing
    assert await again.signal(signal.SIGTERM) == 0
    assert len(head_lines()) == 1 and len(posted) == 1


async def wait_until(check: Callable[[], Any], what: str, within: float = 20) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)
