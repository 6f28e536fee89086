"""What acts: rules, profiles, the outbox runner and the scheduler, and their lifetimes.

`Runtime` loads and validates rules and profiles (refusing to start on any problem), builds the
reactor the processor calls inside its transaction, and holds what runs while the app runs: the
provider client, the outbox runner, the polls and catch-up, the daily provider-name check,
retention (of events and facts, and of personal data: `worker.service.retention`), SIGHUP
reload and the systemd watchdog. Each is started by a step of its own;
`worker.service.setup` calls the steps in the order of the stages. The leader's jobs live in
`worker.schedule.leaderjobs`, what the operator console asks in `worker.service.operations`, what
daily maintenance writes in `worker.service.maintenance`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections.abc import Callable, Coroutine, Mapping
from functools import partial
from typing import Any

from worker.act.outbox import Outbox
from worker.act.queue import enqueue_alert
from worker.act.reactor import RuleReactor
from worker.aio import finish_or_cancel
from worker.config.profiles import Profiles
from worker.config.settings import Settings
from worker.errors import ConfigError, ProviderError, StorageError
from worker.logs import get_logger
from worker.metrics import Metrics
from worker.notify.channels import Notifier, notifiers_from_settings, send_all
from worker.notify.message import build_alert
from worker.poll.poller import Observe, Poller
from worker.provider.client import ProviderClient
from worker.reconcile.metrics import MoneyMetrics
from worker.rules import RuleBook
from worker.schedule.catchup import CatchUp
from worker.schedule.deadlines import DeadlineJob
from worker.schedule.journal import JournalJob
from worker.schedule.leader import Leader
from worker.schedule.leaderjobs import STOP_GRACE_S, LeaderJobs, PollMetrics
from worker.schedule.money import MoneyJobs
from worker.schedule.polls import Scheduler
from worker.service.bundle import Bundle, load_bundle
from worker.service.maintenance import (
    DAY_S,
    UNKNOWN_PROVIDERS,
    alerted_unknown,
    prune,
    submissions_due,
)
from worker.service.operations import ConsoleOperations
from worker.service.reconfig import reread
from worker.service.retention import Retention
from worker.service.supervise import Supervisor, record_down
from worker.service.systemd import SystemdNotifier, watchdog_loop
from worker.service.wallets import wallet_problems
from worker.store.leases import default_instance_id
from worker.store.meta import set_meta
from worker.store.sqlitestore import Store

log = get_logger(__name__)


class Runtime(LeaderJobs, ConsoleOperations):
    """Rules, profiles and the actors around one app."""

    supervisor: Supervisor  # the leader's jobs know it as a `Keeper`

    def __init__(
        self,
        settings: Settings,
        *,
        notifiers: Mapping[str, Notifier] | None = None,
        outbox_backoff_s: float = 2.0,
        notify_retry: Mapping[str, Any] | None = None,
        client_retries: int = 3,
        poll_backoff_s: float = 1.0,
        bundle: Bundle | None = None,
    ) -> None:
        self.settings = settings
        # This serve among the instances sharing the database (claims, the scheduler's lease).
        self.instance = default_instance_id()
        # Loaded here unless `serve` has checked it already (ConfigError: serve refuses to start).
        self.bundle: Bundle = bundle if bundle is not None else load_bundle(settings)
        for warning in self.bundle.warnings:
            log.warning("config", warning=warning)
        # Built from `notify` (and rebuilt by a reload) unless given (tests, the demo).
        self._own_notifiers = notifiers is None
        self.notifiers = (
            dict(notifiers) if notifiers is not None else notifiers_from_settings(settings.notify)
        )
        self.reactor = RuleReactor(lambda: self.bundle.rules, lambda: self.bundle.profiles)
        self._outbox_backoff_s = outbox_backoff_s
        self._notify_retry = dict(notify_retry or {})
        self._client_retries = client_retries
        self._poll_backoff_s = poll_backoff_s
        self.outbox: Outbox | None = None
        self.scheduler: Scheduler | None = None
        self.poller: Poller | None = None
        self._reader: Poller | None = None  # a follower's on-demand detail reads
        self.catchup: CatchUp | None = None
        self.money: MoneyJobs | None = None
        self.deadlines: DeadlineJob | None = None
        self.journal: JournalJob | None = None
        self.leader: Leader | None = None
        self._money_gauges: MoneyMetrics | None = None
        self._jobs_args: tuple[Observe, list[Callable[[], None]]] | None = None
        self.client: ProviderClient | None = None
        self.store: Store | None = None
        self._metrics: Metrics | None = None
        self._poll_metrics: PollMetrics | None = None
        self.notifier = SystemdNotifier()
        self.supervisor = Supervisor()  # the app's own, given to `connect`
        self._tasks: list[asyncio.Task[Any]] = []
        # Small writes started from sync callbacks: held here so none is lost or outlives the store.
        self._side_writes: set[asyncio.Task[Any]] = set()
        self._stop = asyncio.Event()
        self._provider_check = asyncio.Lock()

    @property
    def rules(self) -> RuleBook:
        """The rule book in force."""
        return self.bundle.rules

    @property
    def profiles(self) -> Profiles:
        """The profiles in force."""
        return self.bundle.profiles

    async def scheduler_running(self) -> str | None:
        """Ready check: when polls are enabled, this instance follows the scheduler's leader or
        leads it with the scheduler running."""
        if not self.settings.scheduler.enabled:
            return None
        if self.leader is None:
            return "scheduler not running"
        if self.leader.leading and (self.scheduler is None or not self.scheduler.running):
            return "scheduler not running"
        return None

    def wake_outbox(self) -> None:
        """Have the outbox look for due rows now (one was queued outside it)."""
        if self.outbox is not None:
            self.outbox.wake()

    async def alert(self, condition: str, severity: str, detail: str) -> None:
        """Queue an alert that concerns no single deposit."""
        assert self.store is not None
        await self.store.write(
            lambda db: enqueue_alert(db, None, condition, severity, trigger="system", detail=detail)
        )
        if self.outbox is not None:
            self.outbox.wake()

    async def reload(self) -> bool:
        """Reload the configuration file's rules, profiles and notify channels (the paths and
        the files); a bad file keeps the old ones and alerts. A changed key that needs a
        restart is named in the log and the STATUS; the rest is reloaded. systemd hears
        RELOADING=1 first and READY=1 (with the outcome as STATUS=) once the new rules are in
        force or refused, so `systemctl reload` can wait for it."""
        self.notifier.reloading()
        try:
            settings, restart = reread(self.settings)
            bundle = load_bundle(settings)
        except ConfigError as exc:
            log.error("reload refused; keeping the rules in force", problems=len(exc.problems))
            for problem in exc.problems:
                log.error("reload problem", problem=problem)
            count = len(exc.problems)
            self.notifier.reloaded(f"{count} problem{'s' * (count != 1)}, old rules kept")
            await self.alert("reload_failed", "warning", "\n".join(exc.problems))
            return False
        except BaseException:
            self.notifier.reloaded("unexpected error, old rules kept")
            raise
        changed = bundle.profiles.file_hash != self.bundle.profiles.file_hash
        self.settings = settings
        self.bundle = bundle
        if self._own_notifiers:
            # In place: the outbox's alert sender holds this very mapping.
            fresh = notifiers_from_settings(settings.notify)
            self.notifiers.clear()
            self.notifiers.update(fresh)
        for warning in bundle.warnings:
            log.warning("config", warning=warning)
        log.info(
            "rules and profiles reloaded",
            ruleSets=len(bundle.rules.rulesets),
            channels=", ".join(sorted(self.notifiers)) or "none",
        )
        if restart:
            log.warning(
                "reload: changed keys need a restart to take effect; the rest was reloaded",
                needsRestart=", ".join(restart),
            )
        self.notifier.reloaded(restart=restart)
        if self.store is not None:
            queued = await self.store.write(partial(submissions_due, bundle=bundle))
            if changed or queued:
                log.info("submissions after reload", profilesChanged=changed, queued=queued)
            if queued and self.outbox is not None:
                self.outbox.wake()
        await self.check_providers()
        return True

    async def check_providers(self) -> None:
        """Alert when a profile names a provider the options endpoint no longer offers."""
        if self.client is None or not self.profiles.names():
            return
        try:
            names = await self.client.options()
        except ProviderError as exc:
            log.warning("provider list unavailable", error=str(exc))
            return
        unknown = sorted(self.profiles.check_providers(names))
        assert self.store is not None
        # Alert once per profile while its provider stays unknown (not at every daily check);
        # a provider offered again and later dropped again alerts again. The lock: the daily
        # check and a reload's check may overlap.
        async with self._provider_check:
            alerted = await self.store.read(alerted_unknown)
            for name in unknown:
                if name not in alerted:
                    await self.alert(
                        f"provider_unknown:{name}",
                        "warning",
                        f"profile {name}: its provider is no longer offered by the provider",
                    )
            if set(unknown) != alerted:
                await self.store.write(
                    lambda db: set_meta(db, UNKNOWN_PROVIDERS, json.dumps(unknown))
                )

    async def check_wallets(self) -> list[str]:
        """Warn (log) for each rule set or profile fallback naming a wallet the provider does not
        list (`worker.service.wallets`); the problems found."""
        if self.client is None:
            return []
        try:
            listed = await self.client.list_wallets()
        except ProviderError as exc:
            log.warning("wallet list unavailable; rules not checked against it", error=str(exc))
            return []
        problems, _ = wallet_problems(self.rules, self.profiles, listed)
        for problem in problems:
            log.warning("config", warning=problem)
        return problems

    async def _daily(self) -> None:
        assert self.store is not None
        while not self._stop.is_set():
            try:
                await self.check_providers()
                pruned = await self.store.write(
                    partial(prune, days=self.settings.storage.retention_days)
                )
            except StorageError as exc:
                # Tomorrow's run tries again; the task must not end with the error unseen.
                log.error("daily maintenance failed", error=str(exc))
            else:
                if any(pruned):
                    log.info("retention", prunedEvents=pruned[0], prunedFacts=pruned[1])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), DAY_S)

    def _outage_alert(self, since: str, seconds: float, error: str) -> None:
        """The database unavailable for `storage.outage_alert_s`: one alert through every
        channel, sent from here (the database that would queue it is what is missing)."""
        if not self.notifiers:
            return
        alert = build_alert(
            "database_unavailable",
            "critical",
            detail=f"unavailable since {since} ({seconds:.0f} s so far) on instance"
            f" {self.instance}: {error}",
        )
        self._hold(send_all(self.notifiers, alert), name="outage-alert")

    def _record_down(self, problems: list[str]) -> None:
        """The tasks down here, recorded for `status` (`worker.service.supervise`)."""

        async def record() -> None:
            assert self.store is not None
            try:
                await self.store.write(
                    partial(record_down, instance=self.instance, problems=problems)
                )
            except StorageError as exc:
                log.warning("tasks down not recorded for status", error=str(exc))

        if self.store is not None and self.store.is_open:
            self._hold(record(), name="record-down")

    def _hold(self, work: Coroutine[Any, Any, Any], name: str | None = None) -> None:
        """Run `work` from a sync callback; held until done (the loop keeps only a weak
        reference to a task) and awaited at shutdown."""
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._side_writes.add(task)
        task.add_done_callback(self._held_done)

    def _held_done(self, task: asyncio.Task[Any]) -> None:
        """A held task's error is logged (or counted in a database outage), never left for
        asyncio's "exception was never retrieved"."""
        self._side_writes.discard(task)
        if task.cancelled() or (exc := task.exception()) is None:
            return
        store = self.store
        if (
            isinstance(exc, StorageError)
            and store is not None
            and store.outage.note("writesFailed")
        ):
            return
        log.error("task failed", task=task.get_name(), error=f"{type(exc).__name__}: {exc}")

    # --- the steps `worker.service.setup` runs, in the order of the stages ---------------------

    def connect(
        self, store: Store, metrics: Metrics, supervisor: Supervisor | None = None
    ) -> ProviderClient:
        """The store, metrics and task supervisor the actors use, and the provider client (its
        calls counted)."""
        self.store = store
        self._metrics = metrics
        if supervisor is not None:
            self.supervisor = supervisor
        self.supervisor.on_change.append(self._record_down)
        self._stop = asyncio.Event()
        log.info("instance", instance=self.instance)
        self._poll_metrics = PollMetrics(metrics)
        store.outage.on_long.append(self._outage_alert)

        def on_call(endpoint: str, outcome: str) -> None:
            metrics.provider_calls.labels(endpoint=endpoint, outcome=outcome).inc()
            if self.catchup is not None:
                self.catchup.note_call(endpoint, outcome)

        def on_wait(endpoint: str, seconds: float) -> None:
            metrics.provider_budget_wait.labels(endpoint=endpoint).inc(seconds)

        self.client = ProviderClient.from_settings(
            self.settings.provider, retries=self._client_retries, on_call=on_call, on_wait=on_wait
        )
        if self.client.budget is not None:
            metrics.provider_backoff.set_function(self.client.budget.backoff_remaining)
        return self.client

    def build_outbox(self, observe: Observe) -> Outbox:
        """The outbox runner; what it learns from the provider goes back through `observe`."""
        assert self.store is not None and self.client is not None
        metrics = self._metrics
        assert metrics is not None

        def on_alert(channel: str, outcome: str) -> None:
            metrics.alerts_sent.labels(channel=channel, outcome=outcome).inc()

        def on_claim_lost(stage: str) -> None:
            metrics.claims_lost.labels(stage=stage).inc()

        self.outbox = Outbox(
            self.store,
            client=self.client,
            notifiers=self.notifiers,
            profiles=lambda: self.profiles,
            observe=observe,
            backoff_s=self._outbox_backoff_s,
            notify_retry=self._notify_retry,
            on_alert=on_alert,
            rules=lambda: self.rules,
            instance=self.instance,
            lease_s=self.settings.instance.lease_s,
            on_claim_lost=on_claim_lost,
        )
        return self.outbox

    async def start_outbox(self) -> None:
        """Queue the submissions the profiles call for; run the outbox, daily maintenance and
        the retention of personal data (when `retention.personal_data_days` is set)."""
        assert self.store is not None and self.outbox is not None
        await self.store.write(partial(submissions_due, bundle=self.bundle))
        outbox, stop, keep = self.outbox, self._stop, self.supervisor.keep
        self._tasks = [
            keep("outbox", lambda: outbox.run(stop)),
            keep("daily", self._daily),
            keep("wallets", self.check_wallets, once=True),
        ]
        days = self.settings.retention.personal_data_days
        if days is not None:  # unset: personal data is kept
            retention = Retention(self.store, days, self.instance)
            self._tasks.append(keep("retention", lambda: retention.run(stop)))

    def listen_for_reload(self) -> None:
        """SIGHUP reloads rules and profiles."""

        def on_hup() -> None:
            self._hold(self.reload(), name="reload")

        with contextlib.suppress(NotImplementedError, RuntimeError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, on_hup)

    def start_watchdog(self, alive: Callable[[], bool]) -> None:
        """Ping the systemd watchdog (if systemd runs one) while `alive()` holds."""
        if self.notifier.enabled:
            watchdog = watchdog_loop(self.notifier, self.notifier.watchdog_interval_s(), alive)
            self._tasks.append(asyncio.create_task(watchdog, name="watchdog"))

    async def stop(self) -> None:
        """Stop everything the steps started, within one grace period; close the client."""
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError):
            # Not removed: SIGHUP's default action would end the process in mid-stop.
            loop.add_signal_handler(signal.SIGHUP, _reload_ignored)
        # Within the unit's TimeoutStopSec (30 s, the ingress process's drain included): work
        # still waiting on the provider after the grace is cancelled. That is a crash at that
        # point, which the design survives: a running action is resumed after the restart with
        # the same Idempotency-Key, and a poll is read again. One grace for all of it: the
        # outbox stops taking rows at once while a poll in flight ends.
        deadline = loop.time() + STOP_GRACE_S
        self.supervisor.stopping()
        self._stop.set()
        for task in self._tasks:
            if task.get_name() == "watchdog":
                task.cancel()
        if self.client is not None and self.client.budget is not None:
            # A poll waiting for the request budget (behind the submissions' debt, or a
            # back-off) sends nothing until it gets a token: cancelled now, not after the grace.
            self.client.budget.stop_polls()
        await self._stop_jobs()
        left = max(0.0, deadline - loop.time())
        ended = await finish_or_cancel([*self._tasks, *self._side_writes], left)
        for result in ended:
            if isinstance(result, Exception):
                log.error("task ended with an error", error=f"{type(result).__name__}: {result}")
        if self.client is not None:
            await self.client.close()


def _reload_ignored() -> None:
    log.info("reload ignored: stopping")
