"""SIGHUP reloads what `depositd.yaml` says of rules, profiles and notify (paths and files); a
changed key that needs a restart is named in the log and the reload's STATUS, and the rest
still reloads."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.support.ports import free_port
from tests.support.processes import Processes
from tests.support.service import Service
from tests.support.waits import until
from tests.support.webhooks import envelope

ServerFactory = Callable[[web.Application], Awaitable[TestServer]]

NEW_RULES = """\
wallet: "*"
rules:
  - name: new rule set in force
    "on": [needs_details]
    then:
      - alert: {severity: warning, message: from the reloaded rules path}
"""


async def _slack(aiohttp_server: ServerFactory) -> tuple[str, list[Any]]:
    received: list[Any] = []

    async def hook(request: web.Request) -> web.Response:
        received.append(await request.json())
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/slack", hook)
    server = await aiohttp_server(app)
    return str(server.make_url("/slack")), received


@pytest.fixture
def notify_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A stand-in for systemd's notify socket, named in NOTIFY_SOCKET for the serve started."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify.sock"))
    sock.setblocking(False)
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify.sock"))
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    yield sock
    sock.close()


async def _until(sock: socket.socket, prefix: str) -> str:
    loop = asyncio.get_running_loop()
    while True:
        message = (await asyncio.wait_for(loop.sock_recv(sock, 4096), 20)).decode()
        if message.startswith(prefix):
            return message


async def test_sighup_reloads_notify_and_paths_and_names_what_needs_a_restart(
    tmp_path: Path,
    provider_url: str,
    aiohttp_server: ServerFactory,
    notify_socket: socket.socket,
    processes: Processes,
) -> None:
    """The config file changed: another rules path, another Slack URL, another listen address.
    After SIGHUP the new rules alert on the new Slack URL (the old one hears nothing more);
    the listen address is named as needing a restart in the log and in STATUS, and the old
    address still serves."""
    old_url, old_posts = await _slack(aiohttp_server)
    new_url, new_posts = await _slack(aiohttp_server)
    service = processes.own(
        Service(tmp_path, provider_url, notify={"slack": {"webhook_url": old_url}})
    )
    await service.start()
    try:
        await _until(notify_socket, "READY=1")
        new_rules = tmp_path / "new-rules.yaml"
        new_rules.write_text(NEW_RULES)
        cfg = json.loads(service.config.read_text())
        cfg["rules"] = str(new_rules)
        cfg["notify"] = {"slack": {"webhook_url": new_url}}
        cfg["webhook"]["listen"] = f"127.0.0.1:{free_port()}"
        service.config.write_text(json.dumps(cfg))
        service.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        await _until(notify_socket, "RELOADING=1")
        done = await _until(notify_socket, "READY=1")
        assert done == (
            "READY=1\nSTATUS=rules and profiles reloaded; needs a restart: webhook.listen"
        )
        log = [json.loads(line) for line in service.log.read_text().splitlines()]
        restart = [line for line in log if line.get("needsRestart")]
        assert [(r["level"], r["needsRestart"]) for r in restart] == [("warning", "webhook.listen")]

        assert await service.post(envelope("ev-r1", "DEPOSIT_WHITELIST_REQUIRED", "tx-r1")) == 200
        await until(lambda: new_posts, "the alert on the new Slack URL")
        assert "from the reloaded rules path" in json.dumps(new_posts)
        assert old_posts == []
        assert [r for _, r, _, _ in service.actions("tx-r1")] == ["new rule set in force"]
        assert await service.stop() == 0
    finally:
        await service.kill()
