"""PostgreSQL going away under `depositd serve`: what the deliveries get, what the log says, and
a failover from a primary to its synchronous standby under load.

`serve` runs as a process (its log read as JSON lines); the servers are throwaway clusters
(tests/pgcluster.py) stopped and started, or crashed and promoted, by the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from pgcluster import ENV_URL, Cluster
from pytest_aiohttp import AiohttpServer
from serveproc import PROVIDER_KEY, PROVIDER_SECRET, ServeProcess, free_port

from worker.config.settings import StorageSettings
from worker.provider.signing import signed_headers
from worker.store.pgstore import command_connection

ROOT = Path(__file__).resolve().parents[2]
HOOK_KEY, HOOK_SECRET, HOOK_PATH = "failover-hook-key", "failover-hook-secret", "/webhooks/provider"
PAYER_ADDRESS = "TFailoverPayer00000000000000000000001"
PROFILES = f"""
profiles:
  failover-entity:
    correspondentType: ENTITY
    fullName: Failover Trading Ltd
    countryCode: SG
    companyAddress: 3 Standby Road, Singapore
    walletType: VASP
    provider: Binance
addresses:
  {PAYER_ADDRESS}: failover-entity
"""
# The outage's lines, as the log names them (docs/operations.md).
DOWN, STILL_DOWN, BACK = (
    "database unavailable: deliveries answered 503 until it is back; processing, actions and"
    " the scheduler wait",
    "database still unavailable",
    "database available again: deliveries stored, processing, actions and the scheduler resumed",
)


def config(
    path: Path,
    port: int,
    provider: str,
    storage: Mapping[str, Any],
    *,
    notify: Mapping[str, Any] | None = None,
    profiles: Path | None = None,
) -> Path:
    """One instance's configuration: JSON logs, short intervals and a short lease."""
    data: dict[str, Any] = {
        "provider": {"base_url": provider, "api_key": PROVIDER_KEY, "api_secret": PROVIDER_SECRET},
        "webhook": {
            "listen": f"127.0.0.1:{port}",
            "path": HOOK_PATH,
            "api_key": HOOK_KEY,
            "secret": HOOK_SECRET,
        },
        "storage": dict(storage),
        "scheduler": {
            "history_interval_s": 1,
            "detail_interval_s": 1,
            "blocked_interval_s": 2,
            "abnormal_interval_s": 2,
            "catchup_interval_s": 3,
        },
        "instance": {"lease_s": 2},
        "rules": str(ROOT / "rules"),
        "log": {"format": "json", "level": "info"},
    }
    if notify is not None:
        data["notify"] = dict(notify)
    if profiles is not None:
        data["profiles"] = str(profiles)
    path.write_text(json.dumps(data))
    return path


def log_lines(log: Path) -> list[dict[str, Any]]:
    """The JSON lines of a serve's log (both of its processes), each with `at` (epoch s)."""
    lines = []
    for text in log.read_text().splitlines():
        if text.startswith("{"):
            entry = json.loads(text)
            stamp = entry["timestamp"].replace("Z", "+00:00")
            entry["at"] = datetime.fromisoformat(stamp).timestamp()
            lines.append(entry)
    return lines


def events_named(log: Path, name: str) -> list[dict[str, Any]]:
    return [e for e in log_lines(log) if e["event"] == name]


def outage_window(log: Path) -> list[dict[str, Any]]:
    """The log lines from the outage's first line to its last, both included."""
    lines = log_lines(log)
    first = next(i for i, e in enumerate(lines) if e["event"] == DOWN)
    last = max(i for i, e in enumerate(lines) if e["event"] == BACK)
    return lines[first : last + 1]


