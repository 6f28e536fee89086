"""`serve`'s ingress process (`worker.ingest.process`): answers, metrics and readiness through
it, and
each process going down with the other. Real `serve` subprocesses, real loopback HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
from contextlib import closing
from pathlib import Path

import aiohttp
import pytest

from tests.support.configs import HOOK_KEY, HOOK_PATH
from tests.support.processes import Processes, children
from tests.support.service import Service
from tests.support.waits import until
from tests.support.webhooks import envelope
from worker.provider.jsonio import dumpb


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(") ")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def ingress_pid(service: Service) -> int:
    """The one ingress process of a running serve."""
    (pid,) = children(service.pid)
    assert "worker.ingest.process" in Path(f"/proc/{pid}/cmdline").read_text()
    return pid


def one_process(service: Service) -> None:
    """Rewrite the service's config with `webhook.ingress_process: false`."""
    cfg = json.loads(service.config.read_text())
    cfg["webhook"]["ingress_process"] = False
    service.config.write_text(json.dumps(cfg))


async def test_answers_counts_and_readiness_come_through_the_ingress_process(
    tmp_path: Path, provider_url: str
) -> None:
    async with Service(tmp_path, provider_url) as service:
        ingress = ingress_pid(service)
        event = envelope("ip-1", "DEPOSIT_WHITELIST_REQUIRED", "ip-tx-1")
        assert await service.post(event) == 200
        assert await service.post(event) == 200  # the duplicate
        async with aiohttp.ClientSession() as session:
            async with session.post(
                f"{service.url}{HOOK_PATH}",
                data=dumpb(event),
                headers={"API-KEY": HOOK_KEY, "API-TIMESTAMP": "1", "API-SIGNATURE": "00"},
            ) as r:
                assert r.status == 401
                assert "API-TIMESTAMP too old" in (await r.json())["error"]
            async with session.get(f"{service.url}/readyz") as r:
                assert (r.status, await r.json()) == (200, {"status": "ready"})
            async with session.get(f"{service.url}/metrics") as r:
                assert r.status == 200
                assert r.headers["Content-Type"].startswith("text/plain")
                text = await r.text()
        for outcome, n in (("new", 1), ("duplicate", 1)):
            assert (
                f'depositd_events_received_total{{event_type="DEPOSIT_WHITELIST_REQUIRED",'
                f'outcome="{outcome}"}} {n}.0'
            ) in text
        assert (
            'depositd_events_received_total{event_type="none",outcome="unauthorized"} 1.0' in text
        )
        assert "depositd_webhook_seconds_count 3.0" in text
        with closing(sqlite3.connect(service.db)) as db:
            assert db.execute("SELECT COUNT(*) FROM events").fetchone() == (1,)
        assert await service.stop() == 0
        await until(lambda: not alive(ingress), "the ingress process to exit", 5)


@pytest.mark.parametrize(
    ("sig", "status", "logged"),
    [
        # Killed: nothing would answer webhooks any more; exit non-zero, so systemd restarts it.
        (signal.SIGKILL, 1, "ingress process exited"),
        # Its own SIGTERM: a clean stop of the whole service.
        (signal.SIGTERM, 0, "ingress process stopped"),
    ],
    ids=["killed", "terminated"],
)
async def test_serve_stops_with_its_ingress_process(
    tmp_path: Path, provider_url: str, sig: int, status: int, logged: str
) -> None:
    async with Service(tmp_path, provider_url) as service:
        os.kill(ingress_pid(service), sig)
        assert service.proc is not None
        assert await asyncio.wait_for(service.proc.wait(), 20) == status
        assert logged in service.log.read_text()


async def test_the_ingress_process_goes_with_a_killed_serve(
    tmp_path: Path, provider_url: str
) -> None:
    async with Service(tmp_path, provider_url) as service:
        ingress = ingress_pid(service)
        await service.signal(signal.SIGKILL)
        await until(lambda: not alive(ingress), "the ingress process to exit", 5)
        # A new serve binds the same port at once and stores again.
        await service.start()
        assert await service.post(envelope("ip-2", "DEPOSIT_WHITELIST_REQUIRED", "ip-tx-2")) == 200
        assert await service.stop() == 0


