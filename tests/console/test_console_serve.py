"""`depositd serve` with a console block serves the console on `console.listen`, beside the
webhook port, until it stops; the hosted page's link gets the deposit and darkMode."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import aiohttp

from tests.support.configs import serve_config, write_config
from tests.support.ports import free_port
from tests.support.processes import Processes
from worker.console.pages import deep_link


async def test_serve_serves_the_console_until_it_stops(
    tmp_path: Path, provider_url: str, processes: Processes
) -> None:
    """The console's login page answers on console.listen while serve runs; after SIGTERM the
    port is closed and serve exits 0."""
    port, console_port = free_port(), free_port()
    token = tmp_path / "console_token"
    token.write_text("a-console-token\n")
    token.chmod(0o600)
    cfg = serve_config(
        tmp_path / "depositd.db",
        provider_url,
        port,
        scheduler={"enabled": False},
        log=None,
        console={
            "listen": f"127.0.0.1:{console_port}",
            "token_file": "console_token",
            "hosted_url": f"{provider_url}/hosted",
        },
    )
    config = write_config(tmp_path, cfg)
    serve = processes.serve(config, port, tmp_path / "serve.log")
    async with serve, aiohttp.ClientSession() as session:
        # /healthz answers as soon as the webhook listener serves; the console opens right
        # after it, before serve says READY.
        for _ in range(100):
            try:
                async with session.get(f"http://127.0.0.1:{console_port}/") as answer:
                    text = await answer.text()
                break
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.05)
        assert answer.status == 200 and answer.url.path == "/login"
        assert "depositd console" in text
        assert await serve.signal(signal.SIGTERM) == 0
        try:
            async with session.get(f"http://127.0.0.1:{console_port}/login") as answer:
                raise AssertionError(f"still answering: {answer.status}")
        except aiohttp.ClientConnectionError:
            pass


def test_the_hosted_link_gets_the_deposit_and_dark_mode() -> None:
    """The link keeps its token and gains transactionId (deep link) and darkMode."""
    url = "https://hosted.example/en/deposit-travel-rule?token=t0k"
    assert deep_link(url, "T1", True) == (
        "https://hosted.example/en/deposit-travel-rule?token=t0k&transactionId=T1&darkMode=true"
    )
    assert deep_link(url, "T1", False).endswith("&darkMode=false")
