"""`depositd serve`: hold the database and the port, run the app until SIGTERM/SIGINT.

The app itself (every stage, in order) is built by `worker.service.setup`. Here: the lock, the
listening socket, the webhook listener (in this process or an ingress process of its own), the
operational endpoints, systemd notifications and the graceful stop.

The ingress process is started as soon as the ports and the database's lock are held, before
this process imports its stages: the two import side by side. READY comes once the rules,
profiles and store are checked, before the stages are imported: the webhook's socket listens
from the start and queues what arrives until it is answered
(docs/operations.md, "Start-up time"). So the stages are imported in `serve`, not at the top
of this module.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shlex
import signal
import socket
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from worker.aio import first_done
from worker.config.settings import Settings, load_settings
from worker.errors import InstanceRunning, ListenError
from worker.ingest import spawn as front
from worker.logs import configure, get_logger
from worker.service.listeners import Listeners, bound
from worker.service.systemd import SystemdNotifier
from worker.store.servelock import serve_lock

if TYPE_CHECKING:
    from aiohttp import web

    from worker.service.bundle import Bundle
    from worker.service.supervise import Supervisor
    from worker.store.sqlitestore import Store

log = get_logger(__name__)


@dataclass
class _Started:
    """The ingress process started early, and this process's end of its link."""

    proc: asyncio.subprocess.Process
    ours: socket.socket


async def serve(settings: Settings, app: web.Application | None = None) -> int:
    """Run until SIGTERM/SIGINT, then stop accepting, finish in-flight work; the exit status."""
    notifier = SystemdNotifier()
    _step("settings read")
    # From the start on: SIGTERM/SIGINT ask for a stop, made once serving (a stop asked during
    # the start is a clean one); a SIGHUP (reload) is kept and delivered again once the rules
    # can be reloaded (`Runtime.listen_for_reload` replaces this handler). READY comes before
    # the stages start, so `systemctl stop` or `reload` may come at any point of the start.
    loop = asyncio.get_running_loop()
    asked = _Asked(asyncio.Event(), asyncio.Event())
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, asked.stop.set)
    loop.add_signal_handler(signal.SIGHUP, asked.reload.set)
    try:
        return await _serve_held(settings, app, notifier, asked)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)


@dataclass
class _Asked:
    """What the signals received asked for."""

    stop: asyncio.Event
    reload: asyncio.Event


async def _serve_held(
    settings: Settings, app: web.Application | None, notifier: SystemdNotifier, asked: _Asked
) -> int:
    """`serve` from the ports and the database's lock on."""
    async with contextlib.AsyncExitStack() as held:
        # Before anything runs: every listening port (webhook, operational endpoints,
        # console), so that a port taken stops serve before it acts (`ListenError`, exit 2),
        # then the database's serve lock, shared with the other instances (the first one in
        # releases the claims of instances gone). SQLite: a lock on a file next to the
        # database; PostgreSQL: an advisory lock held by a session of its own.
        listeners = await held.enter_async_context(bound(settings))
        if settings.storage.path is not None:
            sole = held.enter_context(
                serve_lock(
                    settings.storage.path,
                    alone=not settings.storage.several_instances,
                    listening=_listening(settings),
                )
            )
        else:
            from worker.store.pgstore import serve_lock as pg_serve_lock

            sole = held.enter_context(pg_serve_lock(settings.storage))
        _step("ports and database lock held")
        started: _Started | None = None
        if settings.webhook.ingress_process:
            started = await held.enter_async_context(_ingress_started(settings, listeners))
            _step("ingress process started")
        bundle = store = None
        if app is None:
            # What can refuse the start, checked before READY while the ingress process
            # imports: the rules and profiles, and the store (opened, migrated). The webhook's
            # socket queues deliveries until they are answered, so READY need not wait for
            # the stages (docs/operations.md, "Start-up time").
            bundle, store = await _checked(settings, sole)
            held.push_async_callback(store.close)  # a no-op once the app's cleanup closed it
            _step("rules, profiles and store checked: READY")
            notifier.ready("starting: deliveries queue until serving")
        # The stages, imported while the ingress process imports its own.
        from aiohttp import web

        from worker.service.keys import OTHERS_KEY, SOLE_KEY
        from worker.service.runtime import Runtime
        from worker.service.setup import build_service

        _step("stages imported")
        if app is None:
            app, _ = build_service(settings, Runtime(settings, bundle=bundle), store=store)
            _step("stages built")
        app[SOLE_KEY] = sole
        app[OTHERS_KEY] = not sole
        runner = web.AppRunner(
            app,
            handle_signals=False,
            access_log=None,
            shutdown_timeout=20.0,
            keepalive_timeout=settings.webhook.idle_timeout_s,
        )
        ready = store is not None
        return await _serve(settings, app, runner, listeners, notifier, started, ready, asked)


