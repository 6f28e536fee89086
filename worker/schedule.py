"""Polling fallback (APScheduler 3.x in the serve process).

Polls only produce facts: history records and transaction details go through the same
`observe(fact)` entry point as webhooks, so a deposit found by a poll acts exactly once, as if
its webhook had come. Transaction detail is the only place `creditStatus` BLOCKED shows.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime
from functools import partial
from typing import Any

import sqlite_utils
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from worker.errors import ProviderAuthError, ProviderBusinessError, ProviderError
from worker.facts import fact_from_order
from worker.logs import get_logger
from worker.provider.client import ProviderClient
from worker.reactor import enqueue_alert
from worker.settings import SchedulerSettings
from worker.store import Store
from worker.tracker import Deposit, Fact

log = get_logger(__name__)

# Tracked states whose detail may still change and that history (init/rejected) does not show.
DETAIL_STATES = ("submitted", "credited", "processing")
FAILING_ALERT_AFTER = 3

Observe = Callable[[Fact], Awaitable[Any]]


def alert_gone(db: sqlite_utils.Database, transaction_id: str) -> None:
    """Queue one critical alert for a tracked deposit the provider no longer knows (10000100)."""
    queued = db.execute(
        "SELECT 1 FROM actions WHERE transaction_id=? AND action='alert' AND trigger='gone'",
        [transaction_id],
    ).fetchone()
    row = db.execute("SELECT * FROM deposits WHERE transaction_id=?", [transaction_id]).fetchone()
    if queued is None and row is not None:
        enqueue_alert(
            db,
            Deposit.from_row(dict(row)),
            "deposit_gone",
            "critical",
            trigger="gone",
            detail="10000100: transaction not found, or not owned by the caller (detail poll)",
        )


class PollStats:
    """Figures for /metrics and `status`."""

    def __init__(self) -> None:
        self.last_success: dict[str, float] = {}
        self.failures: dict[str, int] = {}
        self.found_by_poll = 0


class Poller:
    """The two polls, each with its own back-off on provider errors."""

    def __init__(
        self,
        client: ProviderClient,
        store: Store,
        observe: Observe,
        settings: SchedulerSettings,
        *,
        alert: Callable[[str, str, str], Awaitable[None]] | None = None,
        on_poll: Callable[[str, str], None] | None = None,
        backoff_s: float = 1.0,
        backoff_max_s: float = 600.0,
    ) -> None:
        self._client = client
        self._store = store
        self._observe = observe
        self._settings = settings
        self._alert = alert
        self._on_poll = on_poll
        # Public so that tests and the demo can shorten the back-off of a running poller.
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self._not_before: dict[str, float] = {}
        self._alerted: set[str] = set()
        self._stopping = False
        self.stats = PollStats()

    def stop(self) -> None:
        """Make a poll in flight end after the record in hand (shutdown must not wait for pages)."""
        self._stopping = True

    async def _known(self, transaction_id: str) -> bool:
        found = await self._store.write(
            lambda db: db.execute(
                "SELECT 1 FROM deposits WHERE transaction_id=?", [transaction_id]
            ).fetchone()
        )
        return found is not None

    async def poll_history(self) -> int:
        """Feed every record of the init and rejected queues to the tracker; returns the count."""
        return await self._guard("history", self._history)

    async def poll_detail(self) -> int:
        """Read the detail of every tracked deposit that is not final; returns the count."""
        return await self._guard("detail", self._detail)

    async def _history(self) -> int:
        seen = 0
        for status in ("init", "rejected"):
            async for order in self._client.iter_history(
                white_list_status=status, page_size=self._settings.page_size
            ):
                if not await self._known(order.transactionId):
                    self.stats.found_by_poll += 1
                    log.info("found by poll", transactionId=order.transactionId, poll="history")
                await self._observe(fact_from_order(order, source="poll"))
                seen += 1
                if self._stopping:
                    return seen  # the rest is found by the next run after the restart
        return seen

    async def _detail(self) -> int:
        marks = ",".join("?" for _ in DETAIL_STATES)
        rows = await self._store.write(
            lambda db: [
                r[0]
                for r in db.execute(
                    f"SELECT transaction_id FROM deposits WHERE state IN ({marks})"
                    " ORDER BY updated_at",
                    list(DETAIL_STATES),
                ).fetchall()
            ]
        )
        for tx in rows:
            if self._stopping:
                break
            try:
                order = await self._client.transaction_detail(tx)
            except ProviderBusinessError as exc:
                if exc.code == "10000100":
                    log.warning("deposit not found by detail poll", transactionId=tx)
                    await self._store.write(partial(alert_gone, transaction_id=tx))
                    continue
                raise
            await self._observe(fact_from_order(order, source="poll"))
        return len(rows)

    async def _guard(self, name: str, poll: Callable[[], Coroutine[Any, Any, int]]) -> int:
        now = time.monotonic()
        if now < self._not_before.get(name, 0.0):
            return 0
        try:
            count = await poll()
        except ProviderError as exc:
            kind = "auth" if isinstance(exc, ProviderAuthError) else "error"
            await self._failed(name, kind, str(exc))
            return 0
        except Exception as exc:
            # Storage or a bug: the poll task must not die with an unretrieved exception.
            log.exception("poll crashed", poll=name)
            await self._failed(name, "error", f"{type(exc).__name__}: {exc}")
            return 0
        if self.stats.failures.get(name):
            log.info("poll recovered", poll=name, after=self.stats.failures[name])
        self.stats.failures[name] = 0
        self._alerted.discard(name)
        self.stats.last_success[name] = time.time()
        if self._on_poll is not None:
            self._on_poll(name, "ok")
        return count

    async def _failed(self, name: str, kind: str, error: str) -> None:
        failures = self.stats.failures.get(name, 0) + 1
        self.stats.failures[name] = failures
        delay = min(self.backoff_max_s, self.backoff_s * 2.0**failures) * (
            0.5 + random.random() / 2
        )
        self._not_before[name] = time.monotonic() + delay
        log.warning(
            "poll failed; backing off",
            poll=name,
            failures=failures,
            backoffSeconds=round(delay, 3),
            error=error,
        )
        if self._on_poll is not None:
            self._on_poll(name, kind)
        if failures >= FAILING_ALERT_AFTER and name not in self._alerted:
            self._alerted.add(name)
            if self._alert is not None:
                await self._alert(
                    f"poll_failing:{name}",
                    "critical" if kind == "auth" else "warning",
                    f"{name} poll failed {failures} times in a row: {error}",
                )


class Scheduler:
    """APScheduler jobs for the polls; one run of a poll at a time; shutdown waits for it."""

    def __init__(self, poller: Poller, settings: SchedulerSettings) -> None:
        self._poller = poller
        self._settings = settings
        self._scheduler = AsyncIOScheduler(timezone="UTC")
        self._running: dict[str, asyncio.Task[int]] = {}
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
            self._running[name] = asyncio.get_running_loop().create_task(poll())

        return fire

    def start(self) -> None:
        """Add both jobs (first run at once) and start."""
        self._stopping = False
        now = datetime.now(UTC)
        jobs = (
            ("history", self._poller.poll_history, self._settings.history_interval_s),
            ("detail", self._poller.poll_detail, self._settings.detail_interval_s),
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

    async def stop(self) -> None:
        """Stop scheduling and wait for the poll in flight."""
        self._stopping = True
        self._poller.stop()
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)
            # AsyncIOScheduler only queues its shutdown on the loop: let it happen.
            await asyncio.sleep(0)
        pending = [t for t in self._running.values() if not t.done()]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
