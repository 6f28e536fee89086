"""The money-integrity jobs of `serve`: the abnormal-fund poll every
`scheduler.abnormal_interval_s` (backing off on provider errors like the other polls; an
ABNORMAL_FUND_NOTIFICATION webhook starts one at once) and the daily reconciliation at
`scheduler.reconcile_at`: the previous UTC day, and of the last `RECONCILE_DAYS_BACK` days every
one no run completed (an outage) or whose ledger rows changed since its last run (a credit
booked late) (docs/reconciliation.md, "When a day is final")."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from worker.config.settings import SchedulerSettings
from worker.errors import ProviderAuthError, ProviderError, StorageError
from worker.logs import get_logger
from worker.poll.backoff import poll_backoff
from worker.reconcile.abnormal import AbnormalPoll
from worker.reconcile.reconciler import KINDS, Reconciler, RunResult
from worker.schedule.jobs import DAILY_MISFIRE_GRACE_S, IntervalAndDaily
from worker.store import abnormal as abnormal_store
from worker.store import findings as findings_store
from worker.store.writer import Store

log = get_logger(__name__)

FAILING_ALERT_AFTER = 3
# A failed daily reconciliation is tried again this much later, this many times.
RECONCILE_RETRY_S = 900.0
RECONCILE_RETRIES = 8
# How far back the daily job looks for days not reconciled or booked since their run: older
# days are final (`depositd reconcile --date DAY` still compares them).
RECONCILE_DAYS_BACK = 14
OUTCOMES = ("clean", "findings", "failed")


class MoneyMetrics:
    """Findings open by kind, last reconciled day, last run's outcome; abnormal funds."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.findings_open = Gauge(
            "depositd_reconcile_findings_open",
            "Reconciliation findings neither resolved nor acknowledged, by kind.",
            ["kind"],
            registry=registry,
        )
        self.last_day = Gauge(
            "depositd_reconcile_last_day_timestamp_seconds",
            "Start (Unix time, UTC midnight) of the last day reconciled completely (0: none).",
            registry=registry,
        )
        self.last_outcome = Gauge(
            "depositd_reconcile_last_outcome",
            "1 for the last reconciliation run's outcome (clean, findings, failed), 0 otherwise.",
            ["outcome"],
            registry=registry,
        )
        self.runs = Counter(
            "depositd_reconcile_runs",
            "Reconciliation runs by outcome (clean, findings, failed).",
            ["outcome"],
            registry=registry,
        )
        self.abnormal = Gauge(
            "depositd_abnormal_funds",
            "Abnormal funds seen at the provider, by status.",
            ["status"],
            registry=registry,
        )
        self.abnormal_polls = Counter(
            "depositd_abnormal_polls",
            "Abnormal-fund polls by outcome (ok, error, auth).",
            ["outcome"],
            registry=registry,
        )

    async def refresh(self, store: Store) -> None:
        """Read the gauges' figures from the store (an acknowledgement comes from the CLI)."""

        def read(db: Any) -> tuple[dict[str, int], str | None, Any, dict[str, int]]:
            return (
                findings_store.open_counts_by_kind(db),
                findings_store.last_reconciled_day(db),
                findings_store.last_run(db),
                abnormal_store.counts_by_status(db),
            )

        counts, day, last, abnormal = await store.read(read)
        for kind in KINDS:
            self.findings_open.labels(kind=kind).set(counts.get(kind, 0))
        if day is not None:
            start = datetime.fromisoformat(day).replace(tzinfo=UTC)
            self.last_day.set(start.timestamp())
        for outcome in OUTCOMES:
            hit = last is not None and last["outcome"] == outcome
            self.last_outcome.labels(outcome=outcome).set(1 if hit else 0)
        self.abnormal.clear()
        for status, count in abnormal.items():
            self.abnormal.labels(status=status).set(count)


def yesterday(now: datetime | None = None) -> dt.date:
    """The UTC day before today."""
    return ((now or datetime.now(UTC)).astimezone(UTC) - timedelta(days=1)).date()


