"""Composition root: the service built from a validated `Settings`, one stage after another.

    store    the SQLite database (migrations), opened first and closed last
    ingest   the webhook endpoint and its limits: verified events into the inbox
    track    the processor: inbox -> tracker -> reactor, in one transaction per batch
    act      rules and profiles (the reactor), the provider client, the outbox runner
    poll     the scheduler's polls and the catch-up jobs
    service  SIGHUP reload and the systemd watchdog
    console  the operator console (`console.listen`), on the same store and runtime

Nothing else reads configuration globally. `build_app` is the core (store, ingest, track);
`build_service` adds the stages that act, from a `Runtime`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence

from aiohttp import web

from worker.clock import utc_now
from worker.config.settings import Settings
from worker.errors import StorageError
from worker.ingest.endpoint import Ingress, ReadyCheck
from worker.ingest.limits import Limits, track_requests
from worker.logs import get_logger
from worker.metrics import Metrics
from worker.service.keys import (
    CONSOLE_APP_KEY,
    INGRESS_KEY,
    LIMITS_KEY,
    LIVENESS_KEY,
    METRICS_KEY,
    OTHERS_KEY,
    PROCESSOR_KEY,
    READY_CHECKS_KEY,
    SETTINGS_KEY,
    SOLE_KEY,
    STORE_KEY,
    SUPERVISOR_KEY,
)
from worker.service.runtime import Runtime
from worker.service.supervise import Supervisor, SupervisorMetrics, record_gone
from worker.store import actions, alerts, leases
from worker.store.db import Db
from worker.store.engines import store_for
from worker.store.meta import set_meta
from worker.store.sqlitestore import Store
from worker.track.processor import Processor, Reactor
from worker.track.tracker import State

log = get_logger(__name__)

CleanupCtx = Callable[[web.Application], AsyncIterator[None]]


def build_service(
    settings: Settings,
    runtime: Runtime | None = None,
    *,
    sweep_interval_s: float = 1.0,
    store: Store | None = None,
) -> tuple[web.Application, Runtime]:
    """Every stage, in order: the app `serve` runs, and the runtime of what acts in it.

    `Runtime(settings)` raises `ConfigError` on bad rules or profiles: serve refuses to start.
    `store`: one `serve` has opened already (else the app opens its own).
    """
    runtime = runtime or Runtime(settings)
    app = build_app(
        settings,
        store=store,
        reactor=runtime.reactor,
        extra_cleanup_ctx=[_acting_ctx(runtime)],
        ready_checks=[runtime.scheduler_running],
        sweep_interval_s=sweep_interval_s,
    )
    app[INGRESS_KEY].secret_watch.wake = runtime.wake_outbox
    if settings.console is not None:
        # console: the operator's pages, on the same store and runtime (served by `serve`)
        processor = app[PROCESSOR_KEY]
        from worker.console.app import build_console

        app[CONSOLE_APP_KEY] = build_console(
            settings.console, app[STORE_KEY], runtime, processor.wake
        )
    return app, runtime


def build_app(
    settings: Settings,
    *,
    store: Store | None = None,
    reactor: Reactor | None = None,
    extra_cleanup_ctx: Sequence[CleanupCtx] = (),
    ready_checks: Sequence[ReadyCheck] = (),
    sweep_interval_s: float = 1.0,
) -> web.Application:
    """The core: store, ingest routes and processor, with the given reactor and contexts.

    Start-up order: store (migrations), `extra_cleanup_ctx` in order, processor; shutdown
    runs in reverse, so the store closes last.
    """
    limits = Limits(settings.webhook.max_connections, settings.webhook.head_timeout_s)
    app = web.Application(middlewares=[track_requests(limits)])
    metrics = Metrics(states=[state.value for state in State])
    store = store if store is not None else store_for(settings.storage)
    processor = Processor(
        store,
        reactor=reactor,
        metrics=metrics,
        sweep_interval_s=sweep_interval_s,
    )

    async def processor_running() -> str | None:
        return None if processor.running else "processor not running"

    # Every long-running task is watched: one down makes /healthz and /readyz say so, and one
    # given up stops `serve` (exit 1; its STOPPING=1 ends the watchdog's pings).
    supervisor = Supervisor(SupervisorMetrics(metrics.registry))
    checks: list[ReadyCheck] = [processor_running, supervisor.ready, *ready_checks]
    app[SETTINGS_KEY] = settings
    app[STORE_KEY] = store
    app[METRICS_KEY] = metrics
    app[PROCESSOR_KEY] = processor
    app[READY_CHECKS_KEY] = checks
    app[LIVENESS_KEY] = []
    app[SUPERVISOR_KEY] = supervisor
    app[LIMITS_KEY] = limits
    app[SOLE_KEY] = False
    app[OTHERS_KEY] = False
    ingress = Ingress(settings.webhook, store, metrics, wake=processor.wake, ready_checks=checks)
    ingress.health_checks.append(supervisor.problems)
    ingress.add_routes(app)
    app[INGRESS_KEY] = ingress
    app.cleanup_ctx.append(_store_ctx)
    app.cleanup_ctx.extend(extra_cleanup_ctx)
    app.cleanup_ctx.append(_processor_ctx)
    return app


def _acting_ctx(runtime: Runtime) -> CleanupCtx:
    """The stages that act, started once the store is open and stopped before it closes."""

    async def acting(app: web.Application) -> AsyncIterator[None]:
        store, processor, metrics = app[STORE_KEY], app[PROCESSOR_KEY], app[METRICS_KEY]
        # act: the provider client, then the outbox, woken by every commit that queues work
        runtime.connect(store, metrics, app[SUPERVISOR_KEY])
        outbox = runtime.build_outbox(processor.observe_fact)
        processor.after_commit.append(outbox.wake)
        await runtime.start_outbox()
        # poll: what webhooks missed, through the same entry point as the outbox's facts
        await runtime.start_polls(
            processor.observe_fact, processor.after_commit, processor.abnormal_hints
        )
        # service: SIGHUP reload, and the watchdog while every liveness check holds
        runtime.listen_for_reload()
        runtime.start_watchdog(lambda: all(check() for check in app[LIVENESS_KEY]))
        yield
        await runtime.stop()

    return acting


async def _store_ctx(app: web.Application) -> AsyncIterator[None]:
    store = app[STORE_KEY]
    # Beside instances already serving, a schema migration is refused: a rolling upgrade
    # across a schema change would run them on a schema they do not know. (`serve` opens it
    # before READY, `worker.service.serve`.)
    if not store.is_open:
        await store.open(others_serving=app[OTHERS_KEY])
    await store.write(lambda db: set_meta(db, "started_at", utc_now()))
    if app[SOLE_KEY]:
        released = await store.write(_forget_claims)
        if released:
            log.info("claims of stopped instances released", actions=released)
    try:
        promise = await store.durability()
    except StorageError as exc:  # said at the next start; serving does not depend on it
        promise = {"survives": f"not known now: {exc}"}
    # What a 200 promises, said at start (docs/postgresql.md, "What an acknowledgement survives").
    log.info(
        "store open",
        path=store.where,
        acknowledgedSurvives=promise.pop("survives"),
        **promise,
    )
    yield
    with contextlib.suppress(StorageError):  # the store may be what failed
        await store.write(lambda db: set_meta(db, "stopped_at", utc_now()))
    await store.close()
    log.info("store closed")


def _forget_claims(db: Db) -> int:
    """No other instance runs: the actions, alert sends and leases they held are free now, not
    once their leases lapse (a restart after a crash resumes at once)."""
    leases.clear_leases(db)
    record_gone(db)
    alerts.release_claims(db)
    return actions.release_claims(db)


async def _processor_ctx(app: web.Application) -> AsyncIterator[None]:
    processor, supervisor = app[PROCESSOR_KEY], app[SUPERVISOR_KEY]
    processor.start()
    # Its loop handles every error of a batch; were it to end all the same, nothing stored
    # would be processed: the service stops (exit 1) rather than answer 200 on.
    supervisor.watch("processor", processor.task)
    processor.wake()  # events left pending by a previous run
    yield
    supervisor.stopping()
    with contextlib.suppress(Exception):  # logged when it ended (`Supervisor.watch`)
        await processor.stop()
