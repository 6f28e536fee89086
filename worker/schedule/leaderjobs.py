"""The leader's jobs: the polls, the catch-up, the money jobs, the deadline job and the
journal's, started on the instance that holds the scheduler's lease and stopped when it loses it
(or the service stops).

`LeaderJobs` is a part of `worker.service.runtime.Runtime`, which sets the attributes it names.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import Counter, Gauge

from worker.act.outbox import Outbox
from worker.act.reactor import RuleReactor
from worker.clock import utc_now
from worker.config.settings import Settings
from worker.metrics import Metrics
from worker.poll.catchup import Applied, HistoryReader, ReadStats
from worker.poll.poller import Observe, Poller
from worker.provider.client import ProviderClient
from worker.reconcile.metrics import MoneyMetrics
from worker.rules import RuleBook
from worker.schedule.catchup import CatchUp
from worker.schedule.deadlines import DEADLINE_INTERVAL_S, DeadlineJob
from worker.schedule.journal import JournalJob
from worker.schedule.leader import Leader, lease_time
from worker.schedule.money import MoneyJobs, money_jobs
from worker.schedule.polls import Scheduler
from worker.store.meta import set_meta
from worker.store.sqlitestore import Store

STOP_GRACE_S = 5.0  # how long a stop waits for the outbox's action or a poll in flight


class PollMetrics:
    """Poll figures on the app's registry."""

    def __init__(self, metrics: Metrics) -> None:
        self.last_success = Gauge(
            "depositd_poll_last_success_timestamp_seconds",
            "Unix time of the last successful poll.",
            ["poll"],
            registry=metrics.registry,
        )
        self.runs = Counter(
            "depositd_polls",
            "Poll runs by poll and outcome.",
            ["poll", "outcome"],
            registry=metrics.registry,
        )
        self.found = Counter(
            "depositd_deposits_found_by_poll",
            "Deposits first seen by a poll (no webhook announced them) since start.",
            registry=metrics.registry,
        )
        self.interval = Gauge(
            "depositd_poll_interval_seconds",
            "The configured interval of each poll (for alerts on polls overdue).",
            ["poll"],
            registry=metrics.registry,
        )
        self.leader = Gauge(
            "depositd_leader",
            "1 while this instance leads the scheduler (its polls and daily jobs run here).",
            ["instance"],
            registry=metrics.registry,
        )
        self._found_seen = 0

    def found_total(self, total: int) -> None:
        """Advance the found-by-poll counter to the poller's running total."""
        if total > self._found_seen:
            self.found.inc(total - self._found_seen)
            self._found_seen = total


class Keeper(Protocol):
    """What keeps the leader's loop running, restarted after an error (the service's
    `worker.service.supervise.Supervisor`)."""

    def keep(
        self, name: str, run: Callable[[], Coroutine[Any, Any, Any]], *, once: bool = False
    ) -> asyncio.Task[None]:
        """Run `run()` as the task `name` until the stop."""
        ...


