"""What acts: rules, profiles, the outbox runner and the scheduler, and their lifetimes.

`Runtime` loads and validates rules and profiles (refusing to start on any problem), builds the
reactor the processor calls inside its transaction, and holds what runs while the app runs: the
provider client, the outbox runner, the polls and catch-up, the daily provider-name check,
retention, SIGHUP reload and the systemd watchdog. Each is started by a step of its own;
`worker.service.setup` calls the steps in the order of the stages.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import signal
from collections.abc import Callable, Coroutine, Mapping
from functools import partial
from typing import Any

import sqlite_utils
from prometheus_client import Counter, Gauge

from worker.act.outbox import Outbox
from worker.act.reactor import RuleReactor
from worker.act.resubmit import resubmit_changed, submit_newly_covered
from worker.act.rows import enqueue_alert
from worker.aio import finish_or_cancel
from worker.clock import iso_from_ms, now_ms, utc_now
from worker.config.profiles import Profiles
from worker.config.settings import Settings
from worker.errors import ConfigError, ProviderError, StorageError
from worker.logs import get_logger
from worker.metrics import Metrics
from worker.notify.channels import Notifier, notifiers_from_settings
from worker.poll.catchup import Applied, HistoryReader, ReadStats
from worker.poll.catchupjobs import CatchUp
from worker.poll.leader import Leader, lease_time
from worker.poll.moneyjobs import MoneyJobs, MoneyMetrics, money_jobs
from worker.poll.reconcile import Reconciler
from worker.poll.scheduler import Observe, Poller, Scheduler
from worker.provider.client import ProviderClient
from worker.rules import RuleBook
from worker.service.bundle import Bundle, load_bundle
from worker.service.systemd import SystemdNotifier, watchdog_loop
from worker.store.events import delete_done_before
from worker.store.facts import delete_unchanged_before
from worker.store.leases import default_instance_id
from worker.store.meta import get_meta, set_meta
from worker.store.writer import Store

log = get_logger(__name__)

DAY_S = 86_400.0


def prune_events(db: sqlite_utils.Database, retention_days: int) -> int:
    """Delete processed/ignored events older than the retention; ledger, actions stay."""
    return delete_done_before(db, _cutoff(retention_days))


def prune_unchanged_facts(db: sqlite_utils.Database, retention_days: int) -> int:
    """Delete facts older than the retention that changed nothing (mostly polls repeating what
    was known: one per poll run per waiting deposit); the facts that moved a deposit stay."""
    return delete_unchanged_before(db, _cutoff(retention_days))


def _submissions_due(db: sqlite_utils.Database, bundle: Bundle) -> int:
    """Submissions a (re)loaded profiles file calls for: corrected profiles for rejected or
    refused deposits, and new ones for deposits that no profile covered until now."""
    return resubmit_changed(db, bundle.profiles) + submit_newly_covered(
        db, bundle.profiles, bundle.rules
    )


def _prune(db: sqlite_utils.Database, days: int) -> tuple[int, int]:
    return prune_events(db, days), prune_unchanged_facts(db, days)


def _cutoff(retention_days: int) -> str:
    return iso_from_ms(now_ms() - retention_days * int(DAY_S) * 1000)


class PollMetrics:
    """Poll figures on the app's registry."""

    def __init__(self, metrics: Metrics) -> None:
        self.last_success = Gauge(
            "depositd_poll_last_success_timestamp_seconds",
            "Unix time of the last successful poll.",
            ["poll"],
            registry=metrics.registry,
        )
        self.runs = Counter(
            "depositd_polls",
            "Poll runs by poll and outcome.",
            ["poll", "outcome"],
            registry=metrics.registry,
        )
        self.found = Counter(
            "depositd_deposits_found_by_poll",
            "Deposits first seen by a poll (no webhook announced them) since start.",
            registry=metrics.registry,
        )
        self.interval = Gauge(
            "depositd_poll_interval_seconds",
            "The configured interval of each poll (for alerts on polls overdue).",
            ["poll"],
            registry=metrics.registry,
        )
        self.leader = Gauge(
            "depositd_leader",
            "1 while this instance leads the scheduler (its polls and daily jobs run here).",
            ["instance"],
            registry=metrics.registry,
        )
        self._found_seen = 0

    def found_total(self, total: int) -> None:
        """Advance the found-by-poll counter to the poller's running total."""
        if total > self._found_seen:
            self.found.inc(total - self._found_seen)
            self._found_seen = total


