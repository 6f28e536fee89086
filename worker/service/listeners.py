"""Every listening socket of `serve`, bound before any stage that acts starts.

The webhook listener (`webhook.listen`), the operational endpoints (`webhook.ops_listen`) and
the console (`console.listen`) are bound first, all of them: a port that is taken stops `serve`
(exit 2, naming the setting and HOST:PORT) before the database is opened, the scheduler polls,
a deposit is booked or an alert is sent. Under systemd a restart loop on a taken port then acts
on nothing (docs/operator.md). Under socket activation the webhook's socket comes from systemd
(`worker.service.activation`).
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass

from worker.config.settings import Settings
from worker.errors import ListenError
from worker.ingest import spawn as front
from worker.service import activation


@dataclass
class Listeners:
    """The bound sockets: the webhook's always, the others when configured."""

    webhook: socket.socket
    ops: socket.socket | None = None
    console: socket.socket | None = None


async def _bind(setting: str, host: str, port: int) -> socket.socket:
    try:
        return await front.listen_socket(host, port)
    except OSError as exc:
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        raise ListenError(setting, shown, exc.strerror or str(exc)) from exc


@contextlib.asynccontextmanager
async def bound(settings: Settings) -> AsyncIterator[Listeners]:
    """Bind every listener `settings` names (`ListenError` for the first that cannot be), and
    close whichever are still open when the block ends."""
    async with contextlib.AsyncExitStack() as stack:
        # Handed over by systemd (deploy/depositd.socket), else bound here.
        webhook = activation.inherited(settings.webhook.host, settings.webhook.port)
        if webhook is None:
            webhook = await _bind("webhook.listen", settings.webhook.host, settings.webhook.port)
        stack.callback(webhook.close)
        found = Listeners(webhook)
        ops = settings.webhook.ops_address
        if ops is not None:
            found.ops = await _bind("webhook.ops_listen", *ops)
            stack.callback(found.ops.close)
        if settings.console is not None:
            console = settings.console
            found.console = await _bind("console.listen", console.host, console.port)
            stack.callback(found.console.close)
        yield found
