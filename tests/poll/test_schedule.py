"""The polls and their scheduler against a real sandbox on loopback and a real SQLite store."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer
from structlog.testing import capture_logs

from tests.support.configs import PROVIDER_KEY, PROVIDER_SECRET
from tests.support.sandboxes import sandbox_settings
from worker.act.queue import enqueue_alert
from worker.clock import now_ms
from worker.config.settings import SchedulerSettings
from worker.dev.sandbox.app import SANDBOX_KEY, create_app
from worker.dev.sandbox.handle import Sandbox
from worker.dev.sandbox.testing import ENTITY_PAYER
from worker.poll.poller import FAILING_ALERT_AFTER, Poller
from worker.provider.client import ProviderClient
from worker.provider.models import WhiteListStatus
from worker.schedule.polls import Scheduler
from worker.store.sqlitestore import Store
from worker.track.facts import fact_from_order
from worker.track.processor import Processor
from worker.track.tracker import Fact


@dataclass
class Calls:
    """Provider calls as the client reports them (endpoint, outcome, monotonic time)."""

    seen: list[tuple[str, str, float]] = field(default_factory=list)

    def __call__(self, endpoint: str, outcome: str) -> None:
        self.seen.append((endpoint, outcome, time.monotonic()))

    def count(self, endpoint: str, outcome: str | None = None) -> int:
        """How many calls of `endpoint` (with `outcome`, if given) were made."""
        return sum(1 for e, o, _ in self.seen if e == endpoint and outcome in (None, o))


@dataclass
class Env:
    """A sandbox, a client of it, a store and a processor whose `observe_fact` the polls feed."""

    sandbox: Sandbox
    client: ProviderClient
    store: Store
    processor: Processor
    calls: Calls


@pytest.fixture
async def env(aiohttp_server: object, tmp_path: Path) -> AsyncIterator[Env]:
    """Everything the poller talks to, real and on loopback."""
    app = create_app(sandbox_settings(fault_timeout_s=2))
    server: TestServer = await aiohttp_server(app)  # type: ignore[operator]
    calls = Calls()
    client = ProviderClient(
        str(server.make_url("/")),
        PROVIDER_KEY,
        PROVIDER_SECRET,
        retries=0,
        timeout_s=5,
        on_call=calls,
    )
    store = Store(tmp_path / "depositd.db")
    await store.open()
    try:
        yield Env(app[SANDBOX_KEY], client, store, Processor(store), calls)
    finally:
        await client.close()
        await store.close()


@dataclass
class Clock:
    """The poller's wall clock (epoch ms), moved on by hand: every deposit read in a detail run
    is due again once it moved on by `detail_interval_s`."""

    ms: int = field(default_factory=lambda: int(time.time() * 1000))

    def __call__(self) -> int:
        return self.ms

    def tick(self, seconds: float = 60.0) -> None:
        """Move on by `seconds`."""
        self.ms += int(seconds * 1000)


def settings(**kw: float) -> SchedulerSettings:
    """Scheduler settings with short intervals unless told otherwise."""
    values: dict[str, float] = {"history_interval_s": 0.05, "detail_interval_s": 60.0}
    values.update(kw)
    return SchedulerSettings.model_validate(values)


def inject(sandbox: Sandbox, n: int) -> list[str]:
    """`n` gated deposits (unknown source addresses) into wallet 1001; their transactionIds."""
    return [
        sandbox.inject_deposit(1001, "USDT", "TRON", f"{i + 1}.25", f"TSchedUnknown{i:04d}")[
            "transactionId"
        ]
        for i in range(n)
    ]


async def until(predicate: Callable[[], bool], timeout: float = 5) -> None:  # noqa: ASYNC109
    """Wait until `predicate()` holds, checking every 20 ms."""
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110 - the state is plain attributes, no event
            await asyncio.sleep(0.02)


class CountingPoller(Poller):
    """A poller that records how many history runs overlap and how many ran to the end."""

    def __init__(self, *args: object, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.in_flight = 0
        self.max_in_flight = 0
        self.started = 0
        self.finished = 0
        self.first_started = asyncio.Event()

    async def poll_history(self) -> int:
        """The real history poll, counted."""
        self.in_flight += 1
        self.started += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.first_started.set()
        try:
            return await super().poll_history()
        finally:
            self.in_flight -= 1
            self.finished += 1


async def test_history_poll_never_runs_twice_at_once(env: Env) -> None:
    """With a slow provider and an interval far shorter than a poll, runs never overlap."""
    env.sandbox.set_fault("history", "latency", count=None, latency_s=0.1)
    sched_settings = settings(history_interval_s=0.02)
    poller = CountingPoller(env.client, env.store, env.processor.observe_fact, sched_settings)
    scheduler = Scheduler(poller, sched_settings)
    scheduler.start()
    try:
        # Several runs, each far longer than the interval: any overlap would show by then.
        await until(lambda: poller.finished >= 3, timeout=15)
    finally:
        await scheduler.stop()
    assert poller.started >= 3, "the scheduler should have started several runs"
    assert poller.max_in_flight == 1
    # Each run reads the init and the rejected queue: two sequential slow calls per run.
    assert env.calls.count("history") <= 2 * poller.started


async def test_scheduler_polls_feed_the_tracker(env: Env) -> None:
    """A started scheduler finds a deposit no webhook announced and stores it as needs_details."""
    (tx,) = inject(env.sandbox, 1)
    sched_settings = settings()
    poller = Poller(env.client, env.store, env.processor.observe_fact, sched_settings)
    scheduler = Scheduler(poller, sched_settings)
    scheduler.start()
    try:
        assert scheduler.running
        await until(lambda: poller.stats.found_by_poll >= 1)
    finally:
        await scheduler.stop()
    assert not scheduler.running
    row = await env.store.write(
        lambda db: tuple(
            db.execute("SELECT state, amount FROM deposits WHERE transaction_id=?", [tx]).fetchone()
        )
    )
    assert row == ("needs_details", "1.25")


async def test_backoff_grows_after_errors_and_resets_on_success(env: Env) -> None:
    """Failed polls back off (doubling, no provider call meanwhile), alert once, then recover."""
    env.sandbox.set_fault("history", "5xx", count=None)
    outcomes: list[str] = []
    alerts: list[tuple[str, str]] = []

    async def alert(condition: str, severity: str, detail: str) -> None:
        alerts.append((condition, severity))

    base = 0.05
    poller = Poller(
        env.client,
        env.store,
        env.processor.observe_fact,
        settings(),
        alert=alert,
        on_poll=lambda name, outcome: outcomes.append(f"{name}:{outcome}"),
        backoff_s=base,
    )
    async with asyncio.timeout(10):
        while outcomes.count("history:error") < 4:
            assert await poller.poll_history() == 0
            await asyncio.sleep(0.005)
    attempts = [t for e, o, t in env.calls.seen if e == "history"]
    assert len(attempts) == 4, "no provider call may be made while backing off"
    gaps = [later - earlier for earlier, later in itertools.pairwise(attempts)]
    for n, gap in enumerate(gaps, start=1):
        assert gap >= base * 2**n * 0.5, f"retry {n} came after {gap:.3f}s"
    assert gaps[2] > gaps[0]
    assert poller.stats.failures["history"] == 4
    assert alerts == [("poll_failing:history", "warning")]
    assert FAILING_ALERT_AFTER == 3

    env.sandbox.clear_faults()
    async with asyncio.timeout(10):
        while "history:ok" not in outcomes:
            await poller.poll_history()
            await asyncio.sleep(0.01)
    assert poller.stats.failures["history"] == 0
    assert poller.stats.last_success["history"] == pytest.approx(time.time(), abs=5)
    # A success ends the streak: the next run is not held back.
    before = env.calls.count("history")
    await poller.poll_history()
    assert env.calls.count("history") == before + 2
    assert len(alerts) == 1


async def test_timeouts_count_as_poll_errors(env: Env) -> None:
    """A provider that does not answer in time makes the poll fail and back off, not crash."""
    short = ProviderClient(
        env.client._origin,  # the same sandbox, with a shorter client timeout
        PROVIDER_KEY,
        PROVIDER_SECRET,
        retries=0,
        timeout_s=0.2,
    )
    outcomes: list[str] = []
    poller = Poller(
        short,
        env.store,
        env.processor.observe_fact,
        settings(),
        on_poll=lambda name, outcome: outcomes.append(f"{name}:{outcome}"),
        backoff_s=10,
    )
    (tx,) = inject(env.sandbox, 1)
    await mark_submitted(env, tx)
    env.sandbox.set_fault("detail", "timeout", count=None)
    try:
        assert await poller.poll_detail() == 0
        assert await poller.poll_detail() == 0  # held back: no second wait for a timeout
    finally:
        env.sandbox.clear_faults()
        await short.close()
    assert outcomes == ["detail:error"]
    assert poller.stats.failures == {"detail": 1}
    assert "detail" not in poller.stats.last_success


async def test_stop_waits_for_the_poll_in_flight(env: Env) -> None:
    """Shutdown waits for the poll in flight to store the record in hand, then starts no new one."""
    (tx,) = inject(env.sandbox, 1)
    env.sandbox.set_fault("history", "latency", count=None, latency_s=0.2)
    sched_settings = settings(history_interval_s=0.05)
    poller = CountingPoller(env.client, env.store, env.processor.observe_fact, sched_settings)
    scheduler = Scheduler(poller, sched_settings)
    scheduler.start()
    async with asyncio.timeout(5):
        await poller.first_started.wait()
    started = time.monotonic()
    await scheduler.stop()
    assert time.monotonic() - started >= 0.1, "stop returned before the poll in flight ended"
    assert poller.in_flight == 0
    assert poller.finished == poller.started == 1
    # The run ends after the record in hand: the rejected queue is left for the next start.
    assert env.calls.count("history") == 1
    assert poller.stats.last_success.get("history") is not None  # ended normally, not cancelled
    state = await env.store.write(
        lambda db: db.execute("SELECT state FROM deposits WHERE transaction_id=?", [tx]).fetchone()[
            0
        ]
    )
    assert state == "needs_details"
    await asyncio.sleep(0.2)
    assert poller.started == 1, "a poll started after stop"


async def test_history_is_read_one_page_at_a_time(env: Env) -> None:
    """Many pages of history are fetched lazily: each record is observed before the next page."""
    txs = inject(env.sandbox, 23)
    pages_read_when_observed: list[int] = []

    async def observe(fact: Fact) -> object:
        pages_read_when_observed.append(env.calls.count("history"))
        return await env.processor.observe_fact(fact)

    poller = Poller(env.client, env.store, observe, settings(page_size=4))
    assert await poller.poll_history() == 23
    # 6 pages of init (4+4+4+4+4+3), then one empty page of rejected.
    assert env.calls.count("history") == 7
    assert pages_read_when_observed == [1 + i // 4 for i in range(23)]
    assert poller.stats.found_by_poll == 23
    rows = await env.store.write(
        lambda db: [
            tuple(r) for r in db.execute("SELECT transaction_id, state, source FROM deposits")
        ]
    )
    assert sorted(rows) == sorted((tx, "needs_details", "poll") for tx in txs)

    assert await poller.poll_history() == 23
    assert poller.stats.found_by_poll == 23, "known deposits are not found again"


async def mark_submitted(env: Env, tx: str) -> None:
    """Submit payer details at the sandbox and tell the tracker, as the outbox does."""
    env.sandbox.submit(
        tx,
        {
            "correspondentType": "ENTITY",
            "fullName": "Sched Test Ltd",
            "countryCode": "SG",
            "companyAddress": "1 Test Road",
            "walletType": "VASP",
            "provider": "Binance",
        },
    )
    order = await env.client.transaction_detail(tx)
    await env.processor.observe_fact(fact_from_order(order, source="poll", sent_at=now_ms()))
    await env.processor.observe_fact(
        Fact(
            transaction_id=tx,
            source="submit",
            observed_at=int(time.time() * 1000),
            white_list_status=WhiteListStatus.PENDING,
        )
    )


async def test_detail_poll_reads_deposits_in_motion_and_leaves_queued_ones_to_the_queue(
    env: Env,
) -> None:
    """Detail is read for a deposit in motion (BLOCKED shows), never for one the work queue
    lists; a blocked deposit is final for the detail poll."""
    waiting, submitted = inject(env.sandbox, 2)
    poller = Poller(env.client, env.store, env.processor.observe_fact, settings())
    await poller.poll_history()
    await mark_submitted(env, submitted)
    await poller.poll_history()  # the init queue lists `waiting` alone now
    calls_before = env.calls.count("transaction_detail")
    env.sandbox.block(submitted)
    assert await poller.poll_detail() == 1
    assert env.calls.count("transaction_detail") == calls_before + 1
    states = await env.store.write(
        lambda db: {r[0]: r[1] for r in db.execute("SELECT transaction_id, state FROM deposits")}
    )
    assert states == {waiting: "needs_details", submitted: "blocked"}
    assert await poller.poll_detail() == 0, "a blocked deposit is final for the detail poll"
    assert env.calls.count("transaction_detail") == calls_before + 1


async def states_of(env: Env) -> dict[str, str]:
    """The tracked state of every deposit."""
    return await env.store.write(
        lambda db: {r[0]: r[1] for r in db.execute("SELECT transaction_id, state FROM deposits")}
    )


@pytest.mark.parametrize("tracked", ["needs_details", "rejected"])
async def test_detail_poll_finds_credit_of_a_deposit_that_left_the_history_queues(
    env: Env, tracked: str
) -> None:
    """Submitted outside depositd and credited with its webhooks lost: only detail can tell."""
    (tx,) = inject(env.sandbox, 1)
    poller = Poller(env.client, env.store, env.processor.observe_fact, settings())
    if tracked == "rejected":
        env.sandbox.submit(tx, ENTITY_PAYER)
        env.sandbox.reject_review(tx, "name does not match")
    await poller.poll_history()
    assert await states_of(env) == {tx: tracked}
    # The merchant's hosted page submits; the review passes; no webhook reaches us.
    env.sandbox.submit(tx, ENTITY_PAYER)
    env.sandbox.approve_review(tx)
    assert await poller.poll_history() == 0, "the deposit left the init/rejected queues"
    assert await states_of(env) == {tx: tracked}
    assert await poller.poll_detail() == 1
    assert await states_of(env) == {tx: "credited"}


async def three_submitted(env: Env) -> tuple[str, str, str]:
    """Three submitted deposits; the first has the oldest `updated_at`, so it is read first."""
    first, second, third = inject(env.sandbox, 3)
    for tx in (first, second, third):
        await mark_submitted(env, tx)
        await asyncio.sleep(0.005)  # distinct updated_at (milliseconds): a fixed reading order
    return first, second, third


def one_deposit(tx: str) -> str:
    """The path prefix of one deposit's transaction detail, to inject a fault on it alone."""
    return f"/v1/wallet/transactions/{tx}"