async def _checked(settings: Settings, sole: bool) -> tuple[Bundle, Store]:
    """The rules and profiles (`ConfigError` lists their problems) and the store, opened and
    migrated (`StorageError`, or a schema refused beside instances already serving)."""
    from worker.service.bundle import load_bundle
    from worker.store.engines import store_for

    bundle = load_bundle(settings)
    store = store_for(settings.storage)
    await store.open(others_serving=not sole)
    return bundle, store


def _step(step: str) -> None:
    """One step of the start-up, at debug: with timestamps, the parts of the start-up time
    (docs/operations.md, "Start-up time"; `bench/startup.py` reads them)."""
    log.debug("start-up step", step=step)


def _listening(settings: Settings) -> str:
    """This instance's listening settings, as a second instance's refusal names them."""
    named = [("webhook.listen", settings.webhook.listen)]
    if settings.webhook.ops_listen is not None:
        named.append(("webhook.ops_listen", settings.webhook.ops_listen))
    if settings.console is not None:
        named.append(("console.listen", settings.console.listen))
    return ", ".join(f"{key} {value}" for key, value in named)


async def _serve(
    settings: Settings,
    app: web.Application,
    runner: web.AppRunner,
    listeners: Listeners,
    notifier: SystemdNotifier,
    started: _Started | None,
    ready_sent: bool,
    asked: _Asked,
) -> int:
    """`serve` once the ports and the database are held (and READY sent, if `ready_sent`)."""
    from worker.console.app import run_console
    from worker.ingest.limits import GuardedSite
    from worker.service.keys import CONSOLE_APP_KEY, LIMITS_KEY, SUPERVISOR_KEY

    listener = listeners.webhook
    await runner.setup()
    _step("store open and stages started")
    if asked.reload.is_set():  # a reload asked during the start: to the runtime's handler now
        os.kill(os.getpid(), signal.SIGHUP)
    stop = asked.stop
    status = 0
    try:
        async with contextlib.AsyncExitStack() as stack:
            ingress: asyncio.subprocess.Process | None = None
            if started is not None:
                ingress = await stack.enter_async_context(
                    _ingress_process(app, started, asked.stop)
                )
                _step("ingress process listening")
            else:
                await GuardedSite(runner, listener, app[LIMITS_KEY]).start()
            if listeners.ops is not None:
                await stack.enter_async_context(_ops_listener(settings, app, listeners.ops))
            if settings.console is not None and CONSOLE_APP_KEY in app:
                await stack.enter_async_context(
                    run_console(
                        app[CONSOLE_APP_KEY],
                        settings.console.host,
                        settings.console.port,
                        sock=listeners.console,
                    )
                )
            log.info("serving", listen=settings.webhook.listen, path=settings.webhook.path)
            if ready_sent:
                notifier.status(f"serving on {settings.webhook.listen}")
            else:  # an app given (tests): READY once it answers
                notifier.ready(f"serving on {settings.webhook.listen}")
            # Until a signal, the exit of the ingress process, or a task given up
            # (`worker.service.supervise`): serving on without it would answer 200 while
            # nothing acts on what is stored.
            supervisor = app[SUPERVISOR_KEY]
            waits: list[Awaitable[Any]] = [stop.wait(), supervisor.failed.wait()]
            if ingress is not None:
                waits.append(ingress.wait())
            await first_done(*waits)
            if not stop.is_set():
                status = _unasked_stop(supervisor, ingress, notifier)
            log.info("shutting down")
            notifier.stopping()
    finally:
        # Closes the listener (if here) and waits for in-flight requests, then the cleanup
        # contexts: processor (current batch), the acting stages, store (commit in
        # flight). A second SIGTERM meanwhile changes nothing.
        await runner.cleanup()
    log.info("stopped")
    return status


def _unasked_stop(
    supervisor: Supervisor,
    ingress: asyncio.subprocess.Process | None,
    notifier: SystemdNotifier,
) -> int:
    """The exit status of a stop no signal asked for: a task given up, or the ingress process
    gone (0 when it stopped on a SIGTERM of its own)."""
    if supervisor.failed.is_set():
        log.error("a task of the service failed; stopping", task=supervisor.failure)
        notifier.status(f"stopping: task {supervisor.failure} failed")
        return 1
    assert ingress is not None
    if ingress.returncode == 0:
        log.info("ingress process stopped")  # it had SIGTERM first: stop as well
        return 0
    log.error("ingress process exited", status=ingress.returncode)
    return 1


_OPS_CONNECTIONS = 64


@contextlib.asynccontextmanager
async def _ops_listener(
    settings: Settings, app: web.Application, sock: socket.socket
) -> AsyncIterator[None]:
    """/metrics, /readyz and /healthz on `webhook.ops_listen` (bound already), answered by this
    process."""
    from aiohttp import web

    from worker.ingest.limits import GuardedSite, Limits, track_requests
    from worker.service.keys import INGRESS_KEY

    limits = Limits(_OPS_CONNECTIONS, settings.webhook.head_timeout_s)
    ops = web.Application(middlewares=[track_requests(limits)])
    app[INGRESS_KEY].add_ops_routes(ops)
    ops.router.add_get("/healthz", app[INGRESS_KEY].healthz)
    runner = web.AppRunner(ops, handle_signals=False, access_log=None, keepalive_timeout=15.0)
    await runner.setup()
    try:
        await GuardedSite(runner, sock, limits).start()
        log.info("operational endpoints", listen=settings.webhook.ops_listen)
        yield
    finally:
        await runner.cleanup()


