"""The days the daily reconciliation compares (docs/reconciliation.md, "When a day is final"):
the previous UTC day, and of the last `RECONCILE_DAYS_BACK` days every one no run completed (an
outage) or whose ledger rows changed since its last run (a credit booked late). While one fails
(the provider down), the days still due are tried again later. When the job runs is the
scheduler's (`worker.schedule.money`).
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial

from worker.logs import get_logger
from worker.reconcile.metrics import MoneyMetrics
from worker.reconcile.reconciler import Reconciler, RunResult
from worker.store import findings as findings_store
from worker.store.sqlitestore import Store

log = get_logger(__name__)

# A failed daily reconciliation is tried again this much later, this many times.
RECONCILE_RETRY_S = 900.0
RECONCILE_RETRIES = 8
# How far back the daily job looks for days not reconciled or booked since their run: older
# days are final (`depositd reconcile --date DAY` still compares them).
RECONCILE_DAYS_BACK = 14


def yesterday(now: datetime | None = None) -> dt.date:
    """The UTC day before today."""
    return ((now or datetime.now(UTC)).astimezone(UTC) - timedelta(days=1)).date()


class DailyRuns:
    """The runs of the daily reconciliation: the days due, oldest first, each compared by the
    `Reconciler`; the money metrics read again after each run."""

    def __init__(self, reconciler: Reconciler, store: Store, metrics: MoneyMetrics) -> None:
        self._reconciler = reconciler
        self._store = store
        self._metrics = metrics
        self._stopping = False
        self.retry_s = RECONCILE_RETRY_S
        self.now: Callable[[], datetime] = lambda: datetime.now(UTC)

    def stop(self) -> None:
        """End the runs after the day in hand (the jobs stop)."""
        self._stopping = True

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
        `retry_s`, up to `RECONCILE_RETRIES` times."""
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
            log.warning("reconciliation tried again later", retryInSeconds=self.retry_s)
            await asyncio.sleep(self.retry_s)

    async def reconcile(self, day: dt.date) -> RunResult | None:
        """One reconciliation of `day`; a failure is recorded and alerted by the reconciler."""
        try:
            result = await self._reconciler.run(day)
        except Exception:  # storage or a bug: the job must not die unseen
            log.exception("reconciliation crashed", day=day.isoformat())
            return None
        self._metrics.runs.labels(outcome=result.outcome).inc()
        await self._metrics.try_refresh(self._store)
        return result