# meta key: the profiles already alerted about because their provider is no longer offered.
_UNKNOWN_PROVIDERS = "providers_unknown_alerted"
STOP_GRACE_S = 5.0  # how long a stop waits for the outbox's action or a poll in flight


def _alerted_unknown(db: sqlite_utils.Database) -> set[str]:
    return set(json.loads(get_meta(db, _UNKNOWN_PROVIDERS) or "[]"))


class Runtime:
    """Rules, profiles and the actors around one app."""

    def __init__(
        self,
        settings: Settings,
        *,
        notifiers: Mapping[str, Notifier] | None = None,
        outbox_backoff_s: float = 2.0,
        notify_retry: Mapping[str, Any] | None = None,
        client_retries: int = 3,
        poll_backoff_s: float = 1.0,
    ) -> None:
        self.settings = settings
        # This serve among the instances sharing the database (claims, the scheduler's lease).
        self.instance = default_instance_id()
        self.bundle: Bundle = load_bundle(settings)  # ConfigError: serve refuses to start
        for warning in self.bundle.warnings:
            log.warning("config", warning=warning)
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
        self.leader: Leader | None = None
        self._money_gauges: MoneyMetrics | None = None
        self._jobs_args: tuple[Observe, list[Callable[[], None]]] | None = None
        self.client: ProviderClient | None = None
        self.store: Store | None = None
        self._metrics: Metrics | None = None
        self._poll_metrics: PollMetrics | None = None
        self.notifier = SystemdNotifier()
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

    async def alert(self, condition: str, severity: str, detail: str) -> None:
        """Queue an alert that concerns no single deposit."""
        assert self.store is not None
        await self.store.write(
            lambda db: enqueue_alert(db, None, condition, severity, trigger="system", detail=detail)
        )
        if self.outbox is not None:
            self.outbox.wake()

    async def reload(self) -> bool:
        """Reload rules and profiles; a bad file keeps the old ones and alerts. systemd hears
        RELOADING=1 first and READY=1 (with the outcome as STATUS=) once the new rules are in
        force or refused, so `systemctl reload` can wait for it."""
        self.notifier.reloading()
        try:
            bundle = load_bundle(self.settings)
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
        self.bundle = bundle
        log.info("rules and profiles reloaded", ruleSets=len(bundle.rules.rulesets))
        self.notifier.reloaded()
        if self.store is not None:
            queued = await self.store.write(partial(_submissions_due, bundle=bundle))
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
            alerted = await self.store.read(_alerted_unknown)
            for name in unknown:
                if name not in alerted:
                    await self.alert(
                        f"provider_unknown:{name}",
                        "warning",
                        f"profile {name}: its provider is no longer offered by the provider",
                    )
            if set(unknown) != alerted:
                await self.store.write(
                    lambda db: set_meta(db, _UNKNOWN_PROVIDERS, json.dumps(unknown))
                )

    async def _daily(self) -> None:
        assert self.store is not None
        while not self._stop.is_set():
            try:
                await self.check_providers()
                pruned = await self.store.write(
                    partial(_prune, days=self.settings.storage.retention_days)
                )
            except StorageError as exc:
                # Tomorrow's run tries again; the task must not end with the error unseen.
                log.error("daily maintenance failed", error=str(exc))
            else:
                if any(pruned):
                    log.info("retention", prunedEvents=pruned[0], prunedFacts=pruned[1])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), DAY_S)

    def _hold(self, work: Coroutine[Any, Any, Any], name: str | None = None) -> None:
        """Run `work` from a sync callback; held until done (the loop keeps only a weak
        reference to a task) and awaited at shutdown."""
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._side_writes.add(task)
        task.add_done_callback(self._side_writes.discard)

    def _catchup(
        self, store: Store, metrics: Metrics, after_commit: list[Callable[[], None]]
    ) -> CatchUp:
        """The catch-up jobs: full-history reads through the same tracker and reactor."""
        assert self.client is not None
        s = self.settings.scheduler

        def wake_all() -> None:
            for hook in list(after_commit):
                hook()

        def on_done(job: str, stats: ReadStats) -> None:
            outcome = "complete" if stats.complete else "incomplete"
            metrics.catchup_runs.labels(job=job, outcome=outcome).inc()
            if job == "catchup":
                metrics.catchup_last.set_to_current_time()
                metrics.catchup_found.set(stats.new_deposits)

        def on_applied(done: Applied) -> None:
            for _, transition in done.transitions:
                metrics.transitions.labels(trigger=transition.trigger.value).inc()

        reader = HistoryReader(
            self.client,
            store,
            lambda: self.reactor,
            page_size=s.page_size,
            max_pages=s.max_pages,
            after_commit=wake_all,
            on_applied=on_applied,
        )
        return CatchUp(reader, store, s, on_done=on_done)

    # --- the steps `worker.service.setup` runs, in the order of the stages ---------------------

    def connect(self, store: Store, metrics: Metrics) -> ProviderClient:
        """The store and metrics the actors use, and the provider client (its calls counted)."""
        self.store = store
        self._metrics = metrics
        self._stop = asyncio.Event()
        log.info("instance", instance=self.instance)
        self._poll_metrics = PollMetrics(metrics)

        def on_call(endpoint: str, outcome: str) -> None:
            metrics.provider_calls.labels(endpoint=endpoint, outcome=outcome).inc()
            if self.catchup is not None:
                self.catchup.note_call(endpoint, outcome)

        self.client = ProviderClient.from_settings(
            self.settings.provider, retries=self._client_retries, on_call=on_call
        )
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
        """Queue the submissions the profiles call for; run the outbox and daily maintenance."""
        assert self.store is not None and self.outbox is not None
        await self.store.write(partial(_submissions_due, bundle=self.bundle))
        self._tasks = [
            asyncio.create_task(self.outbox.run(self._stop), name="outbox"),
            asyncio.create_task(self._daily(), name="daily"),
        ]

    async def start_polls(
        self,
        observe: Observe,
        after_commit: list[Callable[[], None]],
        abnormal_hints: list[Callable[[], None]],
    ) -> None:
        """The scheduler's polls, the catch-up jobs and the money jobs (abnormal funds, daily
        reconciliation), when `scheduler.enabled`: on the instance that holds the scheduler's
        lease (`worker.poll.leader`), started and stopped as it gains and loses it."""
        settings = self.settings.scheduler
        if not settings.enabled:
            return
        assert self.store is not None and self._poll_metrics is not None
        poll_metrics = self._poll_metrics
        poll_metrics.interval.labels(poll="history").set(settings.history_interval_s)
        poll_metrics.interval.labels(poll="detail").set(settings.detail_interval_s)
        poll_metrics.interval.labels(poll="blocked").set(settings.blocked_interval_s)
        poll_metrics.leader.labels(instance=self.instance).set(0)
        self._money_metrics()  # on every instance: a follower shows them too
        self._jobs_args = (observe, after_commit)
        abnormal_hints.append(lambda: self.money.hint() if self.money is not None else None)
        intervals = [
            settings.history_interval_s,
            settings.detail_interval_s,
            settings.blocked_interval_s,
            settings.catchup_interval_s,
            settings.abnormal_interval_s,
        ]
        self.leader = Leader(
            self.store,
            self.instance,
            lease_time(self.settings.instance.lease_s, intervals),
            on_gain=self._start_jobs,
            on_loss=self._stop_jobs,
        )
        # The first try now: an instance alone on its database leads from its start on.
        await self.leader.tick()
        self._tasks.append(asyncio.create_task(self.leader.run(self._stop), name="leader"))

    async def _start_jobs(self) -> None:
        """This instance leads: build and start the polls, catch-up and money jobs."""
        assert self.store is not None and self.client is not None and self.outbox is not None
        assert self._metrics is not None and self._poll_metrics is not None
        assert self._jobs_args is not None
        observe, after_commit = self._jobs_args
        settings = self.settings.scheduler
        store, poll_metrics = self.store, self._poll_metrics

        def on_poll(name: str, outcome: str) -> None:
            poll_metrics.runs.labels(poll=name, outcome=outcome).inc()
            if outcome == "ok":
                poll_metrics.last_success.labels(poll=name).set_to_current_time()
                assert self.poller is not None
                poll_metrics.found_total(self.poller.stats.found_by_poll)
                self._hold(store.write(lambda db: set_meta(db, f"last_{name}_poll_ok", utc_now())))

        self.poller = Poller(
            self.client,
            store,
            observe,
            settings,
            alert=self.alert,
            on_poll=on_poll,
            backoff_s=self._poll_backoff_s,
        )
        self.scheduler = Scheduler(self.poller, settings)
        self.scheduler.start()
        self.catchup = self._catchup(store, self._metrics, after_commit)
        self.catchup.start()
        self.money = money_jobs(
            self.client,
            store,
            lambda: self.rules,
            settings,
            self._money_metrics(),
            wake=self.outbox.wake,
            alert=self.alert,
            backoff_s=self._poll_backoff_s,
        )
        self.money.start()
        poll_metrics.leader.labels(instance=self.instance).set(1)

    def _money_metrics(self) -> MoneyMetrics:
        """The money jobs' metrics, registered once."""
        if self._money_gauges is None:
            assert self._metrics is not None
            self._money_gauges = MoneyMetrics(self._metrics.registry)
        return self._money_gauges

    async def _stop_jobs(self) -> None:
        """This instance no longer leads (or stops): stop the jobs, cancelling a run in flight
        at once unless the service is stopping (then within the stop's grace)."""
        grace = STOP_GRACE_S if self._stop.is_set() else 0.0
        scheduler, self.scheduler = self.scheduler, None
        catchup, self.catchup = self.catchup, None
        money, self.money = self.money, None
        if self._poll_metrics is not None:
            self._poll_metrics.leader.labels(instance=self.instance).set(0)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        if scheduler is not None:
            await scheduler.stop(grace_s=grace)
        if catchup is not None:
            await catchup.stop(grace_s=max(0.0, deadline - loop.time()))
        if money is not None:
            await money.stop(grace_s=max(0.0, deadline - loop.time()))

    # --- what the operator console asks for (worker.console.app.Operations) ---

    async def read_detail(self, transaction_id: str) -> bool:
        """Read one deposit's detail now and feed it to the tracker, as the detail poll does;
        False when it failed (the log says why)."""
        return await self._detail_reader().read_detail(transaction_id)

    def _detail_reader(self) -> Poller:
        """The leader's poller; on a follower a poller of its own that only reads details on
        demand (never scheduled): a read and a fact through the store, safe on any instance."""
        if not self.settings.scheduler.enabled:
            raise ProviderError("the provider is not polled here (scheduler.enabled: false)")
        if self.poller is not None:
            return self.poller
        if self._jobs_args is None or self.client is None or self.store is None:
            raise ProviderError("the service is still starting; try again in a moment")
        if self._reader is None:
            self._reader = Poller(
                self.client,
                self.store,
                self._jobs_args[0],
                self.settings.scheduler,
                alert=self.alert,
                backoff_s=self._poll_backoff_s,
            )
        return self._reader

    async def reconcile(self, day: dt.date) -> str:
        """Reconcile one day again now, as `depositd reconcile --date` does; the outcome."""
        assert self.client is not None and self.store is not None
        wake = self.outbox.wake if self.outbox is not None else None
        reconciler = Reconciler(self.client, self.store, lambda: self.rules, after_commit=wake)
        result = await reconciler.run(day)
        if result.outcome == "failed":
            return f"failed: {result.error}"
        return f"{result.outcome} ({len(result.findings)} finding(s))"

    async def travel_rule_link(self, wallet_id: int, transaction_id: str, lng: str) -> str:
        """A fresh URL of the provider's hosted Travel Rule page, deep-linked to one deposit."""
        if self.client is None:
            raise ProviderError("the provider client is not running")
        link = await self.client.travel_rule_link(wallet_id, transaction_id=transaction_id, lng=lng)
        return link.url

    def wake(self) -> None:
        """Rows set back to pending: run them now rather than at the next sweep."""
        if self.outbox is not None:
            self.outbox.wake()

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
            loop.remove_signal_handler(signal.SIGHUP)
        # Within the unit's TimeoutStopSec (30 s, the ingress process's drain included): work
        # still waiting on the provider after the grace is cancelled. That is a crash at that
        # point, which the design survives: a running action is resumed after the restart with
        # the same Idempotency-Key, and a poll is read again. One grace for all of it: the
        # outbox stops taking rows at once while a poll in flight ends.
        deadline = loop.time() + STOP_GRACE_S
        self._stop.set()
        for task in self._tasks:
            if task.get_name() == "watchdog":
                task.cancel()
        await self._stop_jobs()
        left = max(0.0, deadline - loop.time())
        ended = await finish_or_cancel([*self._tasks, *self._side_writes], left)
        for result in ended:
            if isinstance(result, Exception):
                log.error("task ended with an error", error=f"{type(result).__name__}: {result}")
        if self.client is not None:
            await self.client.close()
