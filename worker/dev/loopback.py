"""The loopback servers a `worker.dev.harness.Stack` runs beside the worker: sockets on free
127.0.0.1 ports, the Slack endpoint and the SMTP inbox that receive the worker's alerts."""

from __future__ import annotations

import asyncio
import email
import email.policy
import socket
from collections.abc import Awaitable, Callable
from email.message import EmailMessage
from typing import Any

from aiohttp import web

SLACK_PATH = "/slack/alerts"
ALERT_FROM = "depositd@merchant.example"
ALERT_TO = "treasury@merchant.example"


def listener(port: int = 0) -> socket.socket:
    """A listening-ready socket on loopback (port 0: a free one, read back from the socket)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    return sock


def port_of(sock: socket.socket) -> int:
    """The port a socket is bound to."""
    port: int = sock.getsockname()[1]
    return port


def free_port() -> int:
    """A port free now (for servers that cannot be handed a socket)."""
    # aiosmtpd's Controller checks its port by connecting to it, so it cannot take port 0.
    with listener() as sock:
        return port_of(sock)


class _Inbox:
    """aiosmtpd handler keeping every message it accepts (runs in the Controller's thread)."""

    def __init__(self, messages: list[EmailMessage]) -> None:
        self.messages = messages

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        parsed = email.message_from_bytes(envelope.content, policy=email.policy.default)
        assert isinstance(parsed, EmailMessage)
        self.messages.append(parsed)
        return "250 OK"


async def start_slack(
    receive: Callable[[web.Request], Awaitable[web.Response]],
) -> tuple[web.AppRunner, str]:
    """Serve `receive` at `SLACK_PATH` on a free port: the runner and the endpoint's URL."""
    slack_app = web.Application()
    slack_app.router.add_post(SLACK_PATH, receive)
    sock = listener()
    url = f"http://127.0.0.1:{port_of(sock)}{SLACK_PATH}"
    runner = web.AppRunner(slack_app, handle_signals=False, access_log=None, shutdown_timeout=1.0)
    try:
        await runner.setup()
        await web.SockSite(runner, sock).start()
    except BaseException:
        sock.close()
        raise
    return runner, url


async def start_smtp(messages: list[EmailMessage]) -> tuple[Any, int]:
    """An SMTP server on a free port keeping what it accepts in `messages`: the aiosmtpd
    Controller (stop it with `controller.stop` in a thread) and its port."""
    from aiosmtpd.controller import Controller  # imported here: only the harness needs it

    port = free_port()
    controller = Controller(_Inbox(messages), hostname="127.0.0.1", port=port)
    await asyncio.to_thread(controller.start)
    return controller, port


def notify_config(slack_url: str, smtp_port: int) -> dict[str, Any]:
    """The `notify` section that sends the worker's alerts to these Slack and SMTP servers."""
    return {
        "slack": {"webhook_url": slack_url},
        "email": {
            "host": "127.0.0.1",
            "port": smtp_port,
            "starttls": False,
            "from": ALERT_FROM,
            "to": [ALERT_TO],
        },
    }