async def until(check: Callable[[], Any], what: str, within_s: float = 30) -> None:
    """Poll `check` (a sync callable) until it holds."""
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def deliver(http: aiohttp.ClientSession, port: int, event_id: str) -> tuple[int, str | None]:
    """One signed delivery of an event depositd ignores (stored, nothing to act on): its
    status and Retry-After."""
    body = json.dumps(
        {"eventId": event_id, "eventType": "SOMETHING_NEW", "timestamp": int(time.time() * 1000)}
    ).encode()
    headers = signed_headers(HOOK_KEY, HOOK_SECRET, "POST", HOOK_PATH, body)
    headers["Content-Type"] = "application/json"
    async with http.post(f"http://127.0.0.1:{port}{HOOK_PATH}", data=body, headers=headers) as r:
        return r.status, r.headers.get("Retry-After")


def pg_rows(url: str, sql: str, args: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    conn = command_connection(StorageSettings.model_validate({"url": url}))
    try:
        return [dict(zip(r.keys(), r, strict=True)) for r in conn.execute(sql, args).fetchall()]
    finally:
        conn.close()


async def test_an_outage_reads_as_a_few_lines_and_alerts_once(
    tmp_path: Path, pg_cluster: Cluster, provider_url: str, aiohttp_server: AiohttpServer
) -> None:
    """PostgreSQL stopped for a few seconds under deliveries, then started: each delivery
    meanwhile gets 503 with Retry-After; the log says so in one line, once more when the outage
    passes `storage.outage_alert_s` (and one alert goes out), and once when it is back, with
    what failed meanwhile counted; no traceback, no line per failure."""
    if os.environ.get(ENV_URL):
        pytest.skip(f"{ENV_URL} names a server this test cannot stop")
    alerts: list[dict[str, Any]] = []

    async def slack(request: web.Request) -> web.Response:
        alerts.append(await request.json())
        return web.Response(text="ok")

    sink = web.Application()
    sink.router.add_post("/slack", slack)
    slack_server = await aiohttp_server(sink)
    url = pg_cluster.create_database()
    port = free_port()
    storage = {"url": url, "outage_alert_s": 2}
    path = config(
        tmp_path / "serve.yaml",
        port,
        provider_url,
        storage,
        notify={"slack": {"webhook_url": str(slack_server.make_url("/slack"))}},
    )
    serve = ServeProcess(path, port, tmp_path / "serve.log")
    answers: list[tuple[int, str | None]] = []
    numbers = itertools.count()
    try:
        async with serve, aiohttp.ClientSession() as http:
            assert await deliver(http, port, "before") == (200, None)
            await asyncio.to_thread(pg_cluster.stop)
            try:
                down_at = time.monotonic()
                # Deliveries for 4 s (past outage_alert_s): every one refused, none stored.
                while time.monotonic() - down_at < 4 or not alerts:
                    answers.append(await deliver(http, port, f"down-{next(numbers)}"))
                    await asyncio.sleep(0.05)
                    assert time.monotonic() - down_at < 30, "no alert"
            finally:
                await asyncio.to_thread(pg_cluster.start)
            await until(lambda: events_named(serve.log, BACK), "the database back in the log")
            assert await deliver(http, port, "after") == (200, None)
            assert serve.proc is not None and serve.proc.returncode is None  # never exited
    finally:
        with contextlib.suppress(Exception):
            pg_cluster.drop_database(url)
    assert answers and set(answers) == {(503, "5")}
    window = outage_window(serve.log)
    names = [e["event"] for e in window]
    assert names.count(DOWN) == 1 and names.count(STILL_DOWN) == 1 and names.count(BACK) == 1
    # A few lines in all, whatever the outage's length: no traceback, no line per failure.
    assert len(window) <= 15, names
    assert not any("exception" in e or "traceback" in str(e).lower() for e in window), window
    back = window[-1]
    assert back["deliveriesRefused"] == len(answers)
    assert back["transactionsFailed"] >= 1 and back["processingFailed"] >= 1
    assert back["seconds"] >= 4
    assert len(alerts) == 1
    assert "Database unavailable" in json.dumps(alerts[0])
