"""The service's long-running tasks, watched: none of them ends unnoticed.

`serve` runs tasks for its whole life (the outbox, daily maintenance, the leader's lease, the
processor, ...). Each loop handles the errors it expects (a storage outage, a provider answer)
itself; what escapes it is a defect, and without a watcher the task would end with the error
unread until the stop while the service went on answering 200 (docs/operations.md).

`Supervisor.keep` runs a loop and restarts it after an unexpected error, with a back-off
doubling from `base_s` to `max_s`; after `give_up_after` errors in a row (each within
`stable_s` of the task's start) it stops restarting and the service exits 1, for systemd's
`Restart=on-failure` to start it afresh. `Supervisor.watch` follows a task started elsewhere
that cannot be restarted in place: its error ends the service at once. Every error is logged
when it happens, with the task's name; `problems()` names the tasks down (restarting, or
given up), which /healthz, /readyz and the `status` command read. A task given up stops the
service the way a SIGTERM does (the commit in flight finished, STOPPING=1 for systemd), not by
the watchdog's kill.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from worker.act.queue import backoff
from worker.aio import first_done
from worker.logs import get_logger
from worker.store.db import Db
from worker.store.meta import TASKS_DOWN, get_meta, set_meta

log = get_logger(__name__)


RESTART_BASE_S = 1.0
RESTART_MAX_S = 30.0
STABLE_S = 60.0  # a task that ran this long before failing is not failing in a loop
GIVE_UP_AFTER = 5  # errors in a row: then the service exits 1 (systemd restarts it)


@dataclass
class _Down:
    """A task that ended with an error: how many times in a row, and the last error."""

    errors: int
    error: str
    given_up: bool = False


class SupervisorMetrics:
    """The tasks' figures on the app's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.up = Gauge(
            "depositd_task_up",
            "1 while a long-running task of serve runs, 0 while it is down after an error.",
            ["task"],
            registry=registry,
        )
        self.errors = Counter(
            "depositd_task_errors",
            "Unexpected errors that ended a long-running task of serve.",
            ["task"],
            registry=registry,
        )


class Supervisor:
    """Runs, restarts and reports the service's long-running tasks."""

    def __init__(
        self,
        metrics: SupervisorMetrics | None = None,
        *,
        base_s: float | None = None,
        max_s: float | None = None,
        stable_s: float | None = None,
        give_up_after: int | None = None,
    ) -> None:
        self._metrics = metrics
        # The module's figures unless given, read now (tests shorten them).
        self.base_s = RESTART_BASE_S if base_s is None else base_s
        self.max_s = RESTART_MAX_S if max_s is None else max_s
        self.stable_s = STABLE_S if stable_s is None else stable_s
        self.give_up_after = GIVE_UP_AFTER if give_up_after is None else give_up_after
        self._down: dict[str, _Down] = {}
        self._stopping = False
        self._stopped = asyncio.Event()  # ends a wait to restart
        # Set once a task is given up: `serve` stops and exits 1.
        self.failed = asyncio.Event()
        self.failure = ""
        # Called with the problems whenever they change (`status` reads them from the store).
        self.on_change: list[Callable[[list[str]], None]] = []

    def keep(
        self, name: str, run: Callable[[], Coroutine[Any, Any, Any]], *, once: bool = False
    ) -> asyncio.Task[None]:
        """Run `run()` as the task `name` until the stop; restarted after an error. A loop
        (`once` False) that returns before the stop is restarted too; a one-off check
        (`once`) is done once it returns."""
        return asyncio.get_running_loop().create_task(self._keep(name, run, once), name=name)

    async def _keep(
        self, name: str, run: Callable[[], Coroutine[Any, Any, Any]], once: bool
    ) -> None:
        loop = asyncio.get_running_loop()
        errors = 0
        while not self._stopping:
            started = loop.time()
            self._up(name)
            try:
                await run()
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                log.exception("task failed", task=name, error=error)
            else:
                if once or self._stopping:
                    return
                error = "ended before the service stopped"
                log.error("task failed", task=name, error=error)
            if self._stopping:
                return
            errors = 1 if loop.time() - started >= self.stable_s else errors + 1
            if errors >= self.give_up_after:
                self._give_up(name, errors, error)
                return
            delay = backoff(errors, self.base_s, self.max_s)
            self._set_down(name, _Down(errors, error))
            log.warning("task restarting", task=name, errorsInARow=errors, restartInSeconds=delay)
            await first_done(self._stopped.wait(), at_most_s=delay)

    def watch(self, name: str, task: asyncio.Future[Any]) -> None:
        """Follow a task started elsewhere: an error (or an end before the stop) ends the
        service, as it cannot be restarted in place."""

        def ended(task: asyncio.Future[Any]) -> None:
            if self._stopping or task.cancelled():
                return
            exc = task.exception()
            error = "ended before the service stopped" if exc is None else f"{exc!r}"
            log.error("task failed", task=name, error=error, exc_info=exc)
            self._give_up(name, 1, error)

        task.add_done_callback(ended)

    def _give_up(self, name: str, errors: int, error: str) -> None:
        self._set_down(name, _Down(errors, error, given_up=True))
        log.critical(
            "task failed too often; the service stops (exit status 1)",
            task=name,
            errorsInARow=errors,
            error=error,
        )
        if not self.failed.is_set():
            self.failure = name
            self.failed.set()

    def _up(self, name: str) -> None:
        if self._metrics is not None:
            self._metrics.up.labels(task=name).set(1)
        if self._down.pop(name, None) is not None:
            log.info("task running again", task=name)
            self._changed()

    def _set_down(self, name: str, down: _Down) -> None:
        if self._metrics is not None:
            self._metrics.up.labels(task=name).set(0)
            self._metrics.errors.labels(task=name).inc()
        self._down[name] = down
        self._changed()

    def _changed(self) -> None:
        problems = self.problems()
        for hook in list(self.on_change):
            with contextlib.suppress(Exception):  # a report must not take a task down
                hook(problems)

    def problems(self) -> list[str]:
        """The tasks down now: restarting after an error, or given up."""
        return [
            f"{name} {'stopped' if down.given_up else 'restarting'} after {down.errors}"
            f" error{'s' * (down.errors != 1)} in a row: {down.error}"
            for name, down in sorted(self._down.items())
        ]

    async def ready(self) -> str | None:
        """Ready check: None while every task runs, else the tasks down."""
        problems = self.problems()
        return "; ".join(problems) if problems else None

    def stopping(self) -> None:
        """The service stops: tasks ending now end as asked, not with an error."""
        self._stopping = True
        self._stopped.set()


def record_down(db: Db, instance: str, problems: list[str]) -> None:
    """Record the tasks down on `instance` (none: its entry goes) for `status`."""
    down: dict[str, list[str]] = json.loads(get_meta(db, TASKS_DOWN) or "{}")
    if problems:
        down[instance] = problems
    elif down.pop(instance, None) is None:
        return
    set_meta(db, TASKS_DOWN, json.dumps(down, sort_keys=True))


def record_gone(db: Db) -> None:
    """No other instance runs: what the instances gone recorded as down is past."""
    set_meta(db, TASKS_DOWN, "{}")