@pytest.mark.parametrize("failure", ["business_code", "bad_record", "apply_error"])
async def test_one_failing_deposit_does_not_stop_the_detail_poll(env: Env, failure: str) -> None:
    """A deposit whose detail cannot be read or applied is logged and skipped; the run goes on."""
    bad, credited, blocked = await three_submitted(env)
    env.sandbox.approve_review(credited)
    env.sandbox.block(blocked)
    if failure == "business_code":
        env.sandbox.set_fault(one_deposit(bad), "code", count=None, code="10000107")
    elif failure == "bad_record":
        env.sandbox.state.orders[bad].amount = Decimal("-1")

    async def observe(fact: Fact) -> object:
        # Only this variant fakes a fault: a tracker that fails on one deposit's fact.
        if failure == "apply_error" and fact.transaction_id == bad:
            raise ValueError("cannot apply this fact")
        return await env.processor.observe_fact(fact)

    outcomes: list[str] = []
    poller = Poller(
        env.client,
        env.store,
        observe,
        settings(),
        on_poll=lambda name, outcome: outcomes.append(f"{name}:{outcome}"),
    )
    with capture_logs() as logs:
        assert await poller.poll_detail() == 3
    assert await states_of(env) == {bad: "submitted", credited: "credited", blocked: "blocked"}
    # The provider answered: the run counts as a success of the poll (no back-off) ...
    assert outcomes == ["detail:ok"]
    assert poller.stats.failures == {"detail": 0}
    # ... and the deposit's failure is visible, by transactionId and error only.
    assert poller.stats.detail_failed == 1
    (line,) = [e for e in logs if e["event"] == "deposit detail failed; poll goes on"]
    assert line["transactionId"] == bad
    expected = {
        "business_code": "10000107",
        "bad_record": "amount",
        "apply_error": "cannot apply this fact",
    }[failure]
    assert expected in line["error"]
    assert {"transactionId", "failedRuns", "error"} <= set(line)
    assert not any("Sched Test Ltd" in str(e) for e in logs), "payer data logged"


