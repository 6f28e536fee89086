"""The polls' jobs: history, detail and blocked, each every its interval (its first run at
start), one run of a poll at a time; a stop waits for the run in flight (docs/polling.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from worker.aio import finish_or_cancel
from worker.config.settings import SchedulerSettings
from worker.poll.poller import Poller
from worker.schedule.jobs import logged_run


class Scheduler:
    """APScheduler jobs for the polls; one run of a poll at a time; shutdown waits for it."""

    def __init__(self, poller: Poller, settings: SchedulerSettings) -> None:
        self._poller = poller
        self._settings = settings
        self._scheduler = AsyncIOScheduler(timezone="UTC")
        self._running: dict[str, asyncio.Task[int | None]] = {}
        self._stopping = False

    @property
    def running(self) -> bool:
        """True while the scheduler is started."""
        return bool(self._scheduler.running)

    def _job(
        self, name: str, poll: Callable[[], Coroutine[Any, Any, int]]
    ) -> Callable[[], Coroutine[Any, Any, None]]:
        # A coroutine function: APScheduler's asyncio executor runs plain functions in a thread
        # pool, where there is no event loop to start the poll on.
        async def fire() -> None:
            if self._stopping:
                return
            task = self._running.get(name)
            if task is not None and not task.done():
                return  # the previous run is still going: never twice at once
            run = logged_run(name, poll())
            self._running[name] = asyncio.get_running_loop().create_task(run)

        return fire

    def start(self) -> None:
        """Add the polls' jobs (first run at once) and start."""
        self._stopping = False
        now = datetime.now(UTC)
        jobs = (
            ("history", self._poller.poll_history, self._settings.history_interval_s),
            ("detail", self._poller.poll_detail, self._settings.detail_interval_s),
            ("blocked", self._poller.poll_blocked, self._settings.blocked_interval_s),
        )
        for name, poll, interval_s in jobs:
            self._scheduler.add_job(
                self._job(name, poll),
                "interval",
                seconds=interval_s,
                next_run_time=now,
                max_instances=1,
                coalesce=True,
                id=name,
            )
        self._scheduler.start()

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop scheduling and wait for the poll in flight (cancelled after `grace_s`: a poll
        only reads, and the next run after the restart reads again)."""
        self._stopping = True
        self._poller.stop()
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)
            # AsyncIOScheduler only queues its shutdown on the loop: let it happen.
            await asyncio.sleep(0)
        pending = [t for t in self._running.values() if not t.done()]
        if pending:
            await finish_or_cancel(pending, grace_s)
