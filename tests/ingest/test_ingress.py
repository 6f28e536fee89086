"""Webhook ingress over real HTTP on loopback, one test per row of docs/reference.md."""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.support.configs import HOOK_KEY, HOOK_PATH, HOOK_SECRET
from tests.support.ingress import (
    OLD_SECRET,
    Client,
    ClientFactory,
    post,
    stored,
    write_ingress_config,
)
from tests.support.webhooks import deposit_event
from worker.clock import now_ms
from worker.commands.read import run_deposits, run_events
from worker.config.settings import Settings, load_settings
from worker.ingest import endpoint as ingress_mod
from worker.logs import configure
from worker.provider.jsonio import dumpb
from worker.provider.signing import signed_headers
from worker.service.keys import PROCESSOR_KEY, READY_CHECKS_KEY, STORE_KEY
from worker.service.setup import build_app


@pytest.fixture(autouse=True)
def logs_to_stderr() -> None:
    """Keep log lines out of the command output the tests read from stdout."""
    configure("console", "info", stream=sys.stderr)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """Path of a valid config file."""
    return write_ingress_config(tmp_path)


@pytest.fixture
def settings(config: Path) -> Settings:
    """The loaded config."""
    return load_settings(config)


@pytest.fixture
async def app(settings: Settings) -> web.Application:
    """The application without plugins."""
    return build_app(settings, sweep_interval_s=0.05)


@pytest.fixture
async def client(aiohttp_client: ClientFactory, app: web.Application) -> AsyncIterator[Client]:
    """A client of the running app on loopback."""
    yield await aiohttp_client(app)


async def test_valid_new_event_is_committed_before_200(client: Client, settings: Settings) -> None:
    """A valid new event answers 200 {} and is already committed when the answer arrives."""
    ev = deposit_event()
    status, answer = await post(client, ev)
    assert (status, answer) == (200, {})
    rows = stored(settings)
    assert [r["event_id"] for r in rows] == [ev["eventId"]]
    assert rows[0]["transaction_id"] == "tx-1"
    assert bytes(rows[0]["body"]) == dumpb(ev)
    assert set(json.loads(rows[0]["headers"])) == {"API-TIMESTAMP", "Content-Type", "User-Agent"}


async def test_body_arriving_in_pieces_is_read_whole(client: Client, settings: Settings) -> None:
    """A Content-Length body sent in two writes, with a pause between, is stored whole."""
    raw = dumpb(deposit_event())
    headers = signed_headers(HOOK_KEY, HOOK_SECRET, "POST", HOOK_PATH, raw)
    head = f"POST {HOOK_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(raw)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "Connection: close\r\n\r\n"
    assert client.server.port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", client.server.port)
    try:
        writer.write(head.encode() + raw[:100])
        await writer.drain()
        await asyncio.sleep(0.2)
        writer.write(raw[100:])
        await writer.drain()
        answer = await reader.read()
    finally:
        writer.close()
    assert answer.startswith(b"HTTP/1.1 200")
    assert [bytes(r["body"]) for r in stored(settings)] == [raw]


async def test_duplicate_event_is_stored_and_processed_once(
    client: Client, app: web.Application, settings: Settings
) -> None:
    """A redelivered eventId answers 200 {} and is neither stored nor processed again."""
    ev = deposit_event()
    assert await post(client, ev) == (200, {})
    await app[PROCESSOR_KEY].run_until_idle()
    assert await post(client, ev) == (200, {})
    await app[PROCESSOR_KEY].run_until_idle()
    assert len(stored(settings)) == 1
    facts = await app[STORE_KEY].read(
        lambda db: db.execute("SELECT COUNT(*) FROM facts").fetchone()[0]
    )
    assert facts == 1