async def test_failing_deposit_is_read_after_the_others(env: Env) -> None:
    """A deposit that failed on its own is read last next time, though it is the stalest."""
    clock = Clock()
    bad, second, third = await three_submitted(env)
    applied: list[str] = []

    async def observe(fact: Fact) -> object:
        applied.append(fact.transaction_id)
        if fact.transaction_id == bad:
            raise ValueError("cannot apply this fact")
        return await env.processor.observe_fact(fact)

    poller = Poller(env.client, env.store, observe, settings(), clock=clock)
    assert await detail(poller, clock) == 3
    assert applied == [bad, second, third]
    applied.clear()
    assert await detail(poller, clock) == 3
    assert applied == [second, third, bad]


async def detail(poller: Poller, clock: Clock) -> int:
    """One detail run, `detail_interval_s` after the one before: every deposit is due again."""
    clock.tick(60.0)
    return await poller.poll_detail()


async def detail_alerts(env: Env) -> list[tuple[str, str, str]]:
    """The detail_failing alerts queued: (transactionId, condition, severity)."""
    rows = await env.store.write(
        lambda db: db.execute(
            "SELECT transaction_id, params FROM actions"
            " WHERE action='alert' AND trigger='detail_failing'"
        ).fetchall()
    )
    return [(r[0], json.loads(r[1])["condition"], json.loads(r[1])["severity"]) for r in rows]


