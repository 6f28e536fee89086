"""The in-process webhook endpoint's limits over real loopback HTTP: the budget for bodies in
flight, sampled refusal lines that never echo request values, and a read-only /readyz."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.configs import HOOK_KEY, HOOK_PATH, HOOK_SECRET
from tests.support.ingress import ClientFactory, start_ingress, stored
from tests.support.webhooks import deposit_event
from worker.ingest import endpoint as ingress_mod
from worker.provider.jsonio import dumpb
from worker.provider.signing import METHOD_PATH_V1, signed_headers
from worker.service.keys import PROCESSOR_KEY, STORE_KEY


async def test_bodies_over_the_budget_answer_503_until_room_is_made(
    aiohttp_client: ClientFactory, tmp_path: Path
) -> None:
    """While one delivery's 1,500-byte body is still arriving, a second that would take the
    bodies in flight over a 2,000-byte budget answers 503 with Retry-After; once the first is
    in, deliveries are accepted again."""
    client, settings, _ = await start_ingress(aiohttp_client, tmp_path, body_budget_bytes=2000)
    slow = dumpb(deposit_event(tx="slow", note="n" * 1200))
    headers = signed_headers(HOOK_KEY, HOOK_SECRET, "POST", HOOK_PATH, slow)
    head = f"POST {HOOK_PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(slow)}\r\n"
    head += "Connection: close\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    assert client.server.port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", client.server.port)
    writer.write(head.encode() + slow[:100])
    await writer.drain()
    await asyncio.sleep(0.2)  # the slow body's reservation is taken
    second = dumpb(deposit_event(tx="second", note="m" * 800))
    h2 = signed_headers(HOOK_KEY, HOOK_SECRET, "POST", HOOK_PATH, second)
    resp = await client.post(HOOK_PATH, data=second, headers=h2)
    assert resp.status == 503
    assert resp.headers["Retry-After"] == "1"
    writer.write(slow[100:])
    await writer.drain()
    assert (await reader.read()).startswith(b"HTTP/1.1 200")
    writer.close()
    h2 = signed_headers(HOOK_KEY, HOOK_SECRET, "POST", HOOK_PATH, second)
    assert (await client.post(HOOK_PATH, data=second, headers=h2)).status == 200
    assert {r["transaction_id"] for r in stored(settings)} == {"slow", "second"}


async def test_refusal_lines_are_sampled_and_counted_without_request_values(
    aiohttp_client: ClientFactory,
    tmp_path: Path,
    log_lines: io.StringIO,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """40 compressed deliveries with a long Content-Encoding value: 5 log lines, then one line
    counting the 35 left out; neither the log nor the answers repeat the value."""
    monkeypatch.setattr(ingress_mod, "_LOG_INTERVAL_S", 0.5)
    client, _, _ = await start_ingress(aiohttp_client, tmp_path)
    sentinel = "x-sentinel-" + "e" * 2000
    raw = dumpb(deposit_event())
    for _ in range(40):
        headers = signed_headers(HOOK_KEY, HOOK_SECRET, "POST", HOOK_PATH, raw)
        headers["Content-Encoding"] = sentinel
        resp = await client.post(HOOK_PATH, data=raw, headers=headers)
        assert resp.status == 415
        assert "sentinel" not in await resp.text()
    lines = [json.loads(line) for line in log_lines.getvalue().splitlines()]
    refused = [e for e in lines if e["event"] == "webhook refused"]
    assert len(refused) == 5

    def summary() -> list[dict[str, Any]]:
        found = [json.loads(line) for line in log_lines.getvalue().splitlines()]
        return [e for e in found if e["event"] == "log lines left out"]

    for _ in range(100):
        if summary():
            break
        await asyncio.sleep(0.05)
    assert [(e["kind"], e["count"]) for e in summary()] == [
        ("webhook refused: content_encoding", 35)
    ]
    assert "sentinel" not in log_lines.getvalue()


async def test_readyz_writes_nothing(aiohttp_client: ClientFactory, tmp_path: Path) -> None:
    """200 /readyz probes commit nothing to the database."""
    client, _, app = await start_ingress(aiohttp_client, tmp_path, sweep_s=3600)  # no sweep commits
    store = app[STORE_KEY]
    await app[PROCESSOR_KEY].run_until_idle()
    before = store.commits
    for _ in range(200):
        resp = await client.get("/readyz")
        assert resp.status == 200
    assert store.commits == before


async def test_wrong_path_is_logged_and_counted(
    aiohttp_client: ClientFactory, tmp_path: Path, log_lines: io.StringIO
) -> None:
    """A POST to a path not served answers 404, is logged (sampled: 5 of 20) with its path and
    counted in the refusal metric."""
    client, _, _ = await start_ingress(aiohttp_client, tmp_path)
    for _ in range(20):
        assert (await client.post("/hooks/provider", data=b"{}")).status == 404
    lines = [json.loads(line) for line in log_lines.getvalue().splitlines()]
    logged = [e for e in lines if e["event"] == "no such path on the webhook port"]
    assert [e["path"] for e in logged] == ["/hooks/provider"] * 5
    text = await (await client.get("/metrics")).text()
    assert 'depositd_webhook_refusals_total{reason="not_found"} 20.0' in text


@pytest.mark.parametrize(
    ("header", "value"),
    [("X-Forwarded-Prefix", "/public"), ("X-Original-URI", "/public" + HOOK_PATH)],
    ids=["forwarded-prefix", "original-uri"],
)
async def test_bad_signature_names_the_signed_path_a_proxy_reports(
    aiohttp_client: ClientFactory, tmp_path: Path, header: str, value: str
) -> None:
    """Under method-path-v1, a delivery signed for /public/... that a proxy passed on as HOOK_PATH
    is refused 401, and the answer names the path it was signed for, which the proxy's header
    revealed."""
    client, settings, _ = await start_ingress(aiohttp_client, tmp_path, signature="method-path-v1")
    raw = dumpb(deposit_event())
    headers = signed_headers(
        HOOK_KEY, HOOK_SECRET, "POST", "/public" + HOOK_PATH, raw, scheme=METHOD_PATH_V1
    )
    headers[header] = value
    resp = await client.post(HOOK_PATH, data=raw, headers=headers)
    assert resp.status == 401
    error = (await resp.json())["error"]
    assert f"checked over POST {HOOK_PATH}," in error
    assert f"it verifies for the path /public{HOOK_PATH}: a proxy rewrote the path" in error
    assert stored(settings) == []


async def test_a_rewritten_path_is_harmless_under_the_published_scheme(
    aiohttp_client: ClientFactory, tmp_path: Path
) -> None:
    """The published scheme does not sign the path: a delivery the provider sent to /public/...
    that a proxy passed on as HOOK_PATH is stored."""
    client, settings, _ = await start_ingress(aiohttp_client, tmp_path)
    raw = dumpb(deposit_event())
    headers = signed_headers(HOOK_KEY, HOOK_SECRET, "POST", "/public" + HOOK_PATH, raw)
    headers["X-Forwarded-Prefix"] = "/public"
    resp = await client.post(HOOK_PATH, data=raw, headers=headers)
    assert resp.status == 200
    assert len(stored(settings)) == 1


async def test_a_proxy_header_the_signature_does_not_verify_for_is_not_repeated(
    aiohttp_client: ClientFactory, tmp_path: Path
) -> None:
    """A forged X-Original-URI (the signature does not verify for it) is not named."""
    client, _, _ = await start_ingress(aiohttp_client, tmp_path)
    raw = dumpb(deposit_event())
    headers = signed_headers(HOOK_KEY, "wrong-secret", "POST", HOOK_PATH, raw)
    headers["X-Original-URI"] = "/sentinel-path"
    resp = await client.post(HOOK_PATH, data=raw, headers=headers)
    assert resp.status == 401
    assert "sentinel" not in await resp.text()