async def test_previous_secret_verifies_during_rotation(client: Client) -> None:
    """A body signed with any configured secret (the old one during rotation) is accepted."""
    assert await post(client, deposit_event(), secret=OLD_SECRET) == (200, {})


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"secret": "not-a-configured-secret"}, "bad API-SIGNATURE"),
        ({"api_key": "wrong-key"}, "unknown API-KEY"),
        ({"drop": "API-KEY"}, "missing header API-KEY"),
        ({"drop": "API-SIGNATURE"}, "missing header API-SIGNATURE"),
        ({"drop": "API-TIMESTAMP"}, "missing header API-TIMESTAMP"),
        ({"skew_ms": -305_000}, "too old"),
        ({"skew_ms": 305_000}, "in the future"),
    ],
    ids=[
        "bad-signature",
        "wrong-key",
        "no-key",
        "no-signature",
        "no-timestamp",
        "replay",
        "future",
    ],
)
async def test_auth_failures_answer_401_and_store_nothing(
    client: Client, settings: Settings, kwargs: dict[str, Any], reason: str
) -> None:
    """Every authentication failure answers 401 with a reason (no secret) and stores nothing."""
    status, answer = await post(client, deposit_event(), **kwargs)
    assert status == 401
    assert reason in answer["error"]
    assert HOOK_SECRET not in answer["error"] and OLD_SECRET not in answer["error"]
    assert stored(settings) == []


async def test_replayed_request_is_refused(client: Client, settings: Settings) -> None:
    """The exact bytes and headers of an accepted delivery, replayed too late, are refused."""
    ev = deposit_event()
    raw = dumpb(ev)
    old = now_ms() - 600_000
    headers = signed_headers(HOOK_KEY, HOOK_SECRET, "POST", HOOK_PATH, raw, timestamp_ms=old)
    resp = await client.post(HOOK_PATH, data=raw, headers=headers)
    assert resp.status == 401
    assert stored(settings) == []


async def test_signature_covers_the_body(client: Client, settings: Settings) -> None:
    """A body changed after signing fails verification."""
    raw = dumpb(deposit_event(amount="1"))
    headers = signed_headers(HOOK_KEY, HOOK_SECRET, "POST", HOOK_PATH, raw)
    resp = await client.post(HOOK_PATH, data=raw.replace(b'"1"', b'"9"'), headers=headers)
    assert resp.status == 401
    assert stored(settings) == []


async def test_body_over_limit_is_413(client: Client, settings: Settings) -> None:
    """A 2 MiB body answers 413 before anything is verified or stored."""
    raw = b'{"eventId": "big", "eventType": "X", "pad": "' + b"x" * (2 * 1024 * 1024) + b'"}'
    status, _ = await post(client, raw)
    assert status == 413
    assert stored(settings) == []


async def test_chunked_body_over_limit_is_413(client: Client, settings: Settings) -> None:
    """A body without Content-Length is cut off at the limit too."""

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(40):
            yield b"x" * 65536

    headers = signed_headers(HOOK_KEY, HOOK_SECRET, "POST", HOOK_PATH, b"")
    resp = await client.post(HOOK_PATH, data=chunks(), headers=headers)
    assert resp.status == 413
    assert stored(settings) == []


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (b'{"eventId": "e1", "eventType": "DEPOSIT_WHITELIST_REQUIRED", "da', "not JSON"),
        (b"\xff\xfe not utf-8", "not JSON"),
        (b'[{"eventId": "e1", "eventType": "DEPOSIT_WHITELIST_REQUIRED"}]', "not a JSON object"),
        (b'{"eventType": "DEPOSIT_WHITELIST_REQUIRED", "data": {}}', "missing eventId"),
        (b'{"eventId": "e1", "data": {}}', "missing eventType"),
        (b'{"eventId": 17, "eventType": "DEPOSIT_WHITELIST_REQUIRED"}', "eventId must be"),
        (b'{"eventId": "", "eventType": "DEPOSIT_WHITELIST_REQUIRED"}', "eventId must be"),
        (b"[" * 100_000 + b"]" * 100_000, "not JSON"),
        (b'{"eventId": "e\\ud800", "eventType": "DEPOSIT_WHITELIST_REQUIRED"}', "eventId holds"),
        (
            b'{"eventId": "e1", "eventType": "DEPOSIT_WHITELIST_REQUIRED",'
            b' "data": {"transactionId": "tx\\udfff"}}',
            "transactionId holds a lone surrogate",
        ),
    ],
    ids=[
        "truncated",
        "not-utf8",
        "array",
        "no-event-id",
        "no-event-type",
        "number-id",
        "empty-id",
        "nested-too-deep",
        "surrogate-id",
        "surrogate-tx",
    ],
)
async def test_malformed_bodies_answer_400(
    client: Client, settings: Settings, raw: bytes, error: str
) -> None:
    """Signed bodies that are not an event envelope answer 400 with a reason; nothing stored."""
    status, answer = await post(client, raw)
    assert status == 400
    assert error in answer["error"]
    assert stored(settings) == []


