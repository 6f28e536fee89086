"""The provider sandbox as the tests run it: its settings with the tests' credentials
(`sandbox_settings`), and a sandbox on loopback with a client of it and, when asked, a receiver of
its webhooks (`RunningSandbox`, started by the `start_sandbox` fixture)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.support.configs import HOOK_KEY, HOOK_SECRET, PROVIDER_KEY, PROVIDER_SECRET
from worker.dev.sandbox import SANDBOX_KEY, Sandbox, SandboxConfig, create_app
from worker.dev.sandbox.testing import WebhookRecorder
from worker.provider.client import ProviderClient

ServerFactory = Callable[[web.Application], Awaitable[TestServer]]  # the `aiohttp_server` fixture


def sandbox_settings(webhook_url: str | None = None, **settings: Any) -> SandboxConfig:
    """A sandbox that takes requests signed with PROVIDER_KEY and PROVIDER_SECRET and, given
    `webhook_url`, delivers webhooks there signed with HOOK_KEY and HOOK_SECRET; `settings` as
    `SandboxConfig` names them."""
    if webhook_url is not None:
        hooks = {"webhook_url": webhook_url, "webhook_api_key": HOOK_KEY}
        settings = {**hooks, "webhook_secret": HOOK_SECRET, **settings}
    return SandboxConfig(**{"api_key": PROVIDER_KEY, "api_secret": PROVIDER_SECRET, **settings})


@dataclass
class RunningSandbox:
    """A sandbox served on loopback; a client of it that does not retry; the receiver of its
    webhooks (None unless asked for); the clock it reads, epoch ms in a list that the test moves
    (None: the real clock)."""

    sandbox: Sandbox
    server: TestServer
    client: ProviderClient
    hooks: WebhookRecorder | None
    clock: list[int] | None

    @property
    def url(self) -> str:
        """The sandbox's base URL."""
        return str(self.server.make_url("")).rstrip("/")


StartSandbox = Callable[..., Awaitable[RunningSandbox]]  # the `start_sandbox` fixture


class SandboxStarter:
    """What the `start_sandbox` fixture hands out: `await start(**kw)` starts a sandbox (see
    `__call__`); `close()` closes every client at the test's end."""

    def __init__(self, aiohttp_server: ServerFactory) -> None:
        self._serve = aiohttp_server
        self._clients: list[ProviderClient] = []

    async def __call__(
        self,
        *,
        hooks: bool = False,
        hooks_query: str = "",
        clock: int | None = None,
        client_timeout_s: float = 10,
        **settings: Any,
    ) -> RunningSandbox:
        """A sandbox with `settings` (as `sandbox_settings` takes them); `hooks`: a
        `WebhookRecorder` on loopback, where its webhooks go unless `settings` say otherwise
        (at the recorder's path and `hooks_query`); `clock`: the sandbox reads the time from a
        list starting there."""
        recorder = None
        if hooks:
            recorder = WebhookRecorder(HOOK_KEY, HOOK_SECRET)
            receiver = await self._serve(recorder.app())
            settings.setdefault("webhook_url", str(receiver.make_url(recorder.path)) + hooks_query)
        now = None if clock is None else [clock]
        app = create_app(
            sandbox_settings(**settings), clock=None if now is None else (lambda: now[0])
        )
        server = await self._serve(app)
        client = ProviderClient(
            str(server.make_url("/")),
            PROVIDER_KEY,
            PROVIDER_SECRET,
            retries=0,
            timeout_s=client_timeout_s,
        )
        self._clients.append(client)
        return RunningSandbox(app[SANDBOX_KEY], server, client, recorder, now)

    async def close(self) -> None:
        """Close the clients of every sandbox started."""
        for client in self._clients:
            await client.close()