async def test_deposit_failing_three_runs_in_a_row_alerts_once(env: Env) -> None:
    """The same deposit failing on 3 consecutive detail runs queues one warning alert for it."""
    clock = Clock()
    bad, good, _ = await three_submitted(env)
    env.sandbox.set_fault(one_deposit(bad), "code", count=None, code="10000101")
    poller = Poller(env.client, env.store, env.processor.observe_fact, settings(), clock=clock)
    for run in range(1, FAILING_ALERT_AFTER):
        assert await detail(poller, clock) == 3
        assert await detail_alerts(env) == [], f"alerted after {run} failed run(s)"
    env.sandbox.approve_review(good)
    assert await detail(poller, clock) == 3
    assert await detail_alerts(env) == [(bad, "detail_failing", "warning")]
    assert (await states_of(env))[good] == "credited", "the other deposits are still read"
    for _ in range(3):
        assert await detail(poller, clock) == 3
    assert await detail_alerts(env) == [(bad, "detail_failing", "warning")], "alerted twice"
    assert poller.stats.failures == {"detail": 0}
    assert poller.stats.detail_failed == FAILING_ALERT_AFTER + 3


async def test_detail_run_cut_short_starts_with_the_deposits_it_did_not_read(env: Env) -> None:
    """A provider-wide error at one deposit ends the run; the next run reads the others first."""
    clock = Clock()
    stuck, credited, blocked = await three_submitted(env)
    env.sandbox.approve_review(credited)
    env.sandbox.block(blocked)
    # A gateway failing on this one path: a 5xx, which ends the run like any outage.
    env.sandbox.set_fault(one_deposit(stuck), "5xx", count=None)
    outcomes: list[str] = []
    poller = Poller(
        env.client,
        env.store,
        env.processor.observe_fact,
        settings(),
        clock=clock,
        on_poll=lambda name, outcome: outcomes.append(f"{name}:{outcome}"),
        backoff_s=0,  # no waiting between the runs of this test
    )
    before = env.calls.count("transaction_detail")
    assert await detail(poller, clock) == 0
    assert outcomes == ["detail:error"]
    assert env.calls.count("transaction_detail") == before + 1, "the run went on after a 5xx"
    assert await states_of(env) == {stuck: "submitted", credited: "submitted", blocked: "submitted"}

    assert await detail(poller, clock) == 0
    assert outcomes == ["detail:error", "detail:error"]
    assert await states_of(env) == {stuck: "submitted", credited: "credited", blocked: "blocked"}


