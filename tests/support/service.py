"""`python -m worker serve` in a subprocess with a configuration of its own (a SQLite file
under its folder, or the `storage` given), and signed webhooks posted to it."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import aiohttp

from tests.support.configs import HOOK_KEY, HOOK_PATH, HOOK_SECRET, serve_config, write_config
from tests.support.ports import free_port
from tests.support.processes import ServeProcess
from tests.support.stores import rows
from worker.provider.jsonio import dumpb
from worker.provider.signing import signed_headers


class Service(ServeProcess):
    """`serve` on a free loopback port for the provider at `provider_url`, no scheduler;
    `extra`: more configuration sections (as `serve_config` takes them)."""

    def __init__(
        self,
        tmp_path: Path,
        provider_url: str,
        storage: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        port = free_port()
        self.db: Path | str = tmp_path / "depositd.db"
        if storage and "url" in storage:
            self.db = storage["url"]
        cfg = serve_config(
            storage or tmp_path / "depositd.db",
            provider_url,
            port,
            **{"webhook": {"path": HOOK_PATH}, "scheduler": {"enabled": False}, **extra},
        )
        super().__init__(
            write_config(tmp_path / "depositd.yaml", cfg), port, tmp_path / "serve.log"
        )
        self.url = f"http://127.0.0.1:{port}"

    @property
    def pid(self) -> int:
        """The serve process id."""
        assert self.proc is not None
        return self.proc.pid

    async def start(self, timeout_s: float = 15) -> None:
        """Start serve and wait until /healthz answers."""
        await super().start(timeout_s)

    async def healthy(self) -> bool:
        """True when /healthz answers 200."""
        async with aiohttp.ClientSession() as session, session.get(f"{self.url}/healthz") as r:
            return r.status == 200

    async def post(
        self, event: dict[str, Any], session: aiohttp.ClientSession | None = None
    ) -> int:
        """POST one signed webhook; the HTTP status."""
        body = dumpb(event)
        headers = signed_headers(HOOK_KEY, HOOK_SECRET, "POST", HOOK_PATH, body)
        headers["Content-Type"] = "application/json"
        if session is None:
            async with aiohttp.ClientSession() as own:
                return await self.post(event, own)
        async with session.post(f"{self.url}{HOOK_PATH}", data=body, headers=headers) as resp:
            return resp.status

    async def stop(self) -> int:
        """SIGTERM; the exit status."""
        assert self.proc is not None
        if self.proc.returncode is None:
            return await self.signal(signal.SIGTERM, 20)
        return await self.proc.wait()

    def actions(self, tx: str) -> list[tuple[Any, ...]]:
        """(action, rule, rule_set_version, status) of one deposit's actions, in order."""
        return rows(
            self.db,
            "SELECT action, rule, rule_set_version, status FROM actions"
            " WHERE transaction_id = ? ORDER BY id",
            tx,
        )

    def event_status(self, event_id: str) -> str | None:
        """The stored status of one event."""
        found = rows(self.db, "SELECT status FROM events WHERE event_id = ?", event_id)
        return str(found[0][0]) if found else None
