"""Jobs of `serve` on one APScheduler: one every interval (its first run at start) and, when
given, one daily at `HH:MM` UTC; each runs at most once at a time, and a stop waits for what
runs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from worker.aio import finish_or_cancel
from worker.clock import iso_from_ms
from worker.logs import get_logger
from worker.store.meta import existed_at
from worker.store.sqlitestore import Store

log = get_logger(__name__)
T = TypeVar("T")

# A daily job the service missed (down at that minute) still runs within this much after.
DAILY_MISFIRE_GRACE_S = int(timedelta(hours=1).total_seconds())


def last_slot(at: str, now: datetime) -> datetime:
    """The last minute `at` (HH:MM UTC) at or before `now`."""
    hour, minute = (int(x) for x in at.split(":"))
    today = now.astimezone(UTC).replace(hour=hour, minute=minute, second=0, microsecond=0)
    return today if today <= now else today - timedelta(days=1)


def missed_slot(at: str, now: datetime) -> datetime | None:
    """The minute of the daily job at `at` that a start at `now` catches up on: its last one,
    when that passed less than the misfire grace ago; None otherwise."""
    slot = last_slot(at, now)
    return slot if timedelta(0) < now - slot <= timedelta(seconds=DAILY_MISFIRE_GRACE_S) else None


async def missed_run(store: Store, job: str, slot: datetime) -> bool:
    """Whether the store missed the daily job's run at `slot`, so that a start within the grace
    runs it: not when the store was created after that minute (a first start: no run was due
    on a store that was not there, and a new install has no day to publish or compare yet)."""
    moment = iso_from_ms(int(slot.timestamp() * 1000))
    if await store.read(lambda db: existed_at(db, moment)):
        return True
    log.info("daily job not run at start: the store was created after its minute", job=job)
    return False


async def logged_run(name: str, run: Coroutine[Any, Any, T]) -> T | None:
    """One run of a job, its start and end logged at debug (with several instances, they show
    that the scheduler's jobs ran on one at a time). An error that escapes the run is logged
    as it happens, with the job's name (None then): each run is a task of its own, started
    again at the job's next time, and nothing else would read its error."""
    log.debug("job started", job=name)
    try:
        return await run
    except Exception as exc:
        log.exception("job failed", job=name, error=f"{type(exc).__name__}: {exc}")
        return None
    finally:
        log.debug("job ended", job=name)


class IntervalAndDaily:
    """Runs `coroutine(name)` for the interval job and the daily job (subclasses say which;
    `daily` None: the interval job alone)."""

    def __init__(self, interval: tuple[str, float], daily: tuple[str, str] | None) -> None:
        self._interval_name, self._interval_s = interval
        self._daily = daily
        self._scheduler = AsyncIOScheduler(timezone="UTC")
        self._running: dict[str, asyncio.Task[Any]] = {}
        self._stopping = False

    def coroutine(self, name: str) -> Coroutine[Any, Any, Any]:
        """The run of the job `name`."""
        raise NotImplementedError

    def halt(self) -> None:
        """Ask a run in flight to end at its next safe point (at stop)."""

    def fire(self, name: str) -> None:
        """Start the job `name` now unless it runs already (or the jobs are stopping)."""
        if self._stopping:
            return
        task = self._running.get(name)
        if task is not None and not task.done():
            return
        coroutine = logged_run(name, self.coroutine(name))
        self._running[name] = asyncio.get_running_loop().create_task(coroutine, name=name)

    def in_flight(self, name: str) -> asyncio.Task[Any] | None:
        """The last run of the job `name` (done or not), None before the first."""
        return self._running.get(name)

    def _job(self, name: str) -> Callable[[], Coroutine[Any, Any, None]]:
        async def fire() -> None:  # a coroutine: APScheduler runs plain functions in threads
            self.fire(name)

        return fire

    def start(self) -> None:
        """The interval job now and every interval; the daily job at its minute."""
        self._stopping = False
        self._scheduler.add_job(
            self._job(self._interval_name),
            "interval",
            seconds=self._interval_s,
            next_run_time=datetime.now(UTC),
            max_instances=1,
            coalesce=True,
            id=self._interval_name,
        )
        if self._daily is not None:
            name, at = self._daily
            hour, minute = (int(x) for x in at.split(":"))
            self._scheduler.add_job(
                self._job(name),
                "cron",
                hour=hour,
                minute=minute,
                max_instances=1,
                coalesce=True,
                misfire_grace_time=DAILY_MISFIRE_GRACE_S,
                id=name,
            )
        self._scheduler.start()

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop scheduling; a run in flight ends at its next safe point (`halt`), and is
        cancelled after `grace_s`."""
        self._stopping = True
        self.halt()
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)
            await asyncio.sleep(0)
        pending = [t for t in self._running.values() if not t.done()]
        if pending:
            await finish_or_cancel(pending, grace_s)