async def test_alert_that_cannot_be_queued_does_not_kill_the_poll(env: Env) -> None:
    """Storage down fails the poll and its poll_failing alert; a later failed run queues it."""
    clock = Clock()
    (tx,) = inject(env.sandbox, 1)
    await mark_submitted(env, tx)

    async def alert(condition: str, severity: str, detail: str) -> None:
        # What the runtime's alert does: queue it in the (here failing) store.
        await env.store.write(
            lambda db: enqueue_alert(db, None, condition, severity, trigger="system", detail=detail)
        )

    poller = Poller(
        env.client,
        env.store,
        env.processor.observe_fact,
        settings(),
        clock=clock,
        alert=alert,
        backoff_s=0,
    )
    await env.store.close()
    for _ in range(FAILING_ALERT_AFTER):
        assert await detail(poller, clock) == 0  # the third failure's alert fails too
    assert poller.stats.failures == {"detail": FAILING_ALERT_AFTER}

    await env.store.open()
    env.sandbox.set_fault("detail", "5xx", count=None)
    for _ in range(2):
        assert await detail(poller, clock) == 0
    assert poller.stats.failures == {"detail": FAILING_ALERT_AFTER + 2}
    queued = await env.store.write(
        lambda db: [
            tuple(r)
            for r in db.execute(
                "SELECT trigger, json_extract(params, '$.condition') FROM actions"
                " WHERE action='alert'"
            )
        ]
    )
    assert queued == [("system", "poll_failing:detail")], "queued on the retry, and once"


def test_poll_backoff_stays_bounded_after_days_of_failures() -> None:
    """A provider down for days (thousands of failed polls in a row) keeps the back-off within
    its bound instead of overflowing the doubling."""
    from worker.poll.backoff import poll_backoff

    assert 300.0 <= poll_backoff(5000, 1.0, 600.0) <= 600.0
    assert 1.0 <= poll_backoff(1, 1.0, 600.0) <= 2.0
