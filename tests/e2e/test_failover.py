"""PostgreSQL going away under `depositd serve`: what the deliveries get, what the log says, and
a failover from a primary to its synchronous standby under load.

`serve` runs as a process (its log read as JSON lines); the servers are throwaway clusters
(tests/support/pgcluster.py) stopped and started, or crashed and promoted, by the test.
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
from pytest_aiohttp import AiohttpServer

from tests.support.configs import HOOK_KEY, HOOK_PATH, HOOK_SECRET, serve_config, write_config
from tests.support.pgcluster import ENV_URL, Cluster, replicated_pair
from tests.support.ports import free_port
from tests.support.processes import Processes
from tests.support.sandboxes import sandbox_settings
from worker.commands.ops import status_report
from worker.config.settings import StorageSettings
from worker.dev.sandbox import SANDBOX_KEY, create_app
from worker.provider.signing import signed_headers
from worker.store.durability import PRIMARY_LOSS, SERVER_CRASH
from worker.store.pgstore import command_connection

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
    cfg = serve_config(
        storage,
        provider,
        port,
        scheduler={
            "history_interval_s": 1,
            "detail_interval_s": 1,
            "blocked_interval_s": 2,
            "abnormal_interval_s": 2,
            "catchup_interval_s": 3,
        },
        instance={"lease_s": 2},
        notify=None if notify is None else dict(notify),
        profiles=None if profiles is None else str(profiles),
    )
    return write_config(path, cfg)


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
    tmp_path: Path,
    pg_cluster: Cluster,
    provider_url: str,
    aiohttp_server: AiohttpServer,
    processes: Processes,
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
    serve = processes.serve(path, port, tmp_path / "serve.log")
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
                # /metrics still answers, without the gauges read from the database.
                async with http.get(f"http://127.0.0.1:{port}/metrics") as metrics:
                    assert metrics.status == 200
            finally:
                await asyncio.to_thread(pg_cluster.start)
            started = time.time()
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
    assert back["metricsWithoutStore"] == 1
    assert back["seconds"] >= 4
    assert len(alerts) == 1
    assert events_named(serve.log, "store open")[0]["acknowledgedSurvives"] == SERVER_CRASH
    # Back within the longest back-off (2 s) of the server accepting connections, and a
    # margin for a loaded machine.
    recovered = round(back["at"] - started, 2)
    assert recovered < 5, recovered
    print(f"storing again {recovered} s after the server was started")
    assert "Database unavailable" in json.dumps(alerts[0])


class Proxy:
    """Round-robin HTTP proxy in front of the instances (a load balancer), recording each
    delivery's answer: (time, port, status, Retry-After, eventId)."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = ports
        self._turn = itertools.count()
        self.answers: list[tuple[float, int, int, str | None, str]] = []
        self.session: aiohttp.ClientSession | None = None

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
        assert self.session is not None
        port = self.ports[next(self._turn) % len(self.ports)]
        async with self.session.post(
            f"http://127.0.0.1:{port}{request.path}", data=body, headers=headers
        ) as answer:
            text = await answer.read()
            retry_after = answer.headers.get("Retry-After")
            event_id = json.loads(body)["eventId"]
            self.answers.append((time.time(), port, answer.status, retry_after, event_id))
            reply = web.Response(status=answer.status, body=text)
            if retry_after is not None:
                reply.headers["Retry-After"] = retry_after
            return reply


async def ready_since(http: aiohttp.ClientSession, port: int, after: float) -> float:
    """The first time (epoch s) /readyz of the instance on `port` answers 200, from `after`."""
    while True:
        with contextlib.suppress(aiohttp.ClientError):
            async with http.get(f"http://127.0.0.1:{port}/readyz") as r:
                if r.status == 200:
                    return time.time()
        assert time.time() - after < 30, f"instance on {port} not ready again"
        await asyncio.sleep(0.05)


def instance_of(log: Path) -> str:
    return next(e["instance"] for e in log_lines(log) if e["event"] == "instance")


