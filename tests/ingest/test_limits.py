"""Ingress limits against a real `serve` (both with and without its ingress process): idle and
trickling connections are closed, the connection cap makes room for real deliveries, headers
are checked before a body is read, /metrics and /readyz on a listener of their own."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from tests.support.configs import HOOK_KEY, HOOK_PATH
from tests.support.paths import ROOT
from tests.support.ports import free_port
from tests.support.processes import Processes, cli
from tests.support.service import Service
from tests.support.stores import rows
from tests.support.waits import until
from tests.support.webhooks import envelope
from worker.clock import now_ms
from worker.config.settings import WebhookSettings

HEAD = f"POST {HOOK_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode()

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def limited(service: Service, ingress_process: bool, **webhook: Any) -> None:
    """Rewrite the service's webhook section with these limits."""
    cfg = json.loads(service.config.read_text())
    cfg["webhook"].update({"ingress_process": ingress_process, **webhook})
    service.config.write_text(json.dumps(cfg))


async def closed_by_server(conn: Conn) -> bool:
    """True once the server has closed the connection (EOF or reset)."""
    reader, _ = conn
    try:
        while await asyncio.wait_for(reader.read(65536), 30):
            pass
    except ConnectionError:
        pass
    return True


async def trickle(conn: Conn) -> None:
    """Send a request head one header line every 0.2 s, never finishing it."""
    _, writer = conn
    try:
        writer.write(HEAD)
        for n in range(1000):
            await asyncio.sleep(0.2)
            writer.write(f"X-Slow-{n}: 1\r\n".encode())
            await writer.drain()
    except ConnectionError:
        pass


@pytest.mark.parametrize("ingress_process", [True, False], ids=["ingress-process", "one-process"])
async def test_idle_and_trickling_connections_are_closed_while_deliveries_are_answered(
    tmp_path: Any, provider_url: str, ingress_process: bool, processes: Processes
) -> None:
    """60 connections that send nothing or trickle a head, over a cap of 50, do not keep 10
    signed deliveries out; every one of them is closed by the server, and the cap is logged
    once, not per connection."""
    service = processes.own(Service(tmp_path, provider_url))
    limited(service, ingress_process, head_timeout_s=1, idle_timeout_s=2, max_connections=50)
    async with service:
        conns: list[Conn] = []
        for _ in range(60):
            conns.append(await asyncio.open_connection("127.0.0.1", service.port))
        trickling = [asyncio.ensure_future(trickle(c)) for c in conns[40:]]
        async with aiohttp.ClientSession() as session:
            statuses = [
                await service.post(
                    envelope(f"lim-{n}", "DEPOSIT_WHITELIST_REQUIRED", f"t{n}"), session
                )
                for n in range(10)
            ]
        assert statuses == [200] * 10
        assert all(await asyncio.gather(*(closed_by_server(c) for c in conns)))
        for task in trickling:
            task.cancel()
        for _, writer in conns:
            writer.close()
        assert await service.stop() == 0
    lines = [json.loads(line) for line in service.log.read_text().splitlines()]
    assert [e["event"] for e in lines].count("connection cap reached") == 1


@pytest.mark.parametrize("ingress_process", [True, False], ids=["ingress-process", "one-process"])
async def test_bodies_without_api_key_are_refused_before_they_are_read(
    tmp_path: Any, provider_url: str, ingress_process: bool, processes: Processes
) -> None:
    """50 connections announcing 1 MB bodies without an API-KEY get 401 naming the missing
    header without sending a byte of their body: it is never waited for or read."""
    service = processes.own(Service(tmp_path, provider_url))
    limited(service, ingress_process)
    async with service:
        conns = [await asyncio.open_connection("127.0.0.1", service.port) for _ in range(50)]
        for _, writer in conns:
            writer.write(
                HEAD + b"Content-Length: 1000000\r\nContent-Type: application/json\r\n\r\n"
            )
        answers = [await asyncio.wait_for(reader.read(4096), 10) for reader, _ in conns]
        for _, writer in conns:
            writer.close()
        for answer in answers:
            assert answer.startswith(b"HTTP/1.1 401"), answer
            assert b"missing header API-KEY" in answer
        assert await service.stop() == 0


@pytest.mark.parametrize("ingress_process", [True, False], ids=["ingress-process", "one-process"])
async def test_metrics_and_readyz_on_their_own_listener(
    tmp_path: Any, provider_url: str, ingress_process: bool, processes: Processes
) -> None:
    """With webhook.ops_listen, /metrics and /readyz answer there and 404 on the webhook port,
    where deliveries are still answered."""
    ops = free_port()
    service = processes.own(Service(tmp_path, provider_url))
    limited(service, ingress_process, ops_listen=f"127.0.0.1:{ops}")
    async with service:
        assert await service.post(envelope("ops-1", "DEPOSIT_WHITELIST_REQUIRED", "o1")) == 200
        async with aiohttp.ClientSession() as session:
            for path in ("/metrics", "/readyz"):
                async with session.get(f"{service.url}{path}") as r:
                    assert r.status == 404, path
                async with session.get(f"http://127.0.0.1:{ops}{path}") as r:
                    assert r.status == 200, path
                    text = await r.text()
            async with session.get(f"http://127.0.0.1:{ops}/metrics") as r:
                text = await r.text()
        assert 'outcome="new"} 1.0' in text
        assert 'depositd_webhook_refusals_total{reason="not_found"} 2.0' in text
        assert await service.stop() == 0


async def test_status_counts_refusals_by_reason(
    tmp_path: Any, provider_url: str, processes: Processes
) -> None:
    """`status` shows refused deliveries by reason (bad signature, wrong path) and the log says
    which path a refused signature was checked over."""
    service = processes.own(Service(tmp_path, provider_url))
    async with service:
        async with aiohttp.ClientSession() as session:
            event = envelope("st-1", "DEPOSIT_WHITELIST_REQUIRED", "s1")
            headers = {"API-KEY": HOOK_KEY, "API-SIGNATURE": "00", "API-TIMESTAMP": str(now_ms())}
            async with session.post(f"{service.url}{HOOK_PATH}", json=event, headers=headers) as r:
                assert r.status == 401
                assert f"checked over POST {HOOK_PATH}," in (await r.json())["error"]
            async with session.post(f"{service.url}/wrong/path", json=event) as r:
                assert r.status == 404

        def counted() -> Any:
            found = rows(service.db, "SELECT value FROM meta WHERE key = 'webhook_refusals'")
            return found and json.loads(found[0][0])["counts"]

        counts = await until(counted, "refusal counts", 20)
        assert counts == {"bad_signature": 1, "not_found": 1}
        code, out, _ = await cli(service.config, "status")
        assert code == 0
        assert json.loads(out)["webhookRefusals"]["counts"] == counts
        assert await service.stop() == 0
    log = service.log.read_text()
    assert '"path": "/wrong/path"' in log
    assert f"checked over POST {HOOK_PATH}," in log


def test_the_unit_allows_more_open_files_than_the_connection_cap() -> None:
    """The unit's LimitNOFILE leaves room above the default connection cap (the default soft
    limit of 1024 would not)."""
    unit = (ROOT / "deploy" / "depositd.service").read_text()
    (line,) = [x for x in unit.splitlines() if x.startswith("LimitNOFILE=")]
    cap = WebhookSettings.model_fields["max_connections"].default
    assert int(line.partition("=")[2]) >= cap + 100
