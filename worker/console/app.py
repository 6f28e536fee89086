"""The console application: routes, templates, static files, and what it needs from `serve`.

`build_console` takes the running service's store and an `Operations` (the runtime: detail
reads, reconciliation, the hosted-page link, waking the outbox); `run_console` serves it on
`console.listen` for as long as `serve` runs.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp_jinja2
import jinja2
from aiohttp import web

from worker.config.settings import ConsoleSettings
from worker.console import actions, export, pages
from worker.console.auth import guard, security_headers
from worker.console.queries import age, path_segment, utc
from worker.console.refused import refused_page
from worker.console.state import CONSOLE, Console, Operations
from worker.logs import get_logger
from worker.store.sqlitestore import Store

log = get_logger(__name__)

STATIC = Path(__file__).with_name("static")


def build_console(
    settings: ConsoleSettings,
    store: Store,
    ops: Operations,
    wake_processor: Callable[[], None],
) -> web.Application:
    """The console app on an open (or soon open) store."""
    console = Console(settings, store, ops, wake_processor)
    app = web.Application(
        middlewares=[
            guard(console.sessions, security_headers(console.hosted_origin), console.tokens),
            refused_page,
        ],
        client_max_size=64 * 1024,
    )
    app[CONSOLE] = console
    env = aiohttp_jinja2.setup(
        app,
        loader=jinja2.PackageLoader("worker.console", "templates"),
        autoescape=jinja2.select_autoescape(default=True, default_for_string=True),
        undefined=jinja2.StrictUndefined,
    )
    env.filters["utc"] = utc
    env.filters["age"] = age
    env.filters["seg"] = path_segment
    pages.add_routes(app)
    actions.add_routes(app)
    export.add_routes(app)
    app.router.add_static("/static/", STATIC, append_version=True)
    return app


@contextlib.asynccontextmanager
async def run_console(
    app: web.Application, host: str, port: int, *, sock: socket.socket | None = None
) -> AsyncIterator[None]:
    """Serve the console app on host:port (on `sock` when it is bound already) until the block
    ends."""
    runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=5.0)
    await runner.setup()
    try:
        site: web.BaseSite = (
            web.TCPSite(runner, host, port) if sock is None else web.SockSite(runner, sock)
        )
        await site.start()
        log.info("console", listen=f"{host}:{port}")
        yield
    finally:
        await runner.cleanup()