class MoneyJobs(IntervalAndDaily):
    """APScheduler jobs for the abnormal-fund poll and the daily reconciliation."""

    def __init__(
        self,
        poll: AbnormalPoll,
        reconciler: Reconciler,
        store: Store,
        settings: SchedulerSettings,
        metrics: MoneyMetrics,
        *,
        alert: Callable[[str, str, str], Awaitable[None]] | None = None,
        backoff_s: float = 1.0,
        backoff_max_s: float = 600.0,
    ) -> None:
        super().__init__(
            ("abnormal", settings.abnormal_interval_s), ("reconcile", settings.reconcile_at)
        )
        self._poll = poll
        self._reconciler = reconciler
        self._store = store
        self._settings = settings
        self._metrics = metrics
        self._alert = alert
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self._failures = 0
        self._not_before = 0.0
        self.last_abnormal_ok: float | None = None
        self.reconcile_retry_s = RECONCILE_RETRY_S
        self.now: Callable[[], datetime] = lambda: datetime.now(UTC)

    def hint(self) -> None:
        """An ABNORMAL_FUND_NOTIFICATION arrived: poll now (unless backing off or running)."""
        self.fire("abnormal")

    def coroutine(self, name: str) -> Coroutine[Any, Any, Any]:
        """The run of "abnormal", "reconcile" (the days due) or "reconcile-missed"."""
        if name == "abnormal":
            return self.poll_abnormal()
        if name == "reconcile-missed":
            return self.reconcile_missed()
        return self.reconcile_due(yesterday_again=True)

    def start(self) -> None:
        """The jobs; and yesterday's reconciliation now if its minute passed less than the
        misfire grace ago without a completed run (the service was down then, or the instance
        leading the scheduler died and this one took over)."""
        super().start()
        hour, minute = (int(x) for x in self._settings.reconcile_at.split(":"))
        now = datetime.now(UTC)
        since = now - now.replace(hour=hour, minute=minute, second=0, microsecond=0)
        if timedelta(0) < since <= timedelta(seconds=DAILY_MISFIRE_GRACE_S):
            self.fire("reconcile-missed")

    async def reconcile_missed(self) -> None:
        """The days due (`reconcile_due`), at the start of the jobs: a day's run that was missed
        (decided per day: a later day reconciled from the console says nothing about
        yesterday)."""
        await self.reconcile_due()

    async def days_due(self) -> list[tuple[str, str]]:
        """(day, why) of the days to reconcile now, oldest first: of the `RECONCILE_DAYS_BACK`
        days up to yesterday, those no run completed and those whose ledger side changed since
        their run."""
        last = yesterday(self.now())
        first = last - timedelta(days=RECONCILE_DAYS_BACK - 1)
        return await self._store.read(
            partial(
                findings_store.days_due,
                first_day=first.isoformat(),
                last_day=last.isoformat(),
            )
        )

    async def reconcile_due(self, *, yesterday_again: bool = False) -> None:
        """Reconcile every day due, oldest first, and with `yesterday_again` (the daily job)
        yesterday even if a run completed it (one from the console before the report was
        whole); while one fails (the provider down), the days still due are tried again after
        `RECONCILE_RETRY_S`, up to `RECONCILE_RETRIES` times."""
        for attempt in range(RECONCILE_RETRIES + 1):
            try:
                due = await self.days_due()
            except Exception as exc:  # storage: the next daily job, or a restart, tries again
                log.warning("days to reconcile not read", error=str(exc))
                return
            last = yesterday(self.now()).isoformat()
            if yesterday_again and attempt == 0 and all(day != last for day, _ in due):
                due.append((last, "yesterday"))
            failed = False
            for day, why in due:
                if day != last:
                    log.info("reconciling a day again", day=day, reason=why)
                result = await self.reconcile(dt.date.fromisoformat(day))
                failed = failed or result is None or result.outcome == "failed"
                if self._stopping:
                    return
            if not failed or attempt == RECONCILE_RETRIES:
                return
            log.warning("reconciliation tried again later", retryInSeconds=self.reconcile_retry_s)
            await asyncio.sleep(self.reconcile_retry_s)

    def halt(self) -> None:
        """A poll in flight ends after its record; a reconciliation is cancelled after the
        grace (it records nothing until its one write, and the next run reads again)."""
        self._poll.stop()

    async def poll_abnormal(self) -> int:
        """One guarded poll: provider errors back off (doubling) and alert after three."""
        if time.monotonic() < self._not_before:
            return 0
        try:
            count = await self._poll.run()
        except Exception as exc:
            if isinstance(exc, StorageError) and self._store.outage.note("pollsFailed"):
                return 0  # counted in the outage's lines; the next turn tries again
            await self._poll_failed(exc)
            return 0
        self._failures = 0
        self.last_abnormal_ok = time.time()
        self._metrics.abnormal_polls.labels(outcome="ok").inc()
        await self._refresh()
        return count

    async def _poll_failed(self, exc: Exception) -> None:
        self._failures += 1
        kind = "auth" if isinstance(exc, ProviderAuthError) else "error"
        delay = poll_backoff(self._failures, self.backoff_s, self.backoff_max_s)
        self._not_before = time.monotonic() + delay
        self._metrics.abnormal_polls.labels(outcome=kind).inc()
        line = log.warning if isinstance(exc, ProviderError) else log.exception
        line(
            "poll failed; backing off",
            poll="abnormal",
            failures=self._failures,
            backoffSeconds=round(delay, 3),
            error=f"{type(exc).__name__}: {exc}",
        )
        if self._failures == FAILING_ALERT_AFTER and self._alert is not None:
            try:
                await self._alert(
                    "poll_failing:abnormal",
                    "critical" if kind == "auth" else "warning",
                    f"abnormal poll failed {self._failures} times in a row: {exc}",
                )
            except Exception as err:
                log.warning("could not queue poll_failing alert", error=str(err))

    async def reconcile(self, day: dt.date) -> RunResult | None:
        """One reconciliation of `day`; a failure is recorded and alerted by the reconciler."""
        try:
            result = await self._reconciler.run(day)
        except Exception:  # storage or a bug: the job must not die unseen
            log.exception("reconciliation crashed", day=day.isoformat())
            return None
        self._metrics.runs.labels(outcome=result.outcome).inc()
        await self._refresh()
        return result

    async def _refresh(self) -> None:
        try:
            await self._metrics.refresh(self._store)
        except Exception as exc:
            log.warning("metrics refresh failed", error=str(exc))


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
    return MoneyJobs(poll, reconciler, store, settings, metrics, alert=alert, backoff_s=backoff_s)