async def test_a_failover_to_the_synchronous_standby_loses_nothing_acknowledged(
    tmp_path: Path, aiohttp_server: AiohttpServer, processes: Processes
) -> None:
    """A primary with a synchronous standby, two instances on a multi-host URL
    (target_session_attrs=read-write) under a stream of signed deliveries; the primary crashes
    (`pg_ctl stop -m immediate`) and the standby is promoted. Every delivery answered 200 is
    stored and its deposit booked once, the deliveries of the gap get 503 with Retry-After,
    both instances are ready again within 10 s of the promotion without a restart, the
    scheduler's lease is held by one of them, and each one's log tells the outage in a few
    lines."""
    with replicated_pair() as (primary, standby):
        database = primary.create_database("failover")
        name = database.rpartition("/")[2]
        url = (
            f"postgresql://postgres@127.0.0.1:{primary.port},127.0.0.1:{standby.port}/{name}"
            "?target_session_attrs=read-write"
        )
        ports = [free_port(), free_port()]
        proxy = Proxy(ports)
        proxy_app = web.Application()
        proxy_app.router.add_post("/{tail:.*}", proxy.handle)
        proxy_server = await aiohttp_server(proxy_app)
        app = create_app(
            sandbox_settings(
                str(proxy_server.make_url(HOOK_PATH)),
                delivery_retry_base_s=0.1,
                delivery_retry_max_s=0.5,
                auto_review=True,
            )
        )
        sandbox = app[SANDBOX_KEY]
        provider = str((await aiohttp_server(app)).make_url("")).rstrip("/")
        profiles = tmp_path / "profiles.yaml"
        profiles.write_text(PROFILES)
        a, b = (
            processes.serve(
                config(tmp_path / f"{n}.yaml", port, provider, {"url": url}, profiles=profiles),
                port,
                tmp_path / f"{n}.log",
            )
            for n, port in zip("ab", ports, strict=True)
        )
        injected: list[str] = []
        moments: dict[str, float] = {}
        ready: dict[int, float] = {}
        async with aiohttp.ClientSession() as http:
            proxy.session = http
            try:
                await asyncio.gather(a.start(), b.start())
                promise = status_report_of(url)["durability"]

                async def inject(index: int) -> None:
                    amount = itertools.count(1)
                    while "promoted" not in moments or time.time() - moments["promoted"] < 3:
                        order = sandbox.inject_deposit(
                            1001, "USDT", "TRON", f"{index}.{next(amount):03d}", PAYER_ADDRESS
                        )
                        injected.append(order["transactionId"])
                        await asyncio.sleep(0.25)

                async def failover() -> None:
                    await until(lambda: len(injected) >= 12, "a few deposits in")
                    await asyncio.to_thread(primary.crash)
                    moments["crashed"] = time.time()
                    await asyncio.sleep(1)  # the gap a failover manager takes to decide
                    await asyncio.to_thread(standby.promote)
                    moments["promoted"] = time.time()
                    for port, at in zip(
                        ports,
                        await asyncio.gather(
                            *(ready_since(http, port, moments["promoted"]) for port in ports)
                        ),
                        strict=True,
                    ):
                        ready[port] = at

                await asyncio.gather(*(inject(i) for i in range(3)), failover())
                new_url = standby.url(name)
                booked = lambda: pg_rows(new_url, "SELECT COUNT(*) AS n FROM ledger")[0]["n"]  # noqa: E731
                await until(lambda: booked() == len(injected), "every deposit booked", 60)
                await sandbox.delivered_idle()
                await until(
                    lambda: (
                        not pg_rows(
                            new_url,
                            "SELECT 1 FROM events WHERE status NOT IN ('processed', 'ignored')",
                        )
                    ),
                    "every event processed",
                )
                await until(
                    lambda: (status_report_of(new_url)["leader"] or {}).get("current"),
                    "a current leader",
                    10,
                )
                leader = status_report_of(new_url)["leader"]
                # Never exited, never restarted: the processes started at the beginning.
                assert a.proc is not None and a.proc.returncode is None
                assert b.proc is not None and b.proc.returncode is None
            finally:
                await a.kill()
                await b.kill()
        stored = pg_rows(new_url, "SELECT event_id FROM events")
        ledger = pg_rows(new_url, "SELECT transaction_id FROM ledger")
        facts = pg_rows(
            new_url,
            "SELECT event_id, COUNT(*) AS n FROM facts WHERE source = 'webhook' GROUP BY event_id",
        )
    crashed, promoted = moments["crashed"], moments["promoted"]
    # Said at start and by `status`: an acknowledgement survives the primary's loss.
    assert promise["survives"] == PRIMARY_LOSS and promise["synchronousStandbysConnected"] == 1
    for serve in (a, b):
        assert events_named(serve.log, "store open")[0]["acknowledgedSurvives"] == PRIMARY_LOSS
    acknowledged = {e for _, _, status, _, e in proxy.answers if status == 200}
    stored_ids = [r["event_id"] for r in stored]
    # Nothing acknowledged lost, nothing stored or processed twice, every deposit booked once.
    assert acknowledged <= set(stored_ids)
    assert len(stored_ids) == len(set(stored_ids))
    assert facts and all(f["n"] == 1 for f in facts)
    assert sorted(r["transaction_id"] for r in ledger) == sorted(injected)
    # The gap: every delivery answered 503 with Retry-After, none 200, none 5xx otherwise.
    gap = [(status, ra) for at, _, status, ra, _ in proxy.answers if crashed < at < promoted]
    assert gap and set(gap) == {(503, "5")}, gap
    # Both instances ready again within 10 s of the promotion, without a restart.
    recovery = {port: round(at - promoted, 2) for port, at in ready.items()}
    assert all(seconds < 10 for seconds in recovery.values()), recovery
    print(f"ready again after the promotion, per instance: {recovery} s")
    # The scheduler's lease: held by one of the two (docs/postgresql.md, Several instances).
    assert leader["holder"] in {instance_of(a.log), instance_of(b.log)}
    # Each instance's log: one outage, told in a few lines.
    for serve in (a, b):
        window = outage_window(serve.log)
        names = [e["event"] for e in window]
        assert names.count(DOWN) == 1 and names.count(BACK) == 1, names
        assert len(window) <= 15, names
        assert not [e for e in window if "exception" in e]
        # The servers named, the password (none here) never.
        assert window[0]["servers"] == f"127.0.0.1:{primary.port}, 127.0.0.1:{standby.port}"


def status_report_of(url: str) -> dict[str, Any]:
    """What `depositd status` shows of the database at `url`."""
    conn = command_connection(StorageSettings.model_validate({"url": url}))
    try:
        return status_report(conn, True)
    finally:
        conn.close()
