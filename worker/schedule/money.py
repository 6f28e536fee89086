"""The money-integrity jobs of `serve`: the abnormal-fund poll every
`scheduler.abnormal_interval_s` (an ABNORMAL_FUND_NOTIFICATION webhook starts one at once) and
the daily reconciliation at `scheduler.reconcile_at`, also at start when that minute passed
less than the misfire grace ago. What a run does is the reconciliation's: the guarded poll
(`worker.reconcile.abnormal.AbnormalWatch`) and the days due (`worker.reconcile.daily`,
docs/reconciliation.md, "When a day is final")."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime
from typing import Any

from worker.config.settings import SchedulerSettings
from worker.reconcile.abnormal import AbnormalPoll, AbnormalWatch
from worker.reconcile.daily import DailyRuns
from worker.reconcile.metrics import MoneyMetrics
from worker.reconcile.reconciler import Reconciler
from worker.schedule.jobs import IntervalAndDaily, missed_run, missed_slot
from worker.store.sqlitestore import Store


class MoneyJobs(IntervalAndDaily):
    """APScheduler jobs for the abnormal-fund poll and the daily reconciliation."""

    def __init__(
        self,
        abnormal: AbnormalWatch,
        daily: DailyRuns,
        settings: SchedulerSettings,
        store: Store,
    ) -> None:
        super().__init__(
            ("abnormal", settings.abnormal_interval_s), ("reconcile", settings.reconcile_at)
        )
        self.abnormal = abnormal
        self.daily = daily
        self._settings = settings
        self._store = store
        self._missed: datetime | None = None  # the minute `start` catches up on

    def hint(self) -> None:
        """An ABNORMAL_FUND_NOTIFICATION arrived: poll now (unless backing off or running)."""
        self.fire("abnormal")

    def coroutine(self, name: str) -> Coroutine[Any, Any, Any]:
        """The run of "abnormal", "reconcile" (the days due, and yesterday again) or
        "reconcile-missed" (the days due, at the start of the jobs: a day's run that was missed
        is decided per day; a later day reconciled from the console says nothing about
        yesterday)."""
        if name == "abnormal":
            return self.abnormal.poll()
        if name == "reconcile-missed":
            return self._reconcile_missed()
        return self.daily.reconcile_due(yesterday_again=True)

    def start(self) -> None:
        """The jobs; and yesterday's reconciliation now if its minute passed less than the
        misfire grace ago without a completed run (the service was down then, or the instance
        leading the scheduler died and this one took over), on a store that was there then."""
        super().start()
        self._missed = missed_slot(self._settings.reconcile_at, datetime.now(UTC))
        if self._missed is not None:
            self.fire("reconcile-missed")

    async def _reconcile_missed(self) -> None:
        """The days due, if the store was there at the minute this start catches up on."""
        assert self._missed is not None  # fired by `start` only when there is one
        if await missed_run(self._store, "reconcile", self._missed):
            await self.daily.reconcile_due()

    def halt(self) -> None:
        """A poll in flight ends after its record, the days due after the day in hand; a
        reconciliation is cancelled after the grace (it records nothing until its one write,
        and the next run reads again)."""
        self.abnormal.stop()
        self.daily.stop()


def money_jobs(
    client: Any,
    store: Store,
    rules: Callable[[], Any],
    settings: SchedulerSettings,
    metrics: MoneyMetrics,
    *,
    wake: Callable[[], None],
    alert: Callable[[str, str, str], Awaitable[None]] | None,
    backoff_s: float = 1.0,
) -> MoneyJobs:
    """The jobs of one serve, on its client, store, rules and metrics (made once per registry:
    the jobs are built again each time this instance becomes the scheduler's leader)."""
    poll = AbnormalPoll(
        client,
        store,
        rules,
        page_size=settings.page_size,
        max_pages=settings.max_pages,
        after_commit=wake,
    )
    reconciler = Reconciler(
        client, store, rules, after_commit=wake, drift_after_s=settings.detail_interval_s
    )
    return MoneyJobs(
        AbnormalWatch(poll, store, metrics, alert=alert, backoff_s=backoff_s),
        DailyRuns(reconciler, store, metrics),
        settings,
        store,
    )
