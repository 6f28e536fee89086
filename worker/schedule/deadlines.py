"""The deadline job of `serve`: every `DEADLINE_INTERVAL_S` on the scheduler's leader, the
deposits waiting on a person past their rule set's `deadline:` are alerted once more, raised
(`worker.act.waits`, docs/rules.md, "Deadlines")."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from worker.act.waits import Checked, check_deadlines
from worker.clock import now_ms
from worker.errors import StorageError
from worker.logs import get_logger
from worker.rules import RuleBook
from worker.schedule.jobs import IntervalAndDaily
from worker.store.sqlitestore import Store

log = get_logger(__name__)

# How often the open waits are looked at: a deadline is kept within this much.
DEADLINE_INTERVAL_S = 60.0


class DeadlineJob(IntervalAndDaily):
    """APScheduler job: `check_deadlines` every `interval_s` (its first run at start)."""

    def __init__(
        self,
        store: Store,
        rules: Callable[[], RuleBook],
        *,
        wake: Callable[[], None],
        interval_s: float = DEADLINE_INTERVAL_S,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        super().__init__(("deadlines", interval_s), None)
        self._store = store
        self._rules = rules
        self._wake = wake
        self.clock = clock

    def coroutine(self, name: str) -> Coroutine[Any, Any, Any]:
        """The run of the one job, "deadlines"."""
        return self.run()

    async def run(self) -> Checked:
        """One check with the rules in force now; the outbox is woken for the alerts queued."""
        try:
            checked = await check_deadlines(self._store, self._rules(), now=self.clock())
        except StorageError as exc:
            if not self._store.outage.note("deadlinesFailed"):
                log.warning("deadline check failed; the next run tries again", error=str(exc))
            return Checked()
        if checked.alerted:
            self._wake()
        return checked