_INGRESS_START_S = 30.0
_INGRESS_STOP_S = 25.0  # its own shutdown allows requests 20 s; the unit allows 30 s in all


@contextlib.asynccontextmanager
async def _ingress_started(settings: Settings, listeners: Listeners) -> AsyncIterator[_Started]:
    """Start the ingress process (`worker.ingest.process`) on the webhook listener, which it
    takes over (this process's copy is closed). If `serve` does not get as far as linking it
    (`_ingress_process`), it is stopped on the way out."""
    assert settings.config_path is not None
    ours, theirs = socket.socketpair()
    try:
        proc = await front.spawn(settings.config_path, listeners.webhook, theirs)
    except BaseException:
        ours.close()
        raise
    finally:
        listeners.webhook.close()  # the ingress process has its own copy
        theirs.close()
    try:
        yield _Started(proc, ours)
    finally:
        # Not linked (serve failed to start): with its link closed the ingress process leaves at
        # once instead of waiting on the requests it holds (they get no answer and are sent
        # again). Linked, it has stopped already (`_ingress_process`).
        ours.close()
        await _stop(proc)


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """Stop the ingress process unless it has stopped: SIGTERM (it stops accepting and answers
    the requests in flight), killed if it has not exited within `_INGRESS_STOP_S`."""
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), _INGRESS_STOP_S)
    except TimeoutError:
        log.error("ingress process did not stop; killed")
        proc.kill()
        await proc.wait()


@contextlib.asynccontextmanager
async def _ingress_process(
    app: web.Application, started: _Started, stop: asyncio.Event
) -> AsyncIterator[asyncio.subprocess.Process]:
    """The webhook listener in a process of its own (`worker.ingest.process`), linked to this store.

    Yields once it listens. On exit it is asked to stop (SIGTERM: stop accepting, answer the
    requests in flight, whose rows this process commits) and waited for.
    """
    from worker.ingest.link import CoreSide
    from worker.service.keys import INGRESS_KEY, LIVENESS_KEY, SUPERVISOR_KEY

    loop = asyncio.get_running_loop()
    up = asyncio.Event()
    proc = started.proc
    _, link = await loop.create_unix_connection(
        lambda: CoreSide(app[INGRESS_KEY], up.set), sock=started.ours
    )
    pinger: asyncio.Future[None] | None = None
    try:
        await first_done(up.wait(), proc.wait(), stop.wait(), at_most_s=_INGRESS_START_S)
        if not up.is_set() and not stop.is_set():
            raise OSError(f"the ingress process did not start (exit status {proc.returncode})")
        # A stop asked meanwhile (systemd signals both processes: the ingress process may have
        # ended before it listened) is a clean one: made at once, nothing was answered yet.
        # The watchdog (if systemd runs one) acts when the ingress process stops answering:
        # pinged every quarter of the interval, it is hung once silent for half of it, which the
        # watchdog loop (checking every quarter) reports within the interval. Once stopping, the
        # pings end and the ingress process drains: that is not a hang.
        interval = SystemdNotifier().watchdog_interval_s()
        if interval is not None:
            every, within = interval / 4, interval / 2
            # Restarted after an error, like the other tasks: a pinger that ended with one
            # would leave the ingress process unwatched (its liveness read as fine).
            pinging = app[SUPERVISOR_KEY].keep(
                "ingress link", lambda: link.keep_pinging(every), once=True
            )
            pinger = pinging
            app[LIVENESS_KEY].append(lambda: pinging.done() or link.heard_within(within))
        yield proc
    finally:
        if pinger is not None:
            pinger.cancel()
        await _stop(proc)
        if link.transport is not None:
            link.transport.close()
        await link.closed


def run_serve(args: argparse.Namespace) -> int:
    """`depositd serve`: exit 0 after a graceful shutdown."""
    settings = load_settings(args.config)
    configure(settings.log.format, settings.log.level)
    try:
        return asyncio.run(serve(settings))
    except ListenError as exc:
        # A port taken: bad configuration for this host (exit 2), and nothing has run yet.
        # Most often another `serve` of this configuration holds it.
        log.error(
            "cannot listen",
            setting=exc.setting,
            listen=exc.address,
            error=exc.reason,
            hint="is another depositd serve running?"
            f" `depositd status --config {shlex.quote(str(settings.config_path))}`"
            " shows whether one holds this database",
        )
        return 2
    except InstanceRunning as exc:
        # Another instance on this SQLite file: nothing has run yet (exit 2, as a taken port).
        log.error("cannot serve", error=str(exc))
        return 2
    except OSError as exc:
        log.error("cannot serve", error=str(exc))
        return 1