async def test_compressed_body_answers_415(client: Client, settings: Settings) -> None:
    """The signature covers the bytes as sent, which are not unpacked first: a compressed
    delivery is refused, never inflated past max_body_bytes."""
    raw = gzip.compress(dumpb(deposit_event()))
    headers = signed_headers(HOOK_KEY, HOOK_SECRET, "POST", HOOK_PATH, raw)
    headers["Content-Encoding"] = "gzip"
    resp = await client.post(HOOK_PATH, data=raw, headers=headers)
    assert resp.status == 415
    error = (await resp.json())["error"]
    assert "Content-Encoding is not accepted" in error
    assert "gzip" not in error  # the sender's value is not repeated
    assert stored(settings) == []


async def raw_request(client: Client, head: bytes, body: bytes = b"") -> bytes:
    """Send bytes as they are on a fresh connection; the first bytes of the answer (the server
    may keep reading what is left of an unfinished body before it closes)."""
    assert client.server.port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", client.server.port)
    try:
        writer.write(head + body)
        await writer.drain()
        return await asyncio.wait_for(reader.read(65536), 10)
    finally:
        writer.close()


async def test_header_bytes_that_are_not_utf8_answer_401(
    client: Client, settings: Settings
) -> None:
    """An API-KEY or API-SIGNATURE with bytes that are not UTF-8 fails authentication (401
    with a JSON error), not the server."""
    raw = dumpb(deposit_event())
    good = signed_headers(HOOK_KEY, HOOK_SECRET, "POST", HOOK_PATH, raw)
    for name in ("API-KEY", "API-SIGNATURE"):
        headers = {**good, "Content-Length": str(len(raw)), "Connection": "close"}
        lines = [f"{k}: {v}".encode() for k, v in headers.items() if k != name]
        lines.append(name.encode() + b": \xff\xfe" + good[name].encode()[2:])
        head = f"POST {HOOK_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode()
        answer = await raw_request(client, head + b"\r\n".join(lines) + b"\r\n\r\n", raw)
        status, _, body = answer.partition(b"\r\n")
        assert status == b"HTTP/1.1 401 Unauthorized", (name, answer)
        assert b'{"error": ' in body
    assert stored(settings) == []


async def test_body_that_stops_arriving_answers_408(
    client: Client, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A body still incomplete after the read timeout is answered 408 and not stored (the
    connection is not held open for as long as the client likes)."""
    monkeypatch.setattr(ingress_mod, "_READ_TIMEOUT_S", 0.3)
    raw = dumpb(deposit_event())
    headers = signed_headers(HOOK_KEY, HOOK_SECRET, "POST", HOOK_PATH, raw)
    head = f"POST {HOOK_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(raw)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "Connection: close\r\n\r\n"
    answer = await raw_request(client, head.encode(), raw[:100])
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b"not received within 0.3 s" in answer
    assert stored(settings) == []


async def test_unknown_event_type_is_stored_ignored(
    client: Client, app: web.Application, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unknown eventType answers 200 {}, is stored as ignored and shows in `events`."""
    ev = {"eventId": "odd-1", "eventType": "SOMETHING_NEW", "data": {"x": 1}}
    assert await post(client, ev) == (200, {})
    await app[PROCESSOR_KEY].run_until_idle()
    assert run_events(argparse.Namespace(config=str(config), failed=False, json=True)) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(e["eventId"], e["eventType"], e["status"]) for e in lines] == [
        ("odd-1", "SOMETHING_NEW", "ignored")
    ]


async def test_full_disk_answers_503_never_200(
    client: Client, app: web.Application, settings: Settings
) -> None:
    """When SQLite cannot commit the event, the answer is 503 and the event is not stored."""
    store = app[STORE_KEY]

    def fill_disk(db: Any) -> None:
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        db.execute(f"PRAGMA max_page_count = {pages}")

    await store.write(fill_disk)
    ev = deposit_event(note="n" * 200_000)
    status, answer = await post(client, ev)
    assert status == 503
    assert answer == {"error": "storage unavailable"}
    assert stored(settings) == []
    resp = await client.get("/readyz")
    assert resp.status == 200  # small writes still fit; readiness probes writability only
    # Space comes back: the provider's retry of the same event is accepted.
    await store.write(lambda db: db.execute("PRAGMA max_page_count = 1073741823"))
    assert await post(client, ev) == (200, {})