async def test_one_process_serve_when_asked(
    tmp_path: Path, provider_url: str, processes: Processes
) -> None:
    service = processes.own(Service(tmp_path, provider_url))
    one_process(service)
    async with service:
        assert children(service.pid) == []
        assert await service.post(envelope("ip-3", "DEPOSIT_WHITELIST_REQUIRED", "ip-tx-3")) == 200
        assert await service.stop() == 0
        with closing(sqlite3.connect(service.db)) as db:
            assert db.execute("SELECT event_id FROM events").fetchall() == [("ip-3",)]


async def test_a_second_serve_on_the_same_port_fails(
    tmp_path: Path, provider_url: str, processes: Processes
) -> None:
    """Two services never share a port (and so the deliveries): the second one exits 2, naming
    the setting and the address."""
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    async with Service(tmp_path / "a", provider_url) as first:
        second = processes.own(Service(tmp_path / "b", provider_url))
        cfg = json.loads(second.config.read_text())
        cfg["webhook"]["listen"] = f"127.0.0.1:{first.port}"
        second.config.write_text(json.dumps(cfg))
        try:
            proc = await second.spawn()
            assert await asyncio.wait_for(proc.wait(), 30) == 2
            text = second.log.read_text()
            assert "cannot listen" in text and "webhook.listen" in text
            assert f"127.0.0.1:{first.port}" in text
        finally:
            await second.kill()
        assert not second.db.exists()  # refused before it opened (or ran) anything
        assert await first.post(envelope("ip-4", "DEPOSIT_WHITELIST_REQUIRED", "ip-tx-4")) == 200


async def test_a_second_serve_on_the_same_database_joins_the_first(
    tmp_path: Path, provider_url: str, processes: Processes
) -> None:
    """Two services may share a database (each claims the actions it runs) when told so
    (`storage.several_instances`): the second one, on another port, starts beside the first,
    and an event sent to both is stored once."""
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    async with Service(tmp_path / "a", provider_url) as first:
        second = processes.own(Service(tmp_path / "b", provider_url))
        cfg = json.loads(second.config.read_text())
        cfg["storage"]["path"] = str(first.db)
        cfg["storage"]["several_instances"] = True
        second.config.write_text(json.dumps(cfg))
        async with second:
            assert (
                await first.post(envelope("ip-5", "DEPOSIT_WHITELIST_REQUIRED", "ip-tx-5")) == 200
            )
            assert (
                await second.post(envelope("ip-6", "DEPOSIT_WHITELIST_REQUIRED", "ip-tx-6")) == 200
            )
            assert (
                await second.post(envelope("ip-5", "DEPOSIT_WHITELIST_REQUIRED", "ip-tx-5")) == 200
            )
    with closing(sqlite3.connect(first.db)) as db:
        assert [r[0] for r in db.execute("SELECT event_id FROM events ORDER BY seq")] == [
            "ip-5",
            "ip-6",
        ]


async def test_library_errors_are_json_lines_without_request_bytes(
    tmp_path: Path, provider_url: str
) -> None:
    """A malformed request (a control byte in a header holding a key) and a compressed body
    that is not: aiohttp's own error lines come out as JSON lines naming the error type, never
    a traceback or the request's bytes."""
    requests = (
        b"POST /webhooks/provider HTTP/1.1\r\nHost: x\r\nAPI-KEY: KEY-sentinel-value\x01x\r\n"
        b"Content-Length: 2\r\n\r\n{}",
        b"POST /webhooks/provider HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\n"
        b"Content-Length: 5\r\nConnection: close\r\n\r\nhello",
    )
    async with Service(tmp_path, provider_url) as service:
        for raw in requests:
            reader, writer = await asyncio.open_connection("127.0.0.1", service.port)
            writer.write(raw)
            await writer.drain()
            assert (await asyncio.wait_for(reader.read(64), 10)).startswith(b"HTTP/1.")
            writer.close()
        assert await service.stop() == 0
    text = service.log.read_text()
    lines = [json.loads(line) for line in text.splitlines()]  # every line is JSON
    errors = {(e.get("logger"), e.get("error")) for e in lines if e["level"] == "error"}
    assert ("aiohttp.server", "BadHttpMessage") in errors
    assert "sentinel-value" not in text and "Traceback" not in text
