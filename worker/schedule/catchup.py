"""Catch-up in `serve`: when to read the full history, and from where.

- At start, every `scheduler.catchup_interval_s`, and as soon as the provider answers again
  after it was unreachable (connection errors, timeouts, 5xx): from the covered-until mark minus
  `scheduler.catchup_margin_s` to now (no mark yet: now minus `scheduler.catchup_lookback_s`,
  as one window split only when it is full).
  A deposit whose webhooks were lost while depositd (or its webhook path) was down is found by
  the next of these, at the latest one interval later.
- Daily at `scheduler.sweep_at` (UTC): the previous day's full history again, a safety net.

One read at a time; shutdown stops a read after its page in hand (its window is read again).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any

from worker.clock import iso_from_ms, now_ms
from worker.config.settings import SchedulerSettings
from worker.errors import StorageError
from worker.logs import get_logger
from worker.poll.catchup import HistoryReader, ReadStats, covered_until
from worker.schedule.jobs import IntervalAndDaily
from worker.store.sqlitestore import Store

log = get_logger(__name__)

DAY_MS = 86_400_000


def previous_day(now: int) -> tuple[int, int]:
    """The UTC day before the one of `now` (epoch ms), as [start, end]."""
    today = datetime.fromtimestamp(now / 1000, UTC).replace(
        hour=0, minute=0, second=0, microsecond=0
    )
    end = int(today.timestamp()) * 1000
    return end - DAY_MS, end


class CatchUp(IntervalAndDaily):
    """The catch-up and sweep jobs of one serve."""

    def __init__(
        self,
        reader: HistoryReader,
        store: Store,
        settings: SchedulerSettings,
        *,
        on_done: Callable[[str, ReadStats], None] | None = None,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        super().__init__(("catchup", settings.catchup_interval_s), ("sweep", settings.sweep_at))
        self._reader = reader
        self._store = store
        self._settings = settings
        self._on_done = on_done
        self._clock = clock
        self._lock = asyncio.Lock()
        self._out_of_contact = False
        self.last: ReadStats | None = None  # the last catch-up's figures
        self.last_at: float | None = None  # and when it ended (Unix time)

    def note_call(self, endpoint: str, outcome: str) -> None:
        """Every provider call's outcome: back in contact after it was unreachable -> catch up."""
        if outcome == "unavailable":
            if not self._out_of_contact:
                log.info("provider unreachable; catch-up follows when it answers again")
            self._out_of_contact = True
        elif self._out_of_contact:
            self._out_of_contact = False
            self.fire("catchup")

    def coroutine(self, name: str) -> Coroutine[Any, Any, ReadStats | None]:
        """The run of "catchup" or "sweep"."""
        return self.catch_up() if name == "catchup" else self.sweep()

    def halt(self) -> None:
        """A read in flight ends after its page in hand."""
        self._reader.stop()

    async def catch_up(self) -> ReadStats | None:
        """From the mark minus the margin (first time: now minus the lookback) to now."""
        s = self._settings
        end = self._clock()
        mark = await self._store.read(covered_until)
        window_ms = int(s.catchup_window_s * 1000)
        if mark is None:
            start = end - int(s.catchup_lookback_s * 1000)
            # First start: the whole lookback as one window, split only when it is full (more
            # pages than scheduler.max_pages), so an empty or small history costs one request.
            window_ms = max(window_ms, end - start)
        else:
            start = min(mark, end) - int(s.catchup_margin_s * 1000)
        return await self._run("catchup", start, end, may_start=True, window_ms=window_ms)

    async def sweep(self) -> ReadStats | None:
        """The previous UTC day's full history."""
        start, end = previous_day(self._clock())
        return await self._run("sweep", start, end, may_start=False)

    async def _run(
        self, name: str, start: int, end: int, *, may_start: bool, window_ms: int | None = None
    ) -> ReadStats | None:
        async with self._lock:
            if self._stopping:
                return None
            log.info(f"{name} started", start=iso_from_ms(start), end=iso_from_ms(end))
            try:
                stats = await self._reader.read(
                    start,
                    end,
                    window_ms or int(self._settings.catchup_window_s * 1000),
                    may_start=may_start,
                )
            except Exception as exc:  # storage or a bug: the job must not die unseen
                if not isinstance(exc, StorageError):  # the database unavailable: no traceback
                    log.exception(f"{name} failed", error=f"{type(exc).__name__}: {exc}")
                stats = ReadStats(complete=False, error=f"{type(exc).__name__}: {exc}")
        line = log.info if stats.complete else log.warning
        line(
            f"{name} done",
            complete=stats.complete,
            pages=stats.pages,
            records=stats.records,
            newDeposits=stats.new_deposits,
            newFacts=stats.new_facts,
            skipped=stats.skipped,
            error=stats.error,
        )
        if name == "catchup":
            self.last, self.last_at = stats, time.time()
        if self._on_done is not None:
            self._on_done(name, stats)
        return stats