async def test_closed_store_answers_503(
    client: Client, app: web.Application, settings: Settings
) -> None:
    """With the store gone, deliveries answer 503 and /readyz says storage is not writable."""
    await app[STORE_KEY].close()
    status, _ = await post(client, deposit_event())
    assert status == 503
    resp = await client.get("/readyz")
    assert resp.status == 503
    body = await resp.json()
    assert any("storage not writable" in f for f in body["failed"])


async def test_healthz(client: Client) -> None:
    """/healthz answers 200 while the process runs."""
    resp = await client.get("/healthz")
    assert (resp.status, await resp.json()) == (200, {"status": "ok"})


async def test_readyz_runs_registered_checks(client: Client, app: web.Application) -> None:
    """/readyz is 200 when all is well and 503 naming a failing check (e.g. the scheduler)."""
    resp = await client.get("/readyz")
    assert (resp.status, await resp.json()) == (200, {"status": "ready"})

    async def scheduler() -> str | None:
        return "scheduler not running"

    app[READY_CHECKS_KEY].append(scheduler)
    resp = await client.get("/readyz")
    assert resp.status == 503
    assert (await resp.json())["failed"] == ["scheduler not running"]


async def test_metrics_exposes_counters_and_gauges(client: Client, app: web.Application) -> None:
    """/metrics shows events by type and outcome, lag, deposits by state in Prometheus text."""
    ev = deposit_event()
    await post(client, ev)
    await post(client, ev)
    await post(client, deposit_event(), secret="wrong")
    await app[PROCESSOR_KEY].run_until_idle()
    resp = await client.get("/metrics")
    assert resp.status == 200
    assert resp.content_type == "text/plain"
    text = await resp.text()
    for line in (
        'depositd_events_received_total{event_type="DEPOSIT_WHITELIST_REQUIRED",outcome="new"} 1.0',
        'depositd_events_received_total{event_type="DEPOSIT_WHITELIST_REQUIRED",'
        'outcome="duplicate"} 1.0',
        'depositd_events_received_total{event_type="none",outcome="unauthorized"} 1.0',
        'depositd_deposits{state="needs_details"} 1.0',
        'depositd_deposits{state="blocked"} 0.0',  # every state has a sample
        "depositd_processing_lag_seconds 0.0",
        'depositd_events_processed_total{event_type="DEPOSIT_WHITELIST_REQUIRED",'
        'outcome="processed"} 1.0',
        'depositd_transitions_total{trigger="needs_details"} 1.0',
    ):
        assert line in text
    assert "# TYPE depositd_provider_calls_total counter" in text
    assert "# TYPE depositd_alerts_sent_total counter" in text


async def test_metrics_in_openmetrics_when_the_scrape_asks(client: Client) -> None:
    """An Accept header naming OpenMetrics gets that format (ending in # EOF); others get the
    Prometheus text format."""
    accept = "application/openmetrics-text;version=1.0.0;q=0.9,text/plain;q=0.5"
    resp = await client.get("/metrics", headers={"Accept": accept})
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
    text = await resp.text()
    assert text.endswith("# EOF\n")
    assert "depositd_store_commits_total " in text
    resp = await client.get("/metrics", headers={"Accept": "text/plain"})
    assert resp.headers["Content-Type"].startswith("text/plain")
    assert "# EOF" not in await resp.text()


async def test_amounts_stay_exact_end_to_end(
    client: Client, app: web.Application, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Amounts as tiny/huge decimal strings or a JSON number leave `deposits --json` unchanged."""
    bodies = {
        "tx-tiny": b'"0.000000000000000001"',
        "tx-huge": b'"123456789012345678.123456789"',
        "tx-number": b"1e-7",
    }
    for tx, amount in bodies.items():
        raw = dumpb(deposit_event(tx=tx, amount="AMOUNT")).replace(b'"AMOUNT"', amount)
        assert await post(client, raw) == (200, {})
    await app[PROCESSOR_KEY].run_until_idle()
    args = argparse.Namespace(config=str(config), state=None, json=True, transaction_id=None)
    assert run_deposits(args) == 0
    out = {
        d["transactionId"]: d["amount"]
        for d in map(json.loads, capsys.readouterr().out.splitlines())
    }
    assert out == {
        "tx-tiny": "0.000000000000000001",
        "tx-huge": "123456789012345678.123456789",
        "tx-number": "0.0000001",
    }
