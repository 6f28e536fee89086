"""The webhook endpoint in this process (`build_app` without plugins) on loopback: its
configuration, which takes the current webhook secret and the one before it, signed posts to it,
and the events it stored."""

from __future__ import annotations

import io
import json
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient

from tests.support.configs import HOOK_KEY, HOOK_PATH, HOOK_SECRET, make_config, write_config
from worker.clock import now_ms
from worker.config.settings import Settings, load_settings
from worker.provider.jsonio import dumpb
from worker.provider.signing import signed_headers
from worker.service.setup import build_app

OLD_SECRET = "previous-secret"  # the webhook secret before HOOK_SECRET, still accepted

Client = TestClient[web.Request, web.Application]
ClientFactory = Callable[[web.Application], Awaitable[Client]]


def write_ingress_config(folder: Path, **webhook: Any) -> Path:
    """A complete configuration file in `folder`, its database there too: webhooks signed with
    HOOK_SECRET or OLD_SECRET within 300 s, no scheduler, JSON log lines from warnings up;
    `webhook` adds or replaces keys of the webhook section."""
    cfg = make_config(
        Path("depositd.db"),
        webhook={
            "listen": "127.0.0.1:0",
            "path": HOOK_PATH,
            "secret": [HOOK_SECRET, OLD_SECRET],
            "tolerance_s": 300,
            **webhook,
        },
        scheduler={"enabled": False},
        log={"format": "json", "level": "warning"},
    )
    return write_config(folder, cfg)


async def start_ingress(
    aiohttp_client: ClientFactory, folder: Path, sweep_s: float = 0.05, **webhook: Any
) -> tuple[Client, Settings, web.Application]:
    """The endpoint configured by `write_ingress_config(folder, **webhook)`, and a client of
    it."""
    settings = load_settings(write_ingress_config(folder, **webhook))
    app = build_app(settings, sweep_interval_s=sweep_s)
    return await aiohttp_client(app), settings, app


async def post(
    client: Client,
    body: bytes | dict[str, Any],
    *,
    secret: str = HOOK_SECRET,
    api_key: str = HOOK_KEY,
    timestamp_ms: int | None = None,
    skew_ms: int | None = None,
    drop: str | None = None,
) -> tuple[int, Any]:
    """POST a signed body; returns (status, parsed JSON answer or text)."""
    raw = body if isinstance(body, bytes) else dumpb(body)
    if skew_ms is not None:
        timestamp_ms = now_ms() + skew_ms
    headers = signed_headers(api_key, secret, "POST", HOOK_PATH, raw, timestamp_ms=timestamp_ms)
    headers["Content-Type"] = "application/json"
    if drop:
        del headers[drop]
    resp = await client.post(HOOK_PATH, data=io.BytesIO(raw), headers=headers)
    text = await resp.text()
    try:
        return resp.status, json.loads(text)
    except ValueError:
        return resp.status, text


def stored(settings: Settings) -> list[sqlite3.Row]:
    """Every stored event, read through a separate connection (i.e. committed rows only)."""
    conn = sqlite3.connect(settings.storage.path)
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute("SELECT * FROM events ORDER BY seq").fetchall()
    finally:
        conn.close()