class LeaderJobs:
    """Start and stop of the leader's jobs, and the metrics of the polls."""

    settings: Settings
    instance: str
    store: Store | None
    client: ProviderClient | None
    outbox: Outbox | None
    scheduler: Scheduler | None
    poller: Poller | None
    catchup: CatchUp | None
    money: MoneyJobs | None
    deadlines: DeadlineJob | None
    journal: JournalJob | None
    leader: Leader | None
    _metrics: Metrics | None
    _poll_metrics: PollMetrics | None
    _money_gauges: MoneyMetrics | None
    _jobs_args: tuple[Observe, list[Callable[[], None]]] | None
    _poll_backoff_s: float
    _tasks: list[asyncio.Task[Any]]
    _stop: asyncio.Event
    reactor: RuleReactor
    supervisor: Keeper

    if TYPE_CHECKING:

        @property
        def rules(self) -> RuleBook: ...

        async def alert(self, condition: str, severity: str, detail: str) -> None: ...

        def _hold(self, work: Coroutine[Any, Any, Any], name: str | None = None) -> None: ...

    async def start_polls(
        self,
        observe: Observe,
        after_commit: list[Callable[[], None]],
        abnormal_hints: list[Callable[[], None]],
    ) -> None:
        """The scheduler's polls, the catch-up jobs, the money jobs (abnormal funds, daily
        reconciliation), the deadline job and the daily journal job, when `scheduler.enabled`:
        on the instance that holds the scheduler's lease (`worker.schedule.leader`), started and
        stopped as it gains and loses it."""
        settings = self.settings.scheduler
        if not settings.enabled:
            return
        assert self.store is not None and self._poll_metrics is not None
        poll_metrics = self._poll_metrics
        poll_metrics.interval.labels(poll="history").set(settings.history_interval_s)
        poll_metrics.interval.labels(poll="detail").set(settings.detail_interval_s)
        poll_metrics.interval.labels(poll="blocked").set(settings.blocked_interval_s)
        poll_metrics.leader.labels(instance=self.instance).set(0)
        self._money_metrics()  # on every instance: a follower shows them too
        self._jobs_args = (observe, after_commit)
        abnormal_hints.append(lambda: self.money.hint() if self.money is not None else None)
        intervals = [
            settings.history_interval_s,
            settings.detail_interval_s,
            settings.blocked_interval_s,
            settings.catchup_interval_s,
            settings.abnormal_interval_s,
            DEADLINE_INTERVAL_S,
        ]
        self.leader = Leader(
            self.store,
            self.instance,
            lease_time(self.settings.instance.lease_s, intervals),
            on_gain=self._start_jobs,
            on_loss=self._stop_jobs,
        )
        # The first try now: an instance alone on its database leads from its start on.
        await self.leader.tick()
        leader, stop = self.leader, self._stop
        self._tasks.append(self.supervisor.keep("leader", lambda: leader.run(stop)))

    async def _start_jobs(self) -> None:
        """This instance leads: build and start the polls, catch-up, money, deadline and journal
        jobs."""
        assert self.store is not None and self.client is not None and self.outbox is not None
        assert self._metrics is not None and self._poll_metrics is not None
        assert self._jobs_args is not None
        observe, after_commit = self._jobs_args
        settings = self.settings.scheduler
        store, poll_metrics = self.store, self._poll_metrics

        def on_poll(name: str, outcome: str) -> None:
            poll_metrics.runs.labels(poll=name, outcome=outcome).inc()
            if outcome == "ok":
                poll_metrics.last_success.labels(poll=name).set_to_current_time()
                assert self.poller is not None
                poll_metrics.found_total(self.poller.stats.found_by_poll)
                self._hold(store.write(lambda db: set_meta(db, f"last_{name}_poll_ok", utc_now())))

        self.poller = Poller(
            self.client,
            store,
            observe,
            settings,
            alert=self.alert,
            on_poll=on_poll,
            backoff_s=self._poll_backoff_s,
        )
        self.scheduler = Scheduler(self.poller, settings)
        self.scheduler.start()
        self.catchup = self._catchup(store, self._metrics, after_commit)
        self.catchup.start()
        self.money = money_jobs(
            self.client.for_polls(),
            store,
            lambda: self.rules,
            settings,
            self._money_metrics(),
            wake=self.outbox.wake,
            alert=self.alert,
            backoff_s=self._poll_backoff_s,
        )
        self.money.start()
        self.deadlines = DeadlineJob(store, lambda: self.rules, wake=self.outbox.wake)
        self.deadlines.start()
        # The journal verified and its head published once a day (docs/audit.md).
        self.journal = JournalJob(store, settings.journal_at, wake=self.outbox.wake)
        self.journal.start()
        poll_metrics.leader.labels(instance=self.instance).set(1)

    def _money_metrics(self) -> MoneyMetrics:
        """The money jobs' metrics, registered once."""
        if self._money_gauges is None:
            assert self._metrics is not None
            self._money_gauges = MoneyMetrics(self._metrics.registry)
        return self._money_gauges

    async def _stop_jobs(self) -> None:
        """This instance no longer leads (or stops): stop the jobs, cancelling a run in flight
        at once unless the service is stopping (then within the stop's grace)."""
        grace = STOP_GRACE_S if self._stop.is_set() else 0.0
        scheduler, self.scheduler = self.scheduler, None
        catchup, self.catchup = self.catchup, None
        money, self.money = self.money, None
        deadlines, self.deadlines = self.deadlines, None
        journal, self.journal = self.journal, None
        if self._poll_metrics is not None:
            self._poll_metrics.leader.labels(instance=self.instance).set(0)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        if scheduler is not None:
            await scheduler.stop(grace_s=grace)
        if catchup is not None:
            await catchup.stop(grace_s=max(0.0, deadline - loop.time()))
        if money is not None:
            await money.stop(grace_s=max(0.0, deadline - loop.time()))
        if deadlines is not None:
            await deadlines.stop(grace_s=max(0.0, deadline - loop.time()))
        if journal is not None:
            await journal.stop(grace_s=max(0.0, deadline - loop.time()))

    def _catchup(
        self, store: Store, metrics: Metrics, after_commit: list[Callable[[], None]]
    ) -> CatchUp:
        """The catch-up jobs: full-history reads through the same tracker and reactor."""
        assert self.client is not None
        s = self.settings.scheduler

        def wake_all() -> None:
            for hook in list(after_commit):
                hook()

        def on_done(job: str, stats: ReadStats) -> None:
            outcome = "complete" if stats.complete else "incomplete"
            metrics.catchup_runs.labels(job=job, outcome=outcome).inc()
            if job == "catchup":
                metrics.catchup_last.set_to_current_time()
                metrics.catchup_found.set(stats.new_deposits)

        def on_applied(done: Applied) -> None:
            for _, transition in done.transitions:
                metrics.transitions.labels(trigger=transition.trigger.value).inc()

        reader = HistoryReader(
            self.client.for_polls(),
            store,
            lambda: self.reactor,
            page_size=lambda: s.page_size,
            max_pages=s.max_pages,
            after_commit=wake_all,
            on_applied=on_applied,
        )
        return CatchUp(reader, store, s, on_done=on_done)
