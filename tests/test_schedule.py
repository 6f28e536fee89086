"""The polls and their scheduler against a real sandbox on loopback and a real SQLite store."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from worker.facts import fact_from_order
from worker.processor import Processor
from worker.provider.client import ProviderClient
from worker.provider.models import WhiteListStatus
from worker.sandbox.app import SANDBOX_KEY, create_app
from worker.sandbox.config import SandboxConfig
from worker.sandbox.handle import Sandbox
from worker.schedule import FAILING_ALERT_AFTER, Poller, Scheduler
from worker.settings import SchedulerSettings
from worker.store import Store
from worker.tracker import Fact

API_KEY = "sched-key"
API_SECRET = "sched-secret"


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
    app = create_app(SandboxConfig(api_key=API_KEY, api_secret=API_SECRET, fault_timeout_s=2))
    server: TestServer = await aiohttp_server(app)  # type: ignore[operator]
    calls = Calls()
    client = ProviderClient(
        str(server.make_url("/")), API_KEY, API_SECRET, retries=0, timeout_s=5, on_call=calls
    )
    store = Store(tmp_path / "depositd.db")
    await store.open()
    try:
        yield Env(app[SANDBOX_KEY], client, store, Processor(store), calls)
    finally:
        await client.close()
        await store.close()


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
        await asyncio.sleep(0.6)
    finally:
        await scheduler.stop()
    assert poller.started >= 2, "the scheduler should have started several runs"
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
        API_KEY,
        API_SECRET,
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
    await env.processor.observe_fact(fact_from_order(order, source="poll"))
    await env.processor.observe_fact(
        Fact(
            transaction_id=tx,
            source="submit",
            observed_at=int(time.time() * 1000),
            white_list_status=WhiteListStatus.PENDING,
        )
    )


async def test_detail_poll_reads_only_deposits_that_may_still_change(env: Env) -> None:
    """Detail is read for submitted deposits, not for ones waiting for details; BLOCKED shows."""
    waiting, submitted = inject(env.sandbox, 2)
    poller = Poller(env.client, env.store, env.processor.observe_fact, settings())
    await poller.poll_history()
    await mark_submitted(env, submitted)
    calls_before = env.calls.count("transaction_detail")
    env.sandbox.block(submitted)
    assert await poller.poll_detail() == 1
    assert env.calls.count("transaction_detail") == calls_before + 1
    states = await env.store.write(
        lambda db: {r[0]: r[1] for r in db.execute("SELECT transaction_id, state FROM deposits")}
    )
    assert states == {waiting: "needs_details", submitted: "blocked"}
    assert await poller.poll_detail() == 0, "a blocked deposit is final for the detail poll"
