"""Composition root: builds the application from a validated `Settings`, and `depositd serve`.

Nothing else reads configuration globally. The pieces that come later (rules engine, outbox
runner, scheduler) plug in through `Plugins`: a reactor for the processor, cleanup contexts
(opened after the store, closed before it) and background coroutines.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from worker.aio import first_done
from worker.clock import utc_now
from worker.config.settings import Settings, load_settings
from worker.errors import StorageError
from worker.ingest import process as front
from worker.ingest.endpoint import Ingress, ReadyCheck, healthz
from worker.ingest.limits import GuardedSite, Limits, track_requests
from worker.ingest.link import CoreSide
from worker.logs import configure, get_logger
from worker.metrics import Metrics
from worker.service.lock import serve_lock
from worker.service.systemd import SystemdNotifier
from worker.store.meta import set_meta
from worker.store.writer import Store
from worker.track.processor import Processor, Reactor

log = get_logger(__name__)

CleanupCtx = Callable[[web.Application], AsyncIterator[None]]
Background = Callable[[web.Application], Coroutine[Any, Any, None]]

SETTINGS_KEY = web.AppKey("settings", Settings)
STORE_KEY = web.AppKey("store", Store)
METRICS_KEY = web.AppKey("metrics", Metrics)
PROCESSOR_KEY = web.AppKey("processor", Processor)
INGRESS_KEY = web.AppKey("ingress", Ingress)
READY_CHECKS_KEY: web.AppKey[list[ReadyCheck]] = web.AppKey("ready_checks")
LIMITS_KEY = web.AppKey("limits", Limits)
# Checks the systemd watchdog pings depend on besides the event loop (the ingress process).
LIVENESS_KEY: web.AppKey[list[Callable[[], bool]]] = web.AppKey("liveness")
BACKGROUND_TASKS_KEY: web.AppKey[list[asyncio.Task[None]]] = web.AppKey("background_tasks")


@dataclass
class Plugins:
    """What the rules engine, outbox runner and scheduler add to a running app."""

    reactor: Reactor | None = None
    cleanup_ctx: list[CleanupCtx] = field(default_factory=list)
    background: list[Background] = field(default_factory=list)
    ready_checks: list[ReadyCheck] = field(default_factory=list)


def plugins_for(settings: Settings) -> Plugins:
    """The plugins `serve` runs with.

    Extension point: build the RuleReactor (rules + profiles), the outbox runner's cleanup
    context and the scheduler (with its "scheduler running" ready check) here.
    """
    from worker.service.runtime import Runtime  # imports this module: import at call time

    return Runtime(settings).plugins()


async def _store_ctx(app: web.Application) -> AsyncIterator[None]:
    store = app[STORE_KEY]
    await store.open()
    await store.write(lambda db: set_meta(db, "started_at", utc_now()))
    log.info("store open", path=str(store.path), synchronous=store.synchronous)
    yield
    with contextlib.suppress(StorageError):  # the store may be what failed
        await store.write(lambda db: set_meta(db, "stopped_at", utc_now()))
    await store.close()
    log.info("store closed")


async def _processor_ctx(app: web.Application) -> AsyncIterator[None]:
    processor = app[PROCESSOR_KEY]
    processor.start()
    processor.wake()  # events left pending by a previous run
    yield
    await processor.stop()


def _background_ctx(jobs: Sequence[Background]) -> CleanupCtx:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        tasks = app[BACKGROUND_TASKS_KEY]
        for job in jobs:
            tasks.append(asyncio.create_task(job(app), name=getattr(job, "__name__", "job")))
        yield
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    return ctx


def build_app(
    settings: Settings,
    *,
    reactor: Reactor | None = None,
    extra_cleanup_ctx: Sequence[CleanupCtx] = (),
    background: Sequence[Background] = (),
    ready_checks: Sequence[ReadyCheck] = (),
    sweep_interval_s: float = 1.0,
) -> web.Application:
    """The aiohttp application: ingress routes, store, processor and the given plugins.

    Start-up order: store (migrations), `extra_cleanup_ctx` in order, processor, background
    jobs; shutdown runs in reverse, so the store closes last.
    """
    limits = Limits(settings.webhook.max_connections, settings.webhook.head_timeout_s)
    app = web.Application(middlewares=[track_requests(limits)])
    metrics = Metrics()
    store = Store(settings.storage.path, synchronous=settings.storage.synchronous)
    processor = Processor(
        store,
        reactor=reactor,
        metrics=metrics,
        sweep_interval_s=sweep_interval_s,
        future_tolerance_s=settings.webhook.tolerance_s,
    )

    async def processor_running() -> str | None:
        return None if processor.running else "processor not running"

    checks: list[ReadyCheck] = [processor_running, *ready_checks]
    app[SETTINGS_KEY] = settings
    app[STORE_KEY] = store
    app[METRICS_KEY] = metrics
    app[PROCESSOR_KEY] = processor
    app[READY_CHECKS_KEY] = checks
    app[BACKGROUND_TASKS_KEY] = []
    app[LIVENESS_KEY] = []
    app[LIMITS_KEY] = limits
    ingress = Ingress(settings.webhook, store, metrics, wake=processor.wake, ready_checks=checks)
    ingress.add_routes(app)
    app[INGRESS_KEY] = ingress
    app.cleanup_ctx.append(_store_ctx)
    app.cleanup_ctx.extend(extra_cleanup_ctx)
    app.cleanup_ctx.append(_processor_ctx)
    if background:
        app.cleanup_ctx.append(_background_ctx(background))
    return app


async def serve(settings: Settings, plugins: Plugins | None = None) -> int:
    """Run until SIGTERM/SIGINT, then stop accepting, finish in-flight work; the exit status."""
    plugins = plugins or plugins_for(settings)
    app = build_app(
        settings,
        reactor=plugins.reactor,
        extra_cleanup_ctx=plugins.cleanup_ctx,
        background=plugins.background,
        ready_checks=plugins.ready_checks,
    )
    notifier = SystemdNotifier()
    runner = web.AppRunner(
        app,
        handle_signals=False,
        access_log=None,
        shutdown_timeout=20.0,
        keepalive_timeout=settings.webhook.idle_timeout_s,
    )
    with contextlib.ExitStack() as held:
        # Before anything runs: a second serve on this database or this port leaves at once,
        # having started no processor, outbox or scheduler beside the first.
        held.enter_context(serve_lock(settings.storage.path))
        listener = held.enter_context(
            await front.listen_socket(settings.webhook.host, settings.webhook.port)
        )
        return await _serve(settings, app, runner, listener, notifier)


async def _serve(
    settings: Settings,
    app: web.Application,
    runner: web.AppRunner,
    listener: socket.socket,
    notifier: SystemdNotifier,
) -> int:
    """`serve` once the database and the port are held."""
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    status = 0
    try:
        async with contextlib.AsyncExitStack() as stack:
            ingress: asyncio.subprocess.Process | None = None
            if settings.webhook.ingress_process:
                ingress = await stack.enter_async_context(_ingress_process(settings, app, listener))
            else:
                await GuardedSite(runner, listener, app[LIMITS_KEY]).start()
            if settings.webhook.ops_listen is not None:
                await stack.enter_async_context(_ops_listener(settings, app))
            log.info("serving", listen=settings.webhook.listen, path=settings.webhook.path)
            notifier.ready()
            if ingress is None:
                await stop.wait()
            else:
                await first_done(stop.wait(), ingress.wait())
                if not stop.is_set() and ingress.returncode == 0:
                    log.info("ingress process stopped")  # it had SIGTERM first: stop as well
                elif not stop.is_set():
                    log.error("ingress process exited", status=ingress.returncode)
                    status = 1
            log.info("shutting down")
            notifier.stopping()
    finally:
        # Closes the listener (if here) and waits for in-flight requests, then the cleanup
        # contexts: background jobs, processor (current batch), plugins, store (commit in
        # flight). A second SIGTERM meanwhile changes nothing.
        await runner.cleanup()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    log.info("stopped")
    return status


_OPS_CONNECTIONS = 64


@contextlib.asynccontextmanager
async def _ops_listener(settings: Settings, app: web.Application) -> AsyncIterator[None]:
    """/metrics, /readyz and /healthz on `webhook.ops_listen`, answered by this process."""
    address = settings.webhook.ops_address
    assert address is not None
    limits = Limits(_OPS_CONNECTIONS, settings.webhook.head_timeout_s)
    ops = web.Application(middlewares=[track_requests(limits)])
    app[INGRESS_KEY].add_ops_routes(ops)
    ops.router.add_get("/healthz", healthz)
    runner = web.AppRunner(ops, handle_signals=False, access_log=None, keepalive_timeout=15.0)
    await runner.setup()
    try:
        sock = await front.listen_socket(*address)
        await GuardedSite(runner, sock, limits).start()
        log.info("operational endpoints", listen=settings.webhook.ops_listen)
        yield
    finally:
        await runner.cleanup()


_INGRESS_START_S = 30.0
_INGRESS_STOP_S = 25.0  # its own shutdown allows requests 20 s; the unit allows 30 s in all


@contextlib.asynccontextmanager
async def _ingress_process(
    settings: Settings, app: web.Application, listener: socket.socket
) -> AsyncIterator[asyncio.subprocess.Process]:
    """The webhook listener in a process of its own (`worker.ingest.process`), linked to this store.

    Yields once it listens. On exit it is asked to stop (SIGTERM: stop accepting, answer the
    requests in flight, whose rows this process commits) and waited for.
    """
    assert settings.config_path is not None
    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair()
    up = asyncio.Event()
    link: CoreSide | None = None
    try:
        _, link = await loop.create_unix_connection(
            lambda: CoreSide(app[INGRESS_KEY], up.set), sock=ours
        )
        proc = await front.spawn(settings.config_path, listener, theirs)
    except BaseException:
        if link is not None and link.transport is not None:
            link.transport.close()
        ours.close()
        raise
    finally:
        listener.close()  # the ingress process has its own copy
        theirs.close()
    pinger: asyncio.Future[None] | None = None
    try:
        await first_done(up.wait(), proc.wait(), at_most_s=_INGRESS_START_S)
        if not up.is_set():
            raise OSError(f"the ingress process did not start (exit status {proc.returncode})")
        # The watchdog (if systemd runs one) also stops when the ingress process stops answering.
        interval = SystemdNotifier().watchdog_interval_s()
        if interval is not None:
            every, within = interval / 4, interval
            pinger = asyncio.ensure_future(link.keep_pinging(every))
            app[LIVENESS_KEY].append(lambda: link.heard_within(within))
        yield proc
    finally:
        if pinger is not None:
            pinger.cancel()
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), _INGRESS_STOP_S)
            except TimeoutError:
                log.error("ingress process did not stop; killed")
                proc.kill()
                await proc.wait()
        if link.transport is not None:
            link.transport.close()
        await link.closed


def run_serve(args: argparse.Namespace) -> int:
    """`depositd serve`: exit 0 after a graceful shutdown."""
    settings = load_settings(args.config)
    configure(settings.log.format, settings.log.level)
    try:
        return asyncio.run(serve(settings))
    except OSError as exc:
        log.error("cannot serve", listen=settings.webhook.listen, error=str(exc))
        return 1
