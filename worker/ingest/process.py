"""The ingress process: `depositd serve`'s webhook listener, in a process of its own.

Reading, verifying and parsing deliveries and speaking HTTP take most of a core at full load;
so do storing and processing. `serve` therefore binds the listening socket, starts this process
with it (`python -m worker.ingest.process`), and keeps the store, the processor, the scheduler and
the
outbox. Here each accepted delivery goes to `serve` over `worker.ingest.link` and is answered 200
only once `serve` reports it committed. /healthz, /readyz and /metrics are asked of `serve`
(/healthz: whether its long-running tasks run).

This process exits when `serve` does (the link closes), and on SIGTERM stops accepting and
finishes the requests in flight first.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import sys
from pathlib import Path

from aiohttp import web

from worker.aio import first_done
from worker.config.settings import load_settings
from worker.ingest.endpoint import Gate, metrics_response, webhook_handler
from worker.ingest.limits import GuardedSite, Limits, not_found_log, track_requests
from worker.ingest.link import FrontSide
from worker.logs import configure, get_logger
from worker.metrics import wants_openmetrics

log = get_logger(__name__)

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Ask the kernel for SIGKILL when `serve` dies (Linux); the link's end is the fallback."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


async def run(config: Path, listen_fd: int, link_fd: int) -> int:
    """Serve the webhook until SIGTERM/SIGINT or until `serve` is gone."""
    settings = load_settings(config)
    configure(settings.log.format, settings.log.level)
    loop = asyncio.get_running_loop()
    link_sock = socket.socket(fileno=link_fd)
    _, link = await loop.create_unix_connection(FrontSide, sock=link_sock)

    async def readyz(request: web.Request) -> web.Response:
        status, body = await link.http("R")
        return web.Response(body=body, status=status, content_type="application/json")

    async def healthz(request: web.Request) -> web.Response:
        # This process answers, and `serve`'s tasks run (asked of it: a task down there is
        # the service failing, docs/operations.md).
        status, body = await link.http("H")
        return web.Response(body=body, status=status, content_type="application/json")

    async def metrics(request: web.Request) -> web.Response:
        om = wants_openmetrics(request.headers.get("Accept"))
        status, body = await link.http("O" if om else "M")
        if status != 200:  # the main process could not render them: say so, not 200
            return web.Response(body=body, status=status, content_type="application/json")
        return metrics_response(body, om)

    limits = Limits(settings.webhook.max_connections, settings.webhook.head_timeout_s)
    app = web.Application(middlewares=[track_requests(limits), not_found_log(link.refused)])
    gate = Gate(settings.webhook)
    app.router.add_post(
        settings.webhook.path, webhook_handler(gate, link.store, link.count, link.refused)
    )
    app.router.add_get("/healthz", healthz)
    if settings.webhook.ops_listen is None:  # else `serve` answers them on that listener
        app.router.add_get("/readyz", readyz)
        app.router.add_get("/metrics", metrics)
    # Within the unit's TimeoutStopSec=30, with `serve`'s own stop after this one.
    runner = web.AppRunner(
        app,
        handle_signals=False,
        access_log=None,
        shutdown_timeout=20.0,
        keepalive_timeout=settings.webhook.idle_timeout_s,
    )
    await runner.setup()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    listener = socket.socket(fileno=listen_fd)
    await GuardedSite(runner, listener, limits).start()
    link.send(("U",))
    await first_done(stop.wait(), link.closed)
    if link.closed.done():
        # Nothing can be stored any more: leave at once, the open requests get no answer.
        log.error("depositd is gone; ingress process exits")
        return 1
    # Stop accepting, answer the requests in flight (their rows are committed by `serve`).
    await runner.cleanup()
    if link.transport is not None:
        link.transport.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker.ingest.process")
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--listen-fd", type=int, required=True)
    parser.add_argument("--link-fd", type=int, required=True)
    parser.add_argument("--parent", type=int, required=True)
    args = parser.parse_args(argv)
    _die_with_parent()
    if os.getppid() != args.parent:  # `serve` died before we could ask to follow it
        return 1
    # A reload is `serve`'s business (systemd signals the main process only; a terminal's
    # process group gets it too).
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    return asyncio.run(run(args.config, args.listen_fd, args.link_fd))


if __name__ == "__main__":
    sys.exit(main())
