"""The daily journal job of `serve` (docs/audit.md, "Anchoring the head"): at
`scheduler.journal_at` (UTC) the instance leading the scheduler verifies the journal
(`worker.store.verification`), keeps the outcome as the last verification, and publishes the
head, `SEQ:HASH` with the time, where the database cannot reach: one log line, and one alert to
the configured channels (`journal_head`, info; `journal_broken`, critical, when something does
not verify). Once per UTC day across the instances: the day is claimed in the same transaction
that queues the alert. A start within the misfire grace after the minute (the service was down
then, or another instance took the lead) runs it then.

The line names entries, deposits and submissions at most, never a payer value.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from worker.act.queue import enqueue_alert
from worker.aio import finish_or_cancel
from worker.clock import iso_from_ms
from worker.logs import get_logger
from worker.schedule.jobs import (
    DAILY_MISFIRE_GRACE_S,
    last_slot,
    logged_run,
    missed_run,
    missed_slot,
)
from worker.store import verification
from worker.store.sqlitestore import Store
from worker.store.verification import CHUNK, Verification

log = get_logger(__name__)

HEAD = "journal_head"  # the alert condition of the daily head
BROKEN = "journal_broken"  # ... when the journal does not verify


def head_line(outcome: Verification) -> str:
    """What the day's alert says: the head and the time, and whether everything verified."""
    if outcome.head is None:
        head = f"The journal is empty at {outcome.at} (no entry yet)"
    else:
        head = f"Journal head {outcome.head} at {outcome.at}"
    if outcome.problem is not None:
        return f"{head}. It does NOT verify: {outcome.problem}"
    return (
        f"{head}: verified ({outcome.entries} entries; {outcome.ledger_rows} ledger rows and"
        f" {outcome.submissions} submissions match them)."
    )


def _publish(db: Any, *, day: str, outcome: Verification) -> bool:
    """The day's publication, unless another run made it: claimed, the verification kept, the
    alert queued."""
    if not verification.claim_publication(db, day):
        return False
    verification.record(db, outcome)
    enqueue_alert(
        db,
        None,
        HEAD if outcome.verified else BROKEN,
        "info" if outcome.verified else "critical",
        trigger="system",
        detail=head_line(outcome),
    )
    return True


class JournalJob:
    """The daily verification and publication of the head, on one APScheduler job."""

    def __init__(
        self,
        store: Store,
        at: str,
        *,
        wake: Callable[[], None] | None = None,
        chunk: int = CHUNK,
    ) -> None:
        self._store = store
        self._at = at
        self._wake = wake
        self._chunk = chunk
        self._scheduler = AsyncIOScheduler(timezone="UTC")
        self._task: asyncio.Task[Any] | None = None
        self._stopping = False
        self.now: Callable[[], datetime] = lambda: datetime.now(UTC)

    def slot(self, now: datetime) -> datetime:
        """The job's last minute at or before `now`: its day is the day published."""
        return last_slot(self._at, now)

    def start(self) -> None:
        """The daily job; and now, when its minute passed less than the misfire grace ago."""
        self._stopping = False
        hour, minute = (int(x) for x in self._at.split(":"))

        async def fire() -> None:  # a coroutine: APScheduler runs plain functions in threads
            self.fire()

        self._scheduler.add_job(
            fire,
            "cron",
            hour=hour,
            minute=minute,
            max_instances=1,
            coalesce=True,
            misfire_grace_time=DAILY_MISFIRE_GRACE_S,
            id="journal",
        )
        self._scheduler.start()
        slot = missed_slot(self._at, self.now())
        if slot is not None:
            self.fire(missed=slot)

    def fire(self, *, missed: datetime | None = None) -> None:
        """Run the job now unless it runs already (or the job is stopping); `missed`: the
        minute a start catches up on, run only if the store missed it."""
        if self._stopping or (self._task is not None and not self._task.done()):
            return
        run = self.publish() if missed is None else self._catch_up(missed)
        self._task = asyncio.get_running_loop().create_task(
            logged_run("journal", run), name="journal"
        )

    @property
    def in_flight(self) -> asyncio.Task[Any] | None:
        """The job's last run (done or not), None before the first."""
        return self._task

    async def _catch_up(self, slot: datetime) -> Verification | None:
        """The run a start makes for the minute `slot`, if the store was there then."""
        if not await missed_run(self._store, "journal", slot):
            return None
        return await self.publish()

    async def publish(self, now: datetime | None = None) -> Verification | None:
        """Verify and publish the head for the day of the job's last minute before `now`;
        None when that day's was published already."""
        now = now or self.now()
        day = self.slot(now).date().isoformat()
        if await self._store.read(verification.published_day) == day:
            return None
        at = iso_from_ms(int(now.timestamp() * 1000))
        outcome = await verification.verify(self._store.read, at=at, chunk=self._chunk)
        if not await self._store.write(partial(_publish, day=day, outcome=outcome)):
            return None
        if outcome.verified:
            log.info("journal head", head=str(outcome.head or "empty"), at=at, verified=True)
        else:
            log.error(
                "journal head; the journal does not verify",
                head=str(outcome.head or "empty"),
                at=at,
                verified=False,
                problem=outcome.problem,
            )
        if self._wake is not None:
            self._wake()
        return outcome

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop scheduling; a run in flight is cancelled after `grace_s` (it writes once, at
        its end: the next run verifies again)."""
        self._stopping = True
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)
            await asyncio.sleep(0)
        if self._task is not None and not self._task.done():
            await finish_or_cancel([self._task], grace_s)
